"""The NFT and Flow-GRPO losses of one complete group, as sums over rows, per timestep or packed.

The generation-axis pipeline trains a logical batch group by group, so the loss of a batch must be a
sum of per-group parts: each part here is the SUM of the per-row losses of one group (a row is one
(sample, timestep) pair), and the accumulator divides the summed gradient by the batch's row count
once every group is in. The sums use the repository's own loss functions (`spotlight.rl.nft`,
`spotlight.rl.loss`, `spotlight.rl.grpo.step_log_prob_and_mean`), so the per-row maths is the one-shot
update's.

The one-shot update these parts add up to is the repository's update run with ONE epoch and ONE
minibatch equal to the logical batch (``num_epochs=1, num_minibatches=1``): several minibatches or
epochs take several optimizer steps per rollout, and a pipeline that commits one step per logical
batch can only equal a one-step update. NFT's forward-process noise is drawn per generation from
its id (`keyed_forward_noise`), not from one stream in shuffled order, so the draws do not depend on
the order samples arrive in; `nft_update` draws the same kind of noise from a shared stream, and the
tests feed those exact draws through this path to compare the two.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

from spotlight.diffusion.noise import stream_key
from spotlight.diffusion.steps import sde_step
from spotlight.disagg.groups import AssembledGroup
from spotlight.disagg.samples import GenerationId
from spotlight.disagg.timestep_packing import packed_velocity
from spotlight.rl.grpo import RolloutBatch, step_log_prob_and_mean
from spotlight.rl.loss import clipped_policy_loss, gaussian_step_kl
from spotlight.rl.nft import NFTWeighting, nft_loss, optimality


@dataclass(frozen=True)
class LossPiece:
    """One forward's contribution: ``loss_sum`` (scalar, carries the gradient) over ``rows`` rows,
    and ``metric_sums`` (detached floats summed over the same rows)."""

    loss_sum: torch.Tensor
    rows: int
    metric_sums: dict[str, float]


@dataclass(frozen=True)
class ForwardNoise:
    """NFT's forward-process draws of one generation: ``sigmas`` (T,) in [0, 1) and ``noise`` (T, C, H, W)."""

    sigmas: torch.Tensor
    noise: torch.Tensor


def keyed_forward_noise(run_seed: int, update_step: int, sample: GenerationId, num_timesteps: int,
                        latent_shape: Sequence[int]) -> ForwardNoise:
    """The forward-process draws of ``sample`` in update ``update_step``: a pure function of the ids.

    Keyed by (run seed, update step, prompt, sample) through splitmix64 (`stream_key`), so a sample
    gets the same noise whichever order it arrives in and whichever device trains it.
    """
    key = stream_key(stream_key(run_seed, update_step), sample.prompt_index * 65_536 + sample.sample_index)
    generator = torch.Generator().manual_seed(key)
    sigmas = torch.rand(num_timesteps, generator=generator)
    noise = torch.randn((num_timesteps, *latent_shape), generator=generator)
    return ForwardNoise(sigmas=sigmas, noise=noise)


class NftGroupLoss:
    """DiffusionNFT's loss of a group: kept samples (advantage ≠ 0) × ``num_timesteps`` noise levels.

    ``old_models`` maps a policy version to the weights that drew samples of that version (NFT's
    sampling policy; with one-step asynchrony a batch holds two versions). With ``pack_timesteps``
    every timestep of the group goes through one forward (TSP); otherwise one forward per timestep
    (the per-timestep reference).
    """

    def __init__(self, old_models: Mapping[int, torch.nn.Module], noise: Callable[[GenerationId], ForwardNoise],
                 beta: float, adv_scale: float, num_timesteps: int, pack_timesteps: bool = True,
                 weighting: NFTWeighting = "uniform") -> None:
        self.old_models = old_models
        self.weighting = weighting
        self.noise = noise
        self.beta = beta
        self.adv_scale = adv_scale
        self.num_timesteps = num_timesteps
        self.pack_timesteps = pack_timesteps

    @staticmethod
    def kept(group: AssembledGroup) -> list[int]:
        """Indices of the group's samples that carry signal (advantage ≠ 0), as `nft_update` keeps them."""
        return [i for i, advantage in enumerate(group.advantages.tolist()) if advantage != 0]

    def num_pieces(self, group: AssembledGroup) -> int:
        if not self.kept(group):
            return 0
        return 1 if self.pack_timesteps else self.num_timesteps

    def piece(self, model: torch.nn.Module, group: AssembledGroup, index: int) -> LossPiece:
        """The loss sum of timestep ``index`` (or of all timesteps when packed) over the kept samples."""
        kept = self.kept(group)
        samples = [group.samples[i] for i in kept]
        timesteps = range(self.num_timesteps) if self.pack_timesteps else [index]
        draws = [self.noise(sample.id) for sample in samples]
        x0 = torch.stack([sample.latents[-1] for sample in samples])
        tokens = torch.stack([sample.tokens for sample in samples])
        r = optimality(group.advantages[kept], self.adv_scale)
        blocks_x, blocks_sigma, blocks_noise = [], [], []
        for t in timesteps:  # t-major rows, as nft_update's repeat lays them out
            sigma = torch.stack([draw.sigmas[t] for draw in draws]).to(x0.dtype)
            noise = torch.stack([draw.noise[t] for draw in draws]).to(x0.dtype)
            s = sigma.view(-1, *([1] * (x0.ndim - 1)))
            blocks_x.append((1.0 - s) * x0 + s * noise)
            blocks_sigma.append(sigma)
            blocks_noise.append(noise)
        count = len(blocks_x)
        velocity = torch.cat(packed_velocity(model, blocks_x, blocks_sigma, [tokens] * count))
        noisy, sigmas, noise = torch.cat(blocks_x), torch.cat(blocks_sigma), torch.cat(blocks_noise)
        all_tokens = tokens.repeat(count, 1)
        versions = torch.tensor([sample.id.policy_version for sample in samples]).repeat(count)
        old_velocity = torch.empty_like(noisy)
        with torch.no_grad():
            for version in versions.unique().tolist():
                rows = versions == version
                old_velocity[rows] = self.old_models[version](noisy[rows], sigmas[rows], all_tokens[rows])
        target = noise - x0.repeat(count, *([1] * (x0.ndim - 1)))  # images or videos
        losses = nft_loss(velocity, old_velocity, target, r.repeat(count), self.beta, sigmas, self.weighting)
        return LossPiece(loss_sum=losses.sum(), rows=losses.shape[0],
                         metric_sums={"loss": float(losses.detach().sum())})


