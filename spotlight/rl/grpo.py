"""The Flow-GRPO update: re-score the rollout's SDE steps under the current policy and step the optimizer.

A rollout gives, per sample, the latents before and after each denoising step and the log-prob of
each step under the policy that sampled it. The update replays a subset of those steps through the
current model (the gradient flows through the step's Gaussian mean), weights them by the sample's
group-relative advantage, and clips the importance ratio once the policy has moved (later
minibatches of the same rollout).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import torch

from spotlight.diffusion.sampler import to_device
from spotlight.diffusion.steps import sde_step
from spotlight.models.lora_merge import samples_merged
from spotlight.models.pipelines.prompts import bind_prompts
from spotlight.models.policy import Policy
from spotlight.rl.loss import clipped_policy_loss, gaussian_step_kl
from spotlight.rl.micro_batch import local_norm, micro_batches


class GRPOHyperparameters(Protocol):
    """What `grpo_update` reads of the run's training section (``spotlight.config.TrainSection`` has all).

    A protocol rather than the config class: the update is maths and imports no run configuration,
    so a test or a benchmark passes any object with these fields.
    """

    @property
    def timestep_fraction(self) -> float: ...
    @property
    def timestep_selection(self) -> Literal["random", "early"]: ...
    @property
    def num_minibatches(self) -> int: ...
    @property
    def clip_range(self) -> float: ...
    @property
    def kl_beta(self) -> float: ...
    @property
    def grad_clip(self) -> float: ...


@dataclass
class RolloutBatch:
    """B trajectories with what the update needs.

    latents (B, K+1, C, H, W); log_probs (B, K); tokens (B, L); advantages (B,); ``sigmas`` (K+1,)
    float64 is the schedule the rollout used and ``noise_level`` its SDE noise level;
    ``stochastic_steps`` how many leading steps were SDE steps (None: all K). Only those have a
    log-prob to train: the ODE steps after them are deterministic.
    """

    latents: torch.Tensor
    log_probs: torch.Tensor
    tokens: torch.Tensor
    advantages: torch.Tensor
    sigmas: torch.Tensor
    noise_level: float
    stochastic_steps: int | None = None


def choose_train_timesteps(
    num_steps: int, fraction: float, generator: torch.Generator, selection: str = "random"
) -> list[int]:
    """The denoising steps trained on this iteration: ``ceil(fraction * K)`` of the K SDE steps.

    ``random`` draws them afresh every iteration (Flow-GRPO-Fast): the update's cost falls in
    proportion and every step is still trained on over the iterations. ``early`` always takes the
    first (highest-noise) steps. Which steps matter is measurable (benchmarks/learning/noise_attribution.py):
    on the shapes task the first 3 of 10 steps decide under a fifth of a group's reward variance,
    steps 3-5 about half, so training only the first 30% left the gradient mostly noise; the
    default trains every SDE step of the windowed rollout. The generator is drawn from either way,
    so both keep the same random stream for what follows.
    """
    count = max(1, math.ceil(fraction * num_steps))
    drawn = sorted(torch.randperm(num_steps, generator=generator)[:count].tolist())
    return list(range(count)) if selection == "early" else drawn


def step_log_prob_and_mean(
    model: Policy, batch: RolloutBatch, rows: torch.Tensor | slice, step: int, tokens: Any = None,
    sigma_values: list[float] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Log-prob (B',), Gaussian mean and std of the recorded transition ``step -> step+1`` of ``rows``.

    ``tokens``: the rows' conditioning bound to the device (default: ``batch.tokens[rows]``, bound at the
    call); ``sigma_values``: the schedule as Python floats (default: read from ``batch.sigmas``).
    """
    if sigma_values is None:
        sigma_values = batch.sigmas.tolist()
    sigma, sigma_next = sigma_values[step], sigma_values[step + 1]
    x = batch.latents[rows, step]
    sigma_batch = torch.full((x.shape[0],), sigma, dtype=x.dtype, device=x.device)
    velocity = model(x, sigma_batch, batch.tokens[rows] if tokens is None else tokens)
    result = sde_step(
        x, velocity, sigma, sigma_next, batch.noise_level, x_next=batch.latents[rows, step + 1],
        sigma_cap=sigma_values[1],
    )
    return result.log_prob, result.mean, result.std


def on_device(batch: RolloutBatch, device: torch.device) -> RolloutBatch:
    """``batch`` with its latents, log-probs and advantages on ``device`` (one copy each; to CUDA through pinned
    memory without waiting: `spotlight.diffusion.sampler.to_device`), the rest as it is."""
    return RolloutBatch(latents=moved_to_device(batch.latents, device),
                        log_probs=moved_to_device(batch.log_probs, device), tokens=batch.tokens,
                        advantages=moved_to_device(batch.advantages, device), sigmas=batch.sigmas,
                        noise_level=batch.noise_level, stochastic_steps=batch.stochastic_steps)


