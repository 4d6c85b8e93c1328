"""The bubble policy (BTS): how many fragments the trainer should generate itself when it would wait.

At a bubble the trainer has no complete group to train and generators still hold unstarted
fragments (units) of the batch. Taking k of them onto the trainer (TAG) shortens generation, but the
trainer pays an offload/restore and generates slower than a generator, and while it generates it
cannot train groups that arrive: too much TAG makes the trainer the bottleneck (an independent
reproduction measured a coarse TAG that generated a whole extra round at 0.68x). So the policy
compares, on the profiled timings, the finishing time of the rest of the step for every k from 0 to
a bound and takes the smallest k that beats k = 0 by at least ``min_gain_s``; k = 0 (no TAG) is
always a candidate, so under the timing model TAG never lengthens the step.

The step model: each generator takes the next unstarted fragment when it is free; the trainer
offloads, generates its k fragments ``trainer_parallel`` at a time, restores, then trains every
fragment in the order they are ready. The rest of the step ends when the last fragment is trained.
How DigenRL's BTS searches is not public (inferred: "a bounded, memoised search over profiled
timings" is all that is stated); this is one such search.

Bounded: at most ``max_fragments + 1`` candidates, each an O(R log G) replay of R fragments on G
generators. Memoised: the replay is a pure function of (fragments left, k, generator free times
rounded to ``resolution_s``, timings) and is cached (LRU, 4,096 entries), so the bubble that recurs
at the start of every step (all generators just started) is evaluated once per run.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from functools import lru_cache


@dataclass(frozen=True)
class BubbleTimings:
    """Profiled seconds: one fragment on one generator device, one fragment on one trainer device (TAG),
    training one fragment's samples on the whole trainer, and offload + restore around a TAG burst.
    ``trainer_parallel``: fragments the trainer generates at once (one per trainer device)."""

    fragment_on_generator_s: float
    fragment_on_trainer_s: float
    train_fragment_s: float
    offload_restore_s: float
    trainer_parallel: int = 1

    def __post_init__(self) -> None:
        for name in ("fragment_on_generator_s", "fragment_on_trainer_s", "train_fragment_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"bubble timing {name} must be > 0 s (got {getattr(self, name)}): profile it first")
        if self.offload_restore_s < 0 or self.trainer_parallel < 1:
            raise ValueError(f"offload_restore_s must be ≥ 0 and trainer_parallel ≥ 1 "
                             f"(got {self.offload_restore_s}, {self.trainer_parallel})")


@dataclass(frozen=True)
class QueueState:
    """The batch at the bubble: unstarted fragments, per generator the seconds until it is free (its
    fragment in flight then becomes trainable; 0 = idle), and the seconds before any generator may start
    a fragment (waiting for the weights to be published; 0 = now)."""

    fragments_left: int
    generator_free_in_s: tuple[float, ...]
    generators_blocked_for_s: float = 0.0


@dataclass(frozen=True)
class BubblePolicy:
    """Decides k at each bubble; ``max_fragments`` bounds the search; TAG must win by ``min_gain_s`` and by
    ``min_gain_fraction`` of the rest of the step (the margin for what the timing model leaves out)."""

    timings: BubbleTimings
    max_fragments: int = 8
    min_gain_s: float = 0.0
    min_gain_fraction: float = 0.0
    resolution_s: float = 1e-3

    def fragments_for_trainer(self, queue: QueueState) -> int:
        """How many unstarted fragments the trainer should generate now (0: wait for the generators)."""
        if queue.fragments_left <= 0:
            return 0
        free = tuple(sorted(round(t / self.resolution_s) for t in queue.generator_free_in_s))
        blocked = round(queue.generators_blocked_for_s / self.resolution_s)
        baseline = rest_of_step_s(queue.fragments_left, 0, free, self.resolution_s, self.timings, blocked)
        best_k, best = 0, baseline
        for k in range(1, min(self.max_fragments, queue.fragments_left) + 1):
            finish = rest_of_step_s(queue.fragments_left, k, free, self.resolution_s, self.timings, blocked)
            if finish < best and baseline - finish > max(self.min_gain_s, self.min_gain_fraction * baseline):
                best_k, best = k, finish
        return best_k


@lru_cache(maxsize=4096)
def rest_of_step_s(fragments_left: int, k: int, generator_free_ticks: tuple[int, ...], resolution_s: float,
                   timings: BubbleTimings, blocked_ticks: int = 0) -> float:
    """Seconds until the last fragment of the step is trained if the trainer generates k of the unstarted ones.

    ``generator_free_ticks``: each generator's free time in ``resolution_s`` ticks; a generator that
    is busy (ticks > 0) is finishing a fragment that becomes trainable then. No generator starts a
    fragment before ``blocked_ticks`` (the weights are still on their way); the trainer already has them.
    """
    ready = [ticks * resolution_s for ticks in generator_free_ticks if ticks > 0]
    free = [max(ticks, blocked_ticks) * resolution_s for ticks in generator_free_ticks]
    heapq.heapify(free)
    if not free and fragments_left - k > 0:
        raise ValueError("no generator can take the fragments the trainer leaves: give the queue ≥ 1 generator")
    for _ in range(fragments_left - k):
        start = heapq.heappop(free)
        done = start + timings.fragment_on_generator_s
        ready.append(done)
        heapq.heappush(free, done)
    trainer = 0.0
    if k:
        rounds = math.ceil(k / timings.trainer_parallel)
        trainer = timings.offload_restore_s + rounds * timings.fragment_on_trainer_s
        ready.extend([trainer] * k)
    for arrival in sorted(ready):
        trainer = max(trainer, arrival) + timings.train_fragment_s
    return trainer
