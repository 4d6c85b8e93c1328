"""Sampling shared between the trainer and the spot devices: its chunks, who samples which, and what came back.

A rollout's groups and validation's rows are cut into chunks, each a pure function of (weights, its
prompts, its seeds, plan). The trainer takes chunks from the front, one at a time; the controller thread
hands chunks from the back to every idle spot device holding the weights, each time one answers, so
neither waits for the other and the two meet somewhere in the middle (the old fixed split left the faster
one idle until the other finished). A chunk whose device is lost, or that held other weights, goes back
to the front: the trainer samples it next, and nothing is lost.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from spotlight.diffusion.sampler import SamplingPlan
from spotlight.runtime.spot.pools import CallResult, SpotPool

__all__ = ["SampleShare", "sample_shared"]

Sampled = tuple[torch.Tensor, torch.Tensor]  # (latents, log_probs) of a chunk, as `SpotDevice.sample` answers


@dataclass
class SampleShare:
    """One sampling job's chunks between the trainer (``take``) and the spot devices (``feed``); under the cluster lock.

    ``version`` is the weights version the devices must hold; ``phase`` what their calls are billed as
    (rollout, eval); ``record`` whether every step's latent comes back (a rollout) or the last only.
    """

    pool: SpotPool
    finished: list[CallResult]  # the cluster's finished calls, where the devices' answers arrive
    version: int
    plan: SamplingPlan
    chunks: list[tuple[list[str], list[int]]]
    phase: str
    record: bool
    pending: deque[int] = field(default_factory=deque)
    running: dict[str, int] = field(default_factory=dict)  # device -> the chunk it samples
    results: dict[int, Sampled] = field(default_factory=dict)
    on_devices: int = 0  # chunks the spot devices sampled
    returned: int = 0  # chunks given back to the trainer (a device lost, or holding other weights)

    def __post_init__(self) -> None:
        self.pending.extend(range(len(self.chunks)))

    def feed(self) -> None:
        """Controller thread: take the devices' answers, give every idle device holding the weights a chunk."""
        for result in [r for r in self.finished if r.phase == self.phase]:
            self.finished.remove(result)
            index = self.running.pop(result.device_id, None)
            if index is None:  # not one of this job's chunks (none is expected)
                continue
            answer = None if result.call is None else result.call.result
            if answer is None:  # lost, or it held other weights: the trainer samples it next
                self.pending.appendleft(index)
                self.returned += 1
            else:
                self.results[index] = answer
                self.on_devices += 1
        for device in self.pool.devices(version=self.version, state="idle"):
            if not self.pending:
                return
            index = self.pending.pop()
            self.running[device] = index
            self.pool.call(device, self.phase, "sample", *self.chunks[index], self.plan, self.version, self.record)

    def take(self) -> int | None:
        """The trainer's next chunk (from the front), None when none is left to start."""
        return self.pending.popleft() if self.pending else None

    def complete(self) -> bool:
        return len(self.results) == len(self.chunks)

    def settled(self) -> bool:
        """Every chunk has its samples, or one came back for the trainer."""
        return self.complete() or bool(self.pending)

    def ordered(self) -> list[Sampled]:
        """Every chunk's (latents, log_probs), in order."""
        return [self.results[index] for index in range(len(self.chunks))]


def sample_shared(cluster: Any, share: SampleShare,
                  here: Callable[[tuple[list[str], list[int]]], Sampled]) -> list[Sampled]:
    """Sample ``share``'s chunks with ``here`` (the trainer, from the front) while ``cluster``'s controller thread
    feeds them to the spot devices (`SpotCluster.feed`); every chunk's (latents, log_probs), in order.

    The trainer takes its first chunk before the devices are fed, so a job of one chunk stays on the trainer.
    """
    with cluster.lock:
        index = share.take()
        cluster.feed = share.feed
    try:
        while True:
            if index is None:  # the devices hold the rest: wait for them, or for a chunk a lost one gave back
                cluster.wait(share.settled)
            else:
                sampled = here(share.chunks[index])
                with cluster.lock:
                    share.results[index] = sampled
            with cluster.lock:
                if share.complete():
                    return share.ordered()
                index = share.take()
    finally:
        with cluster.lock:
            cluster.feed = None
