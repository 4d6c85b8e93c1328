"""A reward in its own process, so that groups are scored while the rest of the rollout is still sampled.

On the critical path an iteration pays sampling + scoring. With `reward.overlap`, the sampler hands
each finished chunk of groups to `PooledReward.prefetch` and goes on sampling; a worker process (its
own core, `reward.worker_core`, and its own device, `reward.device`) scores the chunk meanwhile. When
the loop then asks `score` for the whole rollout, only the last chunk is still being scored. A
process rather than a thread: the trainer is pinned to one core (`pin_devices`), and a thread would
share that core with the sampler; the reward's models also stay out of the trainer's memory.

Images cross the process boundary as float32 arrays, so a prefetched score is bit for bit the score
the same reward gives in the trainer's process (tests/rewards/test_pool.py pins it).
"""

from __future__ import annotations

import itertools
import multiprocessing as mp
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import torch

from spotlight.rewards.background import concat
from spotlight.rewards.base import Metadata, Reward, RewardError, RewardOutput, guarded_score
from spotlight.rewards.section import RewardSection
from spotlight.rewards.server.wire import decode_output, encode_output

START_TIMEOUT_S = 300.0  # building a reward may load a large model
Builder = Callable[[RewardSection, Any], Reward]  # (section, task default) -> reward, run in the worker


def _worker(build: Builder, section_json: str, task_default: Any, core: int | None, jobs: Any, results: Any) -> None:
    """The worker process: build the reward once, then score jobs until a None arrives."""
    if core is not None:
        os.sched_setaffinity(0, {core})
    torch.set_num_threads(1)
    try:
        reward = build(RewardSection.model_validate_json(section_json), task_default)
    except Exception as error:  # the parent raises it as one line
        results.put(("failed", f"{type(error).__name__}: {' '.join(str(error).split())}"))
        return
    results.put(("ready", reward.name, bool(getattr(reward, "uses_metadata", False)),
                 bool(getattr(reward, "requires_metadata", True))))
    for job in iter(jobs.get, None):
        job_id, pixels, prompts, metadata = job
        try:
            out = guarded_score(reward, torch.from_numpy(pixels), prompts, metadata)
            results.put((job_id, "ok", encode_output(out)))
        except Exception as error:  # answered, so the caller's future never hangs
            results.put((job_id, "error", f"{type(error).__name__}: {' '.join(str(error).split())}"))


@dataclass
class _Prefetched:
    images: torch.Tensor
    prompts: list[str]
    metadata: list[dict[str, Any]] | None
    result: Future


class PooledReward:
    """The reward `section` names, built by `build` (registry.build_reward, passed in so that this module
    does not import the registry that imports it) in a worker process; `prefetch` queues, `score` collects."""

    def __init__(self, build: Builder, section: RewardSection, task_default: Any = None,
                 core: int | None = None) -> None:
        context = mp.get_context("spawn")  # never fork a process that holds Ray or torch threads
        self._jobs, self._results = context.Queue(), context.Queue()
        inner = section.model_copy(update={"overlap": False})
        self._process = context.Process(target=_worker, name="reward-worker", daemon=True,
                                        args=(build, inner.model_dump_json(), task_default, core, self._jobs,
                                              self._results))
        self._process.start()
        try:
            first = self._results.get(timeout=START_TIMEOUT_S)
        except Exception:
            self._process.kill()
            raise RewardError(f"the reward worker did not start within {START_TIMEOUT_S:.0f} s; run the reward "
                              "without reward.overlap to see why") from None
        if first[0] == "failed":
            self._process.join(timeout=5)
            raise RewardError(f"reward worker: {first[1]}")
        _, inner_name, self.uses_metadata, self.requires_metadata = first  # as the reward inside
        self.name = f"pooled[{inner_name}]"
        self._ids = itertools.count()
        self._pending: dict[int, Future] = {}
        self._lock = threading.Lock()
        self._prefetched: list[_Prefetched] = []
        self.prefetched_used = 0  # batches whose score came from chunks scored during sampling
        self._collector = threading.Thread(target=self._collect, name="reward-results", daemon=True)
        self._collector.start()

    def _collect(self) -> None:
        for message in iter(self._results.get, None):
            job_id, status, payload = message
            with self._lock:
                future = self._pending.pop(job_id)
            if status == "ok":
                future.set_result(decode_output(payload, len(payload["rewards"])))
            else:
                future.set_exception(RewardError(f"reward worker: {payload}"))

    def submit(self, images: torch.Tensor, prompts: Sequence[str],
               metadata: Sequence[Metadata] | None = None) -> Future:
        """Queue a batch for the worker; the future resolves to its guarded RewardOutput."""
        if not self._process.is_alive():
            raise RewardError(f"the reward worker exited (code {self._process.exitcode}); restart the run")
        future: Future = Future()
        job_id = next(self._ids)
        with self._lock:
            self._pending[job_id] = future
        pixels = images.detach().float().cpu().contiguous().numpy()
        self._jobs.put((job_id, pixels, list(prompts), None if metadata is None else [dict(m) for m in metadata]))
        return future

    def prefetch(self, images: torch.Tensor, prompts: Sequence[str],
                 metadata: Sequence[Metadata] | None = None) -> None:
        """Start scoring a finished chunk; a later `score` of these chunks, in order, collects them."""
        records = None if metadata is None else [dict(m) for m in metadata]
        self._prefetched.append(_Prefetched(images.detach().cpu(), list(prompts), records,
                                            self.submit(images, prompts, metadata)))

    def _take_prefetched(self, images: torch.Tensor, prompts: Sequence[str],
                         metadata: Sequence[Metadata] | None) -> list[Future] | None:
        """The futures of the prefetched chunks if they are exactly (images, prompts, metadata), else None
        (and forget them): a caller that adds metadata only when it scores gets a fresh, right score."""
        chunks, self._prefetched = self._prefetched, []
        if not chunks or [p for chunk in chunks for p in chunk.prompts] != list(prompts):
            return None
        prefetched_metadata = None if chunks[0].metadata is None else [m for c in chunks for m in c.metadata or []]
        if prefetched_metadata != (None if metadata is None else [dict(m) for m in metadata]):
            return None
        if not torch.equal(torch.cat([chunk.images for chunk in chunks]), images.detach().cpu()):
            return None
        return [chunk.result for chunk in chunks]

    def score(self, images: torch.Tensor, prompts: Sequence[str],
              metadata: Sequence[Metadata] | None = None) -> RewardOutput:
        """The prefetched chunks' outputs when they are this batch; otherwise the worker scores it now."""
        futures = self._take_prefetched(images, prompts, metadata)
        self.prefetched_used += futures is not None
        futures = futures or [self.submit(images, prompts, metadata)]
        return concat([future.result() for future in futures])

    def __reduce__(self) -> Any:
        raise RewardError("reward.overlap keeps the reward in a worker process of the trainer and cannot be sent "
                          "to other processes (mode disaggregated scores on its generators): set reward.overlap false")

    def close(self) -> None:
        """Stop the worker and the collector."""
        if self._process.is_alive():
            self._jobs.put(None)
            self._process.join(timeout=10)
            if self._process.is_alive():
                self._process.kill()
        self._results.put(None)
        self._collector.join(timeout=5)

