"""The forward-process update (DiffusionNFT, Zheng et al. 2025): reinforcement through flow matching.

GRPO credits a reward to the log-probs of the reverse-process steps that drew the sample; with
thousands of noise dimensions per step the gradient of one rollout is mostly noise (measured on the
shapes base model: independent rollouts' GRPO gradients have cosine -0.006 ± 0.006). NFT instead
trains on the forward process of the clean samples: noise a sample to ``x_t``, and fit two implicit
policies built from the current velocity ``v`` and the sampling policy's ``v_old``:

    v+ = (1 - β) v_old + β v      (the policy that the good samples come from)
    v- = (1 + β) v_old - β v      (its reflection, for the bad ones)
    loss = r ||v+ - (ε - x0)||² + (1 - r) ||v- - (ε - x0)||²

with ``r`` in [0, 1] the sample's optimality (its group advantage squashed into [0, 1]). At
``v = v_old`` the gradient is ``2β (2r - 1) (v_old - (ε - x0)) ∂v``: flow matching towards the
better half of a group and away from the worse, in the same supervised form pre-training used. The
minimiser of each term sits at ``v_old + (2r - 1)/β (ε - x0 - v_old)``, so an update can never push
a velocity further than that from the sampling policy: the loss is its own trust region, with no
likelihood, no clip range and no KL scale to tune. It needs only the clean samples, so any sampler
(ODE included) can draw them.
"""

from __future__ import annotations

from typing import Any, Literal, Protocol

import torch

from spotlight.diffusion.sampler import to_device
from spotlight.models.pipelines.prompts import bind_prompts
from spotlight.models.policy import Policy
from spotlight.rl.grpo import RolloutBatch, moved_to_device, read_means
from spotlight.rl.micro_batch import local_norm, micro_batches

NFTWeighting = Literal["uniform", "adaptive"]


class NFTHyperparameters(Protocol):
    """What `nft_update` reads of the run's training section (``spotlight.config.TrainSection`` has all);
    a protocol so that the update imports no run configuration."""

    @property
    def num_epochs(self) -> int: ...
    @property
    def num_minibatches(self) -> int: ...
    @property
    def nft_timesteps(self) -> int: ...
    @property
    def nft_adv_scale(self) -> float: ...
    @property
    def nft_beta(self) -> float: ...
    @property
    def grad_clip(self) -> float: ...
    @property
    def nft_kl_beta(self) -> float: ...
    @property
    def nft_weighting(self) -> NFTWeighting: ...


def optimality(advantages: torch.Tensor, scale: float) -> torch.Tensor:
    """Optimality r in [0, 1] (B,) of samples with group advantages (B,): ``0.5 + 0.5 clip(A / scale, ±1)``.

    A sample ``scale`` group standard deviations above its group's mean counts as fully positive,
    one as far below as fully negative; the group's mean sample as neither (r = 0.5).
    """
    return 0.5 + 0.5 * (advantages / scale).clamp(-1.0, 1.0)


def nft_loss(
    velocity: torch.Tensor, old_velocity: torch.Tensor, target: torch.Tensor, optimality: torch.Tensor,
    beta: float, sigma: torch.Tensor | None = None, weighting: NFTWeighting = "uniform",
) -> torch.Tensor:
    """The NFT loss per sample (B,): ``r ||v+ - target||² + (1 - r) ||v- - target||²``, means over pixels.

    ``velocity`` carries the gradient; ``old_velocity`` is the sampling policy's (a constant).
    ``weighting="adaptive"`` (needs the samples' noise levels ``sigma``) is DiffusionNFT's weighting:
    each term is the squared error of the clean image it implies, ``x0_hat - x0 = sigma (target - v±)``,
    divided by that error's own (detached) mean absolute value. A term's gradient then has the same size
    however far its policy has walked from the target, so a sample whose error grows (the negative term
    pushes away from its target by design) cannot take over the step: with uniform weighting the walk
    compounds, the NFT loss doubles every ~10 iterations from about iteration 110 and the run diverges
    (docs/learning.md, "The stable update").
    """
    positive = (1.0 - beta) * old_velocity + beta * velocity
    negative = (1.0 + beta) * old_velocity - beta * velocity
    dims = tuple(range(1, velocity.ndim))
    if weighting == "uniform":
        positive_error = (positive - target).pow(2).mean(dim=dims)
        negative_error = (negative - target).pow(2).mean(dim=dims)
    else:
        if sigma is None:
            raise ValueError("nft_loss: weighting='adaptive' needs the samples' noise levels (sigma)")
        positive_error = _self_normalised_error(positive, target, sigma, dims)
        negative_error = _self_normalised_error(negative, target, sigma, dims)
    return optimality * positive_error + (1.0 - optimality) * negative_error


def _self_normalised_error(velocity: torch.Tensor, target: torch.Tensor, sigma: torch.Tensor,
                           dims: tuple[int, ...]) -> torch.Tensor:
    """Per sample: mean of ``e²`` over mean of ``|e|`` (detached), ``e = sigma (target - velocity)`` the x0 error."""
    error = sigma.view(-1, *([1] * (velocity.ndim - 1))) * (target - velocity)
    with torch.no_grad():
        scale = error.abs().mean(dim=dims).clamp(min=1e-5)
    return error.pow(2).mean(dim=dims) / scale


