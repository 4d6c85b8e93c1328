"""One denoising step of a flow-matching model: the Euler ODE step and the Flow-GRPO SDE step.

The SDE step is the reverse-time SDE whose marginals equal those of the probability-flow ODE
(Flow-GRPO, Liu et al. 2025, eq. 9-12). Its transition is Gaussian, so the policy log-probability of
a step, which GRPO needs, is available in closed form.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class StepResult:
    """Outcome of one SDE step; every tensor has the batch as its first dimension.

    ``log_prob`` is (B,): the Gaussian log-density of ``x_next`` under N(mean, std²), averaged (not
    summed) over all non-batch dimensions, as Flow-GRPO does, so that its scale, and so the useful
    clip range of the importance ratio, does not depend on the image size. ``std`` is (B,).
    """

    x_next: torch.Tensor
    log_prob: torch.Tensor
    mean: torch.Tensor
    std: torch.Tensor


def ode_step(x: torch.Tensor, velocity: torch.Tensor, sigma: float, sigma_next: float) -> torch.Tensor:
    """Euler step of the probability-flow ODE ``dx/dsigma = v``: returns ``x + v * (sigma_next - sigma)``."""
    return x + velocity * (sigma_next - sigma)


def sde_std(sigma: float, sigma_next: float, noise_level: float, sigma_cap: float) -> float:
    """Per-step noise standard deviation of the Flow-GRPO SDE, ``sqrt(sigma/(1-sigma)) * a * sqrt(-dt)``.

    At sigma = 1 the diffusion coefficient ``sqrt(sigma/(1-sigma))`` diverges; like Flow-GRPO we
    put ``sigma_cap`` (the second sigma of the schedule) in the denominator instead.
    """
    dt = sigma_next - sigma
    denominator_sigma = sigma_cap if sigma >= 1.0 else sigma
    coefficient = math.sqrt(sigma / (1.0 - denominator_sigma)) * noise_level
    return coefficient * math.sqrt(-dt)


def sde_step(
    x: torch.Tensor,
    velocity: torch.Tensor,
    sigma: float,
    sigma_next: float,
    noise_level: float,
    noise: torch.Tensor | None = None,
    x_next: torch.Tensor | None = None,
    sigma_cap: float | None = None,
) -> StepResult:
    """One Flow-GRPO SDE step from ``sigma`` to ``sigma_next`` (< sigma).

    Give ``noise`` (standard normal, shape of ``x``) to take a step, or ``x_next`` to evaluate the
    log-probability of a step already taken (the training pass: the mean then carries the gradient
    of the current policy, ``x_next`` is a constant). With ``noise_level = 0`` the mean is exactly the
    Euler ODE step and std is 0 (its log-prob is then undefined and returned as zeros).

    Returns a :class:`StepResult`; ``x`` and ``velocity`` are (B, ...).
    """
    if (noise is None) == (x_next is None):
        raise ValueError("sde_step needs exactly one of noise (to sample) or x_next (to score)")
    if not sigma_next < sigma:
        raise ValueError(f"sde_step goes from high to low noise (got sigma={sigma}, sigma_next={sigma_next})")
    dt = sigma_next - sigma
    batch = x.shape[0]
    if noise_level == 0.0:
        mean = ode_step(x, velocity, sigma, sigma_next)
        taken = mean if x_next is None else x_next
        zeros = torch.zeros(batch, dtype=x.dtype, device=x.device)
        return StepResult(x_next=taken, log_prob=zeros, mean=mean, std=zeros)

    cap = sigma_cap if sigma_cap is not None else sigma_next
    std = sde_std(sigma, sigma_next, noise_level, cap)
    variance_coeff = std**2 / -dt  # Flow-GRPO's std_dev_t ** 2
    mean = x * (1.0 + variance_coeff / (2.0 * sigma) * dt) + velocity * (
        1.0 + variance_coeff * (1.0 - sigma) / (2.0 * sigma)
    ) * dt
    if x_next is None:
        x_next = mean + std * noise
    x_next = x_next.detach()
    reduce_dims = tuple(range(1, x.ndim))
    log_density = (
        -((x_next - mean) ** 2) / (2.0 * std**2) - math.log(std) - 0.5 * math.log(2.0 * math.pi)
    )
    log_prob = log_density.mean(dim=reduce_dims)
    std_tensor = torch.full((batch,), std, dtype=x.dtype, device=x.device)
    return StepResult(x_next=x_next, log_prob=log_prob, mean=mean, std=std_tensor)
