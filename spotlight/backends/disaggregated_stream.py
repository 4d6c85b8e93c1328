"""What the disaggregated backend hands the update: step s's complete groups, as the trainer may train them.

Apart from `spotlight.backends.disaggregated` so that the loop can tell a stream from a one-shot
`Rollout` without importing Ray.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch

from spotlight.disagg.groups import AssembledGroup
from spotlight.disagg.samples import ScoredSample

__all__ = ["GroupStream"]


class GroupStream:
    """Iterating yields step ``step``'s groups (from ``produce``, the backend's generator of them);
    ``samples`` and ``metrics`` are complete once it has been consumed."""

    def __init__(self, produce: Callable[[GroupStream], Iterator[AssembledGroup]], step: int, prompts: list[str],
                 seeds: torch.Tensor, optimizer: torch.optim.Optimizer) -> None:
        self.produce, self.step, self.prompts, self.seeds, self.optimizer = produce, step, prompts, seeds, optimizer
        self.num_groups = len(prompts)
        self.samples: list[ScoredSample] = []
        self.metrics: dict[str, float] = {}

    def __iter__(self) -> Iterator[AssembledGroup]:
        return self.produce(self)