class GrpoGroupLoss:
    """Flow-GRPO's clipped policy loss (+ KL to ``reference``) of a group at the batch's chosen ``timesteps``.

    The timesteps are chosen once per logical batch (`spotlight.rl.grpo.choose_train_timesteps`), as
    the one-shot update chooses them once per rollout. ``sigmas`` (K+1,) float64 and ``noise_level``
    are the rollout's. With ``pack_timesteps`` the policy (and reference) velocities of all timesteps
    come from one forward each; the cheap Gaussian step maths then runs per timestep.
    """

    def __init__(self, timesteps: Sequence[int], sigmas: torch.Tensor, noise_level: float, clip_range: float,
                 kl_beta: float = 0.0, reference: torch.nn.Module | None = None,
                 pack_timesteps: bool = True) -> None:
        if not timesteps:
            raise ValueError("GRPO needs ≥ 1 trained timestep per batch (train.timestep_fraction > 0)")
        self.timesteps = list(timesteps)
        self.sigmas = sigmas
        self.noise_level = noise_level
        self.clip_range = clip_range
        self.kl_beta = kl_beta
        self.reference = reference if kl_beta > 0 else None
        self.pack_timesteps = pack_timesteps

    def num_pieces(self, group: AssembledGroup) -> int:
        return 1 if self.pack_timesteps else len(self.timesteps)

    def _batch(self, group: AssembledGroup) -> RolloutBatch:
        return RolloutBatch(
            latents=torch.stack([s.latents for s in group.samples]),
            log_probs=torch.stack([s.log_probs for s in group.samples]),
            tokens=torch.stack([s.tokens for s in group.samples]), advantages=group.advantages,
            sigmas=self.sigmas, noise_level=self.noise_level)

    def _step_statistics(self, model: torch.nn.Module, batch: RolloutBatch,
                         steps: list[int]) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """(log_prob, mean, std) of each step's recorded transition; one forward per step, or one packed."""
        rows = torch.arange(batch.latents.shape[0])
        if not self.pack_timesteps:
            return [step_log_prob_and_mean(model, batch, rows, step) for step in steps]
        latents = [batch.latents[:, step] for step in steps]
        sigma_rows = [torch.full((len(rows),), float(self.sigmas[step]), dtype=latents[0].dtype) for step in steps]
        velocities = packed_velocity(model, latents, sigma_rows, [batch.tokens] * len(steps))
        results = []
        for step, x, velocity in zip(steps, latents, velocities, strict=True):
            result = sde_step(x, velocity, float(self.sigmas[step]), float(self.sigmas[step + 1]), self.noise_level,
                              x_next=batch.latents[:, step + 1], sigma_cap=float(self.sigmas[1]))
            results.append((result.log_prob, result.mean, result.std))
        return results

    def piece(self, model: torch.nn.Module, group: AssembledGroup, index: int) -> LossPiece:
        """The loss sum of timestep ``timesteps[index]`` (or of all of them when packed) over the group."""
        batch = self._batch(group)
        steps = self.timesteps if self.pack_timesteps else [self.timesteps[index]]
        size = batch.latents.shape[0]
        policy_stats = self._step_statistics(model, batch, steps)
        reference_stats = None
        if self.reference is not None:
            with torch.no_grad():
                reference_stats = self._step_statistics(self.reference, batch, steps)
        total = torch.zeros(())
        sums = {"loss": 0.0, "policy_loss": 0.0, "kl": 0.0, "clip_fraction": 0.0}
        for j, (step, (log_prob, mean, std)) in enumerate(zip(steps, policy_stats, strict=True)):
            policy = clipped_policy_loss(log_prob, batch.log_probs[:, step], batch.advantages, self.clip_range)
            loss = policy.loss * size  # a mean over the group's rows, back to their sum
            kl_sum = torch.zeros(())
            if reference_stats is not None:
                step_size = float(self.sigmas[step] - self.sigmas[step + 1])
                kl_sum = gaussian_step_kl(mean, reference_stats[j][1], std).sum() * step_size
                loss = loss + self.kl_beta * kl_sum
            total = total + loss
            sums["loss"] += float(loss.detach())
            sums["policy_loss"] += float(policy.loss.detach()) * size
            sums["kl"] += float(kl_sum.detach())
            sums["clip_fraction"] += float(policy.clip_fraction) * size
        return LossPiece(loss_sum=total, rows=size * len(steps), metric_sums=sums)
