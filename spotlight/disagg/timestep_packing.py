"""Timestep packing (TSP): several denoising timesteps of a sample in one forward/backward.

An update that trains T timesteps of each sample can run T passes (one per timestep) or one pass
over the T copies stacked along the batch, each row with its own noise level. The model is a
function of each row separately (no batch statistics: TinyDiT's norms are per token), so the packed
pass computes the same per-row losses; summed and scaled by the same row count, it gives the same
gradient (up to the order of floating-point sums). What it saves is per pass, not per row: with FSDP
each forward and backward all-gathers the sharded weights, so T passes pay T all-gathers (and T
kernel launches of small batches) where one packed pass pays one.

Where gradient synchronisation belongs (DDP / FSDP): gradients are summed over every pass of a
logical batch and reduced across data-parallel ranks once, after the last backward. Every forward
and backward except the last one of the batch runs inside ``model.no_sync()`` (the forward too: DDP
decides at forward time whether the next backward reduces). A packed pass is one such backward, so
packing changes only how many passes sit inside ``no_sync``; the accumulator
(`spotlight.disagg.accumulate.LogicalBatchUpdate`) opens it for every pass but the batch's last. With
FSDP's ``no_sync`` the unsharded gradients are kept on every rank until that last pass (memory for
fewer all-gathers and reduce-scatters); that trade is the user's, not the loss's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

VelocityModel = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def packed_velocity(
    model: VelocityModel, latents: Sequence[torch.Tensor], sigmas: Sequence[torch.Tensor],
    tokens: Sequence[torch.Tensor],
) -> list[torch.Tensor]:
    """Velocities of several (latents (B_i, C, H, W), sigmas (B_i,), tokens (B_i, L)) blocks from ONE forward.

    The blocks are concatenated along the batch, run through ``model`` once, and split back into a
    list of (B_i, C, H, W) in the order given.
    """
    if not (len(latents) == len(sigmas) == len(tokens)) or not latents:
        raise ValueError(f"packed_velocity needs ≥ 1 block and as many sigmas and tokens as latents "
                         f"(got {len(latents)}, {len(sigmas)}, {len(tokens)})")
    sizes = [block.shape[0] for block in latents]
    velocity = model(torch.cat(list(latents)), torch.cat(list(sigmas)), torch.cat(list(tokens)))
    return list(velocity.split(sizes))
