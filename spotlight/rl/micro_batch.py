"""Micro-batches: a minibatch's rows split for memory and over trainer ranks, with the whole minibatch's gradient.

A 20 B transformer at 1024² does not fit a minibatch's activations in one backward. The updates run
each minibatch's forward and backward on slices of ``micro_batch_size`` rows and weight each slice's
mean loss by its share of the rows, so the accumulated gradient, and the optimizer step, are those of
the whole minibatch (every loss term is a mean over rows of equal size); only memory changes.

With K trainer ranks (``config.world_size`` > 1, `spotlight.ranks`) every rank holds the whole
minibatch and draws the same noise from the same generator, but computes only its contiguous share of
the rows; the ranks' gradients are summed (`spotlight.ranks.data_parallel`), which gives the same
weighted sum as one process computing every slice. Every rank runs the same number of slices: each
slice's forward or backward is a collective under DDP and FSDP2, and a rank with one fewer would hang
the others.
"""

from __future__ import annotations

import math

import torch
from torch.distributed.tensor import DTensor

__all__ = ["local_norm", "micro_batches", "rank_rows"]


def rank_rows(rows: int, rank: int, world_size: int) -> slice:
    """Rank ``rank``'s contiguous share of ``rows`` rows: the first ``rows % world_size`` ranks take one more."""
    base, extra = divmod(rows, world_size)
    start = rank * base + min(rank, extra)
    return slice(start, start + base + (rank < extra))


def micro_batches(rows: int, config: object) -> list[slice]:
    """This rank's row slices of a minibatch of ``rows`` rows, each at most ``config.micro_batch_size``.

    One process (a config without ``world_size``): slices of all ``rows`` (None: one slice). K ranks:
    the rank's share (`rank_rows`) in as many slices as the largest share needs, so that every rank
    runs the same number; a minibatch too small to give every rank a row in each slice is a
    ``ValueError`` naming the fix (the same on every rank, so none waits for the others).
    """
    size = getattr(config, "micro_batch_size", None) or rows
    world_size = getattr(config, "world_size", 1)
    if world_size == 1:
        return [slice(start, min(start + size, rows)) for start in range(0, rows, size)]
    share = rank_rows(rows, config.rank, world_size)
    count = math.ceil(math.ceil(rows / world_size) / size)
    if rows // world_size < count:
        raise ValueError(f"a minibatch of {rows} rows cannot give each of trainer.devices={world_size} ranks a row "
                         f"in each of its {count} micro-batches: lower train.num_minibatches or trainer.devices, "
                         f"or raise train.micro_batch_size")
    length = share.stop - share.start
    bounds = [share.start + (length * k) // count for k in range(count + 1)]
    return [slice(bounds[k], bounds[k + 1]) for k in range(count)]


def local_norm(norm: torch.Tensor) -> torch.Tensor:
    """``clip_grad_norm_``'s total norm as a plain tensor on the device: under FSDP2 it is a replicated
    DTensor, which does not add to the plain float64 sums the updates keep (no host sync either way)."""
    return norm.full_tensor() if isinstance(norm, DTensor) else norm
