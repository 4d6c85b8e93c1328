"""More candidates for the open round while training still runs: the spot devices' idle time, explored.

The planner sizes a round to the last training time (times its budget fraction), and its arms are
discrete, so a round that drains leaves its devices idle until the update ends: the default run's spot
device waited out about a fifth of its held time there. While the round beside training is drained and
training goes on, `RoundTopUp` adds one more candidate per prompt at a time (a block of the round's own
requests: same prompts, plan and weights), so the devices keep exploring P_{i+1}; the round's selection
then picks each group's G seeds from every candidate scored. A block is one forward batch's worth of
requests. When training ends the trainer does not wait for the block in flight: the planned candidates
were done before the first block went out, so the round closes at once and the unfinished block is
cancelled and dropped whole (`keep_complete_top_ups`). The trainer scores every candidate after the
update, on its own time, so a prompt gets at most ``limit`` candidates in all (the Ray backend: the
planner's largest arm), what a planned round may score anyway. (Twice the planned candidates was too
tight: the planner's bandit often picks a small arm, and in a short run the device then idled ~10 s of
each ~16 s update once the limit was reached.)

The extra seeds continue the round's own candidate stream (`spotlight.loop.streams.Stream.SEEDS` of the
target iteration, after its planned (P, N) draw), so a run's explored seeds are a function of its config and
of how many blocks the devices had time for.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from spotlight.diffusion.sampler import SamplingPlan
from spotlight.runtime.queue.request_queue import Request
from spotlight.runtime.queue.rounds import Round

__all__ = ["RoundTopUp", "candidate_id", "keep_complete_top_ups"]


def candidate_id(target: int, prompt: int, candidate: int) -> str:
    """The request id of candidate ``candidate`` of prompt ``prompt`` of the round exploring ``target``."""
    return f"x{target}-{prompt}-{candidate}"


@dataclass
class RoundTopUp:
    """Tops up ``round`` with blocks of ``per_block`` candidates per prompt while it is drained (controller thread).

    ``submit`` queues requests (the queue actor's submit, waited for); ``generator`` continues the round's
    candidate stream; ``sampling`` is its requests' plan. ``open`` is cleared (under the cluster lock) when
    training ends: no block is added after it.
    """

    submit: Callable[[list[Request]], object]
    round: Round
    generator: torch.Generator
    sampling: SamplingPlan
    per_block: int
    limit: int
    blocks: int = 0
    open: bool = True

    @classmethod
    def sized(cls, submit: Callable[[list[Request]], object], round_: Round, generator: torch.Generator,
              sampling: SamplingPlan, forward_batch: int, limit: int) -> RoundTopUp:
        """A top-up whose blocks fill about one forward batch of the devices (at least one candidate per prompt),
        up to ``limit`` candidates per prompt in all."""
        per_block = max(1, math.ceil(forward_batch / max(1, len(round_.prompts))))
        return cls(submit, round_, generator, sampling, per_block, limit)

    @property
    def extra_candidates(self) -> int:
        """Candidates per prompt added beyond the plan's."""
        return self.blocks * self.per_block

    def feed(self) -> None:
        """Controller thread, under the cluster lock: a drained round of an open top-up gets one more block."""
        round_ = self.round
        prompts, planned = len(round_.prompts), round_.candidates.shape[1]
        if not self.open or not round_.drained or planned + self.per_block > self.limit:
            return
        seeds = torch.randint(0, 2**62, (prompts, self.per_block), generator=self.generator)
        requests = [Request(candidate_id(round_.target, p, planned + c), round_.prompts[p], int(seeds[p, c]),
                            self.sampling, weights_version=round_.version)
                    for p in range(prompts) for c in range(self.per_block)]
        self.submit(requests)
        round_.candidates = torch.cat([round_.candidates, seeds], dim=1)
        round_.ids = [candidate_id(round_.target, p, c) for p in range(prompts)
                      for c in range(round_.candidates.shape[1])]  # prompt-major, as the round's scoring reads them
        round_.drained = False
        self.blocks += 1


def keep_complete_top_ups(round_: Round, results: dict[str, torch.Tensor]) -> None:
    """Cut a topped-up round to its planned candidates and the added ones every prompt got (a cancelled block's
    candidates are dropped whole, so every prompt keeps the same number and none is scored as missing)."""
    planned, columns = round_.plan.num_candidates, round_.candidates.shape[1]
    prompts = range(len(round_.prompts))
    keep = next((c for c in range(planned, columns)
                 if any(candidate_id(round_.target, p, c) not in results for p in prompts)), columns)
    if keep < columns:
        round_.candidates = round_.candidates[:, :keep]
        round_.ids = [candidate_id(round_.target, p, c) for p in prompts for c in range(keep)]
