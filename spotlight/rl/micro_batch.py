"""Micro-batches: a minibatch's rows split for memory, with the gradient of the whole minibatch.

A 20 B transformer at 1024² does not fit a minibatch's activations in one backward. The updates run
each minibatch's forward and backward on slices of ``micro_batch_size`` rows and weight each slice's
mean loss by its share of the rows, so the accumulated gradient, and the optimizer step, are those of
the whole minibatch (every loss term is a mean over rows of equal size); only memory changes.
"""

from __future__ import annotations

__all__ = ["micro_batches"]


def micro_batches(rows: int, config: object) -> list[slice]:
    """Row slices of at most ``config.micro_batch_size`` (None, or a config without it: one slice of all ``rows``)."""
    size = getattr(config, "micro_batch_size", None) or rows
    return [slice(start, min(start + size, rows)) for start in range(0, rows, size)]
