"""Sigma schedules for rectified-flow (flow-matching) sampling.

Convention used everywhere in Spotlight: ``x_sigma = (1 - sigma) * x0 + sigma * noise``; sigma = 1 is
pure noise, sigma = 0 is data, and the model predicts the velocity ``v = noise - x0``.
"""

from __future__ import annotations

import torch


def time_shift(t: torch.Tensor, shift: float) -> torch.Tensor:
    """Shift timesteps towards the noisy end: ``shift * t / (1 + (shift - 1) * t)``.

    This is the resolution-dependent shift of SD3 / FLUX: with ``shift > 1`` more of the step budget
    is spent at high noise, where the global layout (what RL on composition cares about) is decided.
    ``shift = 1`` is the identity. Returns a tensor of the same shape as ``t``.
    """
    if shift <= 0:
        raise ValueError(f"shift must be > 0 (got {shift})")
    return shift * t / (1.0 + (shift - 1.0) * t)


def sigma_schedule(num_steps: int, shift: float = 1.0, grid_end: float | None = None,
                   shift_terminal: float | None = None) -> torch.Tensor:
    """Return the ``num_steps + 1`` sigmas of a sampler, from 1 (noise) down to 0 (data), float64.

    The ``num_steps`` non-zero sigmas are the grid ``linspace(1, grid_end, num_steps)`` (``grid_end``
    None: ``1 / num_steps``, i.e. ``linspace(1, 0, num_steps + 1)`` without its 0) shifted by
    :func:`time_shift`; with ``shift_terminal`` they are then stretched so that the last one equals it
    (``1 - sigma`` scaled by ``(1 - shift_terminal) / (1 - last)``). The defaults are Spotlight's own
    schedule; ``grid_end`` and ``shift_terminal`` let a diffusers pipeline's scheduler be reproduced
    (``spotlight.models.pipelines.folder.PipelineFolder.schedule``).

    Float64 so that the same schedule is bit-identical wherever it is recomputed (rollout worker,
    trainer, a worker resuming a committed latent); steps cast it to the latent dtype when used.
    """
    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1 (got {num_steps})")
    if grid_end is None:  # Spotlight's own grid, computed as it always was (bit-identical schedules)
        grid = torch.linspace(1.0, 0.0, num_steps + 1, dtype=torch.float64)[:num_steps]
    elif num_steps == 1:
        grid = torch.ones(1, dtype=torch.float64)
    else:
        grid = torch.linspace(1.0, grid_end, num_steps, dtype=torch.float64)
    sigmas = time_shift(grid, shift)
    if shift_terminal is not None:
        one_minus = 1.0 - sigmas
        sigmas = 1.0 - one_minus / (one_minus[-1] / (1.0 - shift_terminal))
    return torch.cat([sigmas, torch.zeros(1, dtype=torch.float64)])