def accumulate_nft_gradients(
    model: Policy, old_model: Policy, reference: Policy | None, noisy: torch.Tensor, sigma: torch.Tensor,
    tokens: Any, target: torch.Tensor, r: torch.Tensor, config: NFTHyperparameters,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Back-propagate one minibatch's NFT loss (+ ``nft_kl_beta`` KL) in micro-batches; its loss and KL.

    Equal to one backward of the whole minibatch's mean loss (every term is a mean over rows of equal size).
    ``tokens`` are bound to the device (`spotlight.models.pipelines.prompts.bind_prompts`) and the loss and KL come
    back as float64 tensors on the device: the micro-batch loop reads nothing back to the host.
    """
    rows = noisy.shape[0]
    loss_total = torch.zeros((), dtype=torch.float64, device=noisy.device)
    kl_total = None
    for part in micro_batches(rows, config):
        weight = (part.stop - part.start) / rows
        with torch.no_grad():
            old_velocity = old_model(noisy[part], sigma[part], tokens[part])
        velocity = model(noisy[part], sigma[part], tokens[part])
        loss = nft_loss(velocity, old_velocity, target[part], r[part], config.nft_beta, sigma[part],
                        config.nft_weighting).mean()
        if config.nft_kl_beta > 0:
            if reference is None:
                raise ValueError("train.nft_kl_beta > 0 needs the frozen base as reference")
            with torch.no_grad():
                reference_velocity = reference(noisy[part], sigma[part], tokens[part])
            kl = (velocity - reference_velocity).pow(2).mean()
            loss = loss + config.nft_kl_beta * kl
            kl_part = kl.detach().double() * weight
            kl_total = kl_part if kl_total is None else kl_total + kl_part
        (loss if weight == 1.0 else weight * loss).backward()
        loss_total += loss.detach().double() * weight
    return loss_total, kl_total


def nft_update(
    model: Policy,
    old_model: Policy,
    optimizer: torch.optim.Optimizer,
    batch: RolloutBatch,
    config: NFTHyperparameters,
    generator: torch.Generator,
    reference: Policy | None = None,
) -> dict[str, float]:
    """One NFT iteration over a rollout's clean samples; returns the mean loss, grad norm and sample counts.

    ``old_model`` holds the weights that drew the rollout. With ``config.nft_kl_beta > 0`` the loss
    adds ``nft_kl_beta ||v - v_ref||²`` towards ``reference`` (the frozen base): NFT's own trust region
    bounds one step from ``old_model``, this term bounds the walk of many. Samples whose advantage is exactly 0
    (a group of equal rewards, or a reward that failed) carry no signal and are left out. Each
    sample is noised at ``config.nft_timesteps`` uniform noise levels (the distribution pre-training
    used); the kept samples are shuffled into ``num_minibatches`` optimizer steps, ``num_epochs`` times,
    each computed in micro-batches of ``config.micro_batch_size`` rows when the config has one.

    Where it runs: the clean latents and the samples' optimality go to the model's device once (through
    pinned memory), each epoch's shuffle once; each minibatch's noise levels and noise are drawn on the CPU
    from ``generator`` (the same numbers on every device) and moved there without waiting; its rows are
    gathered on the device and its prompts bound once; the losses and grad norms are summed on the device
    and read back in one copy after the last step, so no step waits for the device.
    """
    device = next(model.parameters()).device
    kept = torch.nonzero(batch.advantages != 0).squeeze(1)  # the rollout's advantages are on the host
    clean = moved_to_device(batch.latents[:, -1].index_select(0, moved_to_device(kept, batch.latents.device)), device)
    kept_optimality = optimality(batch.advantages[kept], config.nft_adv_scale)
    r_kept = moved_to_device(kept_optimality, device)
    totals: dict[str, torch.Tensor] = {name: torch.zeros((), dtype=torch.float64, device=device)
                                       for name in ("loss", "grad_norm")}
    steps = 0
    for _ in range(config.num_epochs):
        shuffle = torch.randperm(len(kept), generator=generator)  # positions among the kept samples
        device_shuffle = to_device(shuffle, device)
        start = 0
        for positions in shuffle.chunk(config.num_minibatches) if len(kept) else ():
            repeats = config.nft_timesteps
            on_device = device_shuffle[start:start + len(positions)]
            start += len(positions)
            x0 = clean.index_select(0, on_device).repeat(repeats, *([1] * (clean.ndim - 1)))  # images or videos
            tokens = bind_prompts(model, batch.tokens[kept[positions]].repeat(repeats, 1))
            r = r_kept.index_select(0, on_device).repeat(repeats)
            sigma = torch.rand(x0.shape[0], generator=generator, dtype=x0.dtype)
            noise = torch.randn(x0.shape, generator=generator, dtype=x0.dtype)
            sigma, noise = to_device(sigma, device), to_device(noise, device)
            s = sigma.view(-1, *([1] * (x0.ndim - 1)))
            noisy = (1.0 - s) * x0 + s * noise
            optimizer.zero_grad(set_to_none=True)
            loss, kl = accumulate_nft_gradients(model, old_model, reference, noisy, sigma, tokens, noise - x0, r,
                                                config)
            if kl is not None:
                totals["kl"] = totals["kl"] + kl if "kl" in totals else kl
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
            optimizer.step()
            totals["loss"] += loss
            totals["grad_norm"] += local_norm(grad_norm).detach().double()
            steps += 1
    metrics = read_means(totals, steps)  # the one read of the update
    metrics["train/optimality_mean"] = float(kept_optimality.mean()) if len(kept) else 0.0  # host values
    metrics["train/trained_samples"] = float(len(kept))
    return metrics
