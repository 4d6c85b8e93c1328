"""The random streams of an iteration: every random choice of iteration i comes from a generator keyed by
(run seed, i, what it is for), so a resumed run continues with exactly the numbers it would have had,
and every backend (in-process or on Ray) draws the same prompts, candidates and shuffles."""

from __future__ import annotations

from enum import IntEnum

import torch

from spotlight.diffusion.noise import stream_key

__all__ = ["Stream", "candidate_seeds", "iteration_generator", "iteration_prompts"]


class Stream(IntEnum):
    """What a stream of an iteration is for; the values are part of every run's numbers, never renumber them."""

    PROMPTS = 0
    SEEDS = 1
    UPDATE = 2
    SELECTION = 3


def iteration_generator(run_seed: int, iteration: int, purpose: Stream) -> torch.Generator:
    """A generator for one purpose of one iteration, independent of every other (run seed, iteration, purpose)."""
    return torch.Generator().manual_seed(stream_key(run_seed * 16 + int(purpose), iteration))


def iteration_prompts(train_prompts: list[str], run_seed: int, iteration: int, count: int) -> list[str]:
    """The prompts of iteration i: ``count`` distinct train prompts drawn by (run seed, i)."""
    order = torch.randperm(len(train_prompts), generator=iteration_generator(run_seed, iteration, Stream.PROMPTS))
    return [train_prompts[int(j)] for j in order[:count]]


def candidate_seeds(run_seed: int, iteration: int, num_prompts: int, count: int) -> torch.Tensor:
    """(P, count) candidate noise seeds of iteration i (random seeds: count = G)."""
    return torch.randint(0, 2**62, (num_prompts, count), generator=iteration_generator(run_seed, iteration,
                                                                                          Stream.SEEDS))
