"""Images per second of a model reward, counted over its `score` calls.

The number that decides whether a reward keeps up with sampling (docs/rewards.md, "Rewards off the critical
path"); benchmarks/rewards/model_throughput.py prints it. On CUDA the clock stops after the scores reach the
host, which the reward's `.cpu()` of its output already waits for, so no extra synchronisation is added.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass
class Throughput:
    """Images scored and the seconds spent scoring them."""

    images: int = 0
    seconds: float = 0.0

    @contextmanager
    def timing(self, images: int) -> Iterator[None]:
        started = time.perf_counter()
        yield
        self.seconds += time.perf_counter() - started
        self.images += images

    @property
    def images_per_s(self) -> float:
        return self.images / self.seconds if self.seconds > 0 else 0.0