def moved_to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``tensor`` on ``device``: itself when there (``cuda`` is ``cuda:0``), from the host without waiting."""
    here = tensor.device
    if here.type == device.type and (here.index or 0) == (device.index or 0):
        return tensor
    return to_device(tensor, device) if here.type == "cpu" else tensor.to(device)


def rows_of(batch: RolloutBatch, rows: torch.Tensor, device_rows: torch.Tensor) -> RolloutBatch:
    """The rows of a batch already on the device: its tensors gathered there by ``device_rows`` (no host copy);
    the prompt ids (on the host) by ``rows``."""
    return RolloutBatch(latents=batch.latents.index_select(0, device_rows),
                        log_probs=batch.log_probs.index_select(0, device_rows), tokens=batch.tokens[rows],
                        advantages=batch.advantages.index_select(0, device_rows), sigmas=batch.sigmas,
                        noise_level=batch.noise_level, stochastic_steps=batch.stochastic_steps)


def grpo_update(
    model: Policy,
    reference: Policy | None,
    optimizer: torch.optim.Optimizer,
    batch: RolloutBatch,
    config: GRPOHyperparameters,
    generator: torch.Generator,
    old_model: Policy | None = None,
) -> dict[str, float]:
    """One GRPO iteration over a rollout batch; returns loss, KL, clip fraction and grad-norm means.

    The batch is shuffled into ``num_minibatches``; each takes one optimizer step after accumulating
    gradients over the chosen timesteps. The loss of each (sample, step) is averaged, not summed,
    over timesteps so that the learning rate does not depend on how many steps are trained. With
    ``config.micro_batch_size`` each step's rows go through the model that many at a time, their
    losses weighted by their share of the minibatch (the same gradient, less memory).

    The old log-probs. The ratio compares the policy's log-prob of a recorded step with the sampling
    policy's. The rollout recorded that from its own forwards; when it sampled with the LoRA folded into
    the base weights (`spotlight.models.lora_merge.samples_merged`, the default on CUDA) those forwards
    round differently from the update's adapter math: ~1e-3 in the ratio in bfloat16, ten times the clip
    range of 1e-4, so every minibatch, the first included, would be clipped by rounding alone. Then
    ``old_model`` (the frozen sampling policy θ_old, which the loop passes) re-scores each micro-batch
    under no_grad on the training forward path, in the very shapes the policy's forward takes: where
    θ_old is θ (the first minibatch of a non-trailing run) the two forwards are the same computation and
    the ratio is exactly 1. It costs one no-grad forward per trained (sample, step), about a third of the
    update, paid only when sampling merged. The cheaper-looking alternatives are not exact: sampling
    unmerged still rounds differently in bfloat16 whenever the rollout's batch shape differs from the
    update's micro-batch, and re-using the first minibatch's forward as its own old log-prob leaves
    the later minibatches with the merged rounding (and is wrong for a trailing θ_old).

    The trajectories go to the model's device once, each minibatch's rows are gathered there and its
    prompts bound there once, and the logged sums stay float64 tensors on the device until the end: the
    loops over timesteps and micro-batches read nothing back to the host and copy nothing to the device.
    """
    num_samples, num_steps = batch.log_probs.shape
    if batch.stochastic_steps is not None:
        num_steps = min(num_steps, batch.stochastic_steps)
    timesteps = choose_train_timesteps(num_steps, config.timestep_fraction, generator, config.timestep_selection)
    order = torch.randperm(num_samples, generator=generator)
    minibatches = order.chunk(config.num_minibatches)
    device = next(model.parameters()).device
    whole = on_device(batch, device)
    device_order = moved_to_device(order, device)
    rescorer = old_model if old_model is not None and samples_merged(old_model) else None
    sigma_values = batch.sigmas.tolist()
    totals = {name: torch.zeros((), dtype=torch.float64, device=device)
              for name in ("loss", "policy_loss", "kl", "clip_fraction", "ratio", "grad_norm")}
    terms = start = 0
    for rows in minibatches:
        optimizer.zero_grad(set_to_none=True)
        minibatch = rows_of(whole, rows, device_order[start:start + len(rows)])
        start += len(rows)
        tokens = bind_prompts(model, minibatch.tokens)
        for step in timesteps:
            for part in micro_batches(len(rows), config):  # memory's share of the rows; one step for all
                weight = (part.stop - part.start) / len(rows)
                if rescorer is None:
                    old_log_prob = minibatch.log_probs[part, step]
                else:  # θ_old's log-prob on the training path (docstring), before the policy's own forward
                    with torch.no_grad():
                        old_log_prob, _, _ = step_log_prob_and_mean(rescorer, minibatch, part, step, tokens[part],
                                                                    sigma_values)
                log_prob, mean, std = step_log_prob_and_mean(model, minibatch, part, step, tokens[part], sigma_values)
                policy = clipped_policy_loss(log_prob, old_log_prob, minibatch.advantages[part], config.clip_range)
                loss = policy.loss
                kl = torch.zeros((), device=loss.device)
                if reference is not None and config.kl_beta > 0:
                    with torch.no_grad():
                        _, reference_mean, _ = step_log_prob_and_mean(reference, minibatch, part, step, tokens[part],
                                                                      sigma_values)
                    # Flow-GRPO's KL divides the mean gap by the diffusion coefficient g² (std² / |dt|), not by
                    # the step variance: without the |dt| the same kl_beta weighed 12-28x more on 10 steps
                    step_size = sigma_values[step] - sigma_values[step + 1]
                    kl = gaussian_step_kl(mean, reference_mean, std).mean() * step_size
                    loss = loss + config.kl_beta * kl
                (loss / len(timesteps) if weight == 1.0 else loss * (weight / len(timesteps))).backward()
                totals["loss"] += loss.detach().double() * weight
                totals["policy_loss"] += policy.loss.detach().double() * weight
                totals["kl"] += kl.detach().double() * weight
                totals["clip_fraction"] += policy.clip_fraction.double() * weight
                totals["ratio"] += policy.ratio_mean.double() * weight
            terms += 1
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        totals["grad_norm"] += local_norm(grad_norm).detach().double() * len(timesteps)
        optimizer.step()
    return read_means(totals, terms)  # the one read of the update


def read_means(totals: dict[str, torch.Tensor], count: int) -> dict[str, float]:
    """``train/<name>``: each device sum over ``count``, read back in one copy (one sync, not one per metric)."""
    values = torch.stack(list(totals.values())).tolist()
    return {f"train/{name}": value / max(count, 1) for name, value in zip(totals, values, strict=True)}
