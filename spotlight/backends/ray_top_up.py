"""More candidates for the open round while training still runs: the spot devices' idle time, explored.

The planner sizes a round to the last training time (times its budget fraction), and its arms are
discrete, so a round that drains leaves its devices idle until the update ends: the default run's spot
device waited out about a fifth of its held time there. Once the round beside training has drained and
training goes on, `RoundTopUp` adds blocks of one more candidate per prompt (the round's own requests:
same prompts, plan and weights), so the devices keep exploring P_{i+1}; the round's selection then picks
each group's G seeds from every candidate scored. A block is one forward batch's worth of requests.

The queue is kept ahead of the devices: from the first block on, the round's outstanding requests are
topped up to what its devices can hold (``runtime.worker_capacity`` each) and as much again waiting (at
least a block), so a device that finishes its leases pulls the next ones in the same pass and never
drains. (Queuing one block when the previous had drained left a ~73 ms gap per ~273 ms block: the
device's call ended, the controller saw it on its next tick, queued the block and called the device
again; on a loaded machine the gaps were 0.3-0.8 s.) The count comes from the queue every ``poll_s``;
what waits there lasts as long as what the devices hold, so a poll late by a slow tick comes in time.
Waiting requests cost nothing when training ends: they are cancelled before any device leased them.

When training ends the trainer does not wait for the blocks in flight: the planned candidates were done
before the first block went out, so the round closes at once and the unfinished blocks are cancelled
and dropped whole (`keep_complete_top_ups`). The trainer scores every candidate after the update, on
its own time, so a prompt gets at most ``limit`` candidates in all (the Ray backend: the planner's
largest arm), what a planned round may score anyway. (Twice the planned candidates was too tight: the
planner's bandit often picks a small arm, and in a short run the device then idled ~10 s of each ~16 s
update once the limit was reached.)

The extra seeds continue the round's own candidate stream (`spotlight.loop.streams.Stream.SEEDS` of the
target iteration, after its planned (P, N) draw), one block's (P, per_block) draw after another, so a
run's explored seeds are a function of its config and of how many blocks the devices had time for.
"""

from __future__ import annotations

import math
import time
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
    """Tops up ``round`` with blocks of ``per_block`` candidates per prompt once it drained (controller thread).

    ``submit`` queues requests (the queue actor's submit, waited for); ``remaining`` counts the requests of
    the round's weights not done yet (the queue's ``remaining(version)``); ``generator`` continues the
    round's candidate stream; ``sampling`` is its requests' plan. ``ahead``: the requests kept outstanding
    once topping up (what the devices hold, and as much waiting), counted every ``poll_s`` of ``clock``.
    ``open`` is cleared (under the cluster lock) when training ends: no block is added after it.
    """

    submit: Callable[[list[Request]], object]
    remaining: Callable[[], int]
    round: Round
    generator: torch.Generator
    sampling: SamplingPlan
    per_block: int
    limit: int
    ahead: int
    poll_s: float = 0.1
    clock: Callable[[], float] = time.monotonic
    blocks: int = 0
    open: bool = True
    next_poll: float = -math.inf
    planned_device_s: float = 0.0  # the round's device time when its first block went out: its planned part's
    planned_share: float = 1.0  # and the share of it its own requests took (the rest rode along)

    @classmethod
    def sized(cls, submit: Callable[[list[Request]], object], remaining: Callable[[], int], round_: Round,
              generator: torch.Generator, sampling: SamplingPlan, forward_batch: int, limit: int,
              held: int) -> RoundTopUp:
        """A top-up whose blocks fill about one forward batch of the devices (at least one candidate per prompt),
        up to ``limit`` candidates per prompt in all, that keeps ``held`` requests (what the round's devices
        can hold at once) outstanding and as many again waiting, at least a block."""
        per_block = max(1, math.ceil(forward_batch / max(1, len(round_.prompts))))
        held = max(0, held)
        return cls(submit, remaining, round_, generator, sampling, per_block, limit,
                   ahead=held + max(held, per_block * len(round_.prompts)))

    @property
    def extra_candidates(self) -> int:
        """Candidates per prompt added beyond the plan's."""
        return self.blocks * self.per_block

    def feed(self) -> None:
        """Controller thread, under the cluster lock: keep the queue ``ahead`` of the devices, block by block.

        The first block goes out once the round drained (its planned candidates, and what rode along, are
        done); from then on the round's outstanding requests are counted every ``poll_s`` and topped up.
        """
        round_ = self.round
        if not self.open:
            return
        if round_.drained:  # nothing of the round is left: no need to ask the queue
            outstanding = 0
        elif not self.blocks:  # the planned candidates first
            return
        else:
            now = self.clock()
            if now < self.next_poll:
                return
            self.next_poll = now + self.poll_s
            outstanding = self.remaining()
        prompts, block = len(round_.prompts), self.per_block * len(round_.prompts)
        columns, added = round_.candidates.shape[1], []
        while outstanding < self.ahead and columns + self.per_block <= self.limit:
            added.append(torch.randint(0, 2**62, (prompts, self.per_block), generator=self.generator))
            columns += self.per_block
            outstanding += block
        if not added:
            return
        if not self.blocks:  # the calls that serve the blocks run on until training ends: the planned cost is now
            self.planned_device_s, self.planned_share = round_.device_s, round_.own_share()
        seeds, first = torch.cat(added, dim=1), round_.candidates.shape[1]
        self.submit([Request(candidate_id(round_.target, p, first + c), round_.prompts[p], int(seeds[p, c]),
                             self.sampling, weights_version=round_.version)
                     for b in range(len(added)) for p in range(prompts)
                     for c in range(b * self.per_block, (b + 1) * self.per_block)])  # block by block, in order
        round_.candidates = torch.cat([round_.candidates, seeds], dim=1)
        round_.ids = [candidate_id(round_.target, p, c) for p in range(prompts)
                      for c in range(columns)]  # prompt-major, as the round's scoring reads them
        round_.drained = False
        self.blocks += len(added)
        self.next_poll = self.clock() + self.poll_s


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
