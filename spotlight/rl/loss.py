"""Flow-GRPO losses: the clipped importance-ratio policy loss and the per-step Gaussian KL."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PolicyLoss:
    """The loss to minimise (scalar) and its diagnostics (detached scalars)."""

    loss: torch.Tensor
    clip_fraction: torch.Tensor
    ratio_mean: torch.Tensor


def clipped_policy_loss(
    log_probs: torch.Tensor, old_log_probs: torch.Tensor, advantages: torch.Tensor, clip_range: float
) -> PolicyLoss:
    """PPO-style clipped surrogate, ``mean(max(-A * r, -A * clip(r, 1 - e, 1 + e)))``.

    All inputs are (B,) for one denoising step; ``r = exp(log_probs - old_log_probs)``. Fully
    on-policy (first minibatch after a rollout) ``r`` is exactly 1 and the gradient is the plain
    policy gradient ``-A * grad log p``; clipping only acts once the policy has moved.
    """
    ratio = torch.exp(log_probs - old_log_probs)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_range, 1.0 + clip_range)
    loss = torch.maximum(unclipped, clipped).mean()
    clip_fraction = ((ratio - 1.0).abs() > clip_range).float().mean()
    return PolicyLoss(loss=loss, clip_fraction=clip_fraction.detach(), ratio_mean=ratio.mean().detach())


def gaussian_step_kl(mean: torch.Tensor, reference_mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """KL(N(mean, std²) || N(reference_mean, std²)) per sample, averaged over non-batch dims: (B,).

    Policy and reference share the step's std (it depends only on the schedule), so the KL of the
    two Gaussian transitions reduces to the squared distance of their means over ``2 std²``.
    """
    dims = tuple(range(1, mean.ndim))
    return (mean - reference_mean).pow(2).mean(dim=dims) / (2.0 * std.pow(2))
