"""Seeded noise streams: a seed is the whole random stream of one sample.

The initial latent and the noise of every SDE step come from a generator keyed by (seed, step), so a
sample is a pure function of (weights, prompt, seed, plan): a worker that resumes a committed latent
at step k draws exactly the noise the first worker would have drawn, and exploration that replays a
seed with other weights sees the "same" sample.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

INITIAL_STEP = -1  # the stream key of the initial latent
_MASK64 = (1 << 64) - 1


def stream_key(seed: int, step: int) -> int:
    """Mix (seed, step) into one 63-bit generator seed with splitmix64.

    A plain ``seed * K + step`` would make (seed, step) and (seed + 1, step - K) collide; splitmix64's
    avalanche makes nearby keys independent streams.
    """
    z = (seed * 0x9E3779B97F4A7C15 + (step + 2) * 0xD1B54A32D192ED03) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) & ((1 << 63) - 1)


def seeded_normal(
    seeds: Sequence[int], step: int, shape: Sequence[int], dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Standard normal noise of shape (len(seeds), *shape), row b drawn from stream (seeds[b], step).

    Drawn on the CPU so that it is bit-identical on every machine and device; the caller moves it.
    """
    rows = []
    for seed in seeds:
        generator = torch.Generator().manual_seed(stream_key(int(seed), step))
        rows.append(torch.randn(tuple(shape), generator=generator, dtype=dtype))
    return torch.stack(rows)


def initial_latents(seeds: Sequence[int], shape: Sequence[int]) -> torch.Tensor:
    """The pure-noise starting latents (len(seeds), *shape) of the given seeds."""
    return seeded_normal(seeds, INITIAL_STEP, shape)
