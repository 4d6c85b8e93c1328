"""A reward scored on a background thread of the trainer's process, so a rollout's chunks are scored while it samples.

`reward.overlap` (the default) with `reward.overlap_worker: thread`. The sampler hands each finished
chunk of groups to `BackgroundReward.prefetch` and goes on to the next chunk; one background thread
scores the chunk meanwhile. When the loop then asks for the whole rollout's rewards, only the last
chunk is still being scored. A thread rather than `pool.PooledReward`'s process: nothing to start
(no second interpreter importing torch, no models loaded twice), images are not copied between
processes, and the reward's own work leaves the GIL while it runs (a model reward's kernels on the
GPU, the OCR reward's ONNX sessions on a pool of CPU threads).

On CUDA the background thread scores on its own stream, after an event recorded when the chunk's images
were made: its kernels and copies are ordered after that chunk's decode and never behind the next
chunk's sampling kernels the trainer queues meanwhile, and the trainer's thread never waits for the
device here (no host synchronisation on the sampling path).

The scores are the reward's own: one thread runs every call of the wrapped reward (a prefetch, or a
batch scored afresh), so a reward that is not thread-safe is never entered twice, and a chunk's scores
are the scores `guarded_score` gives that chunk in the trainer's thread (tests/rewards/test_background.py).
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import torch

from spotlight.rewards.base import Metadata, Reward, RewardContractError, RewardOutput, guarded_score
from spotlight.rewards.server.client import shift_sample_index


@dataclass
class _Chunk:
    images: torch.Tensor
    prompts: list[str]
    metadata: list[dict[str, Any]] | None
    key: torch.Tensor | None  # what the chunk was decoded from (the sampled latents), for `collect`
    result: Future


def _records(metadata: Sequence[Metadata] | None) -> list[dict[str, Any]] | None:
    return None if metadata is None else [dict(m) for m in metadata]


def concat(outputs: Sequence[RewardOutput]) -> RewardOutput:
    """Chunks' outputs as one batch's, sample indices in the error lines shifted to the batch's."""
    errors, start = [], 0
    for out in outputs:
        errors += [shift_sample_index(line, start) for line in out.errors]
        start += out.rewards.shape[0]
    terms = {term: torch.cat([out.terms[term] for out in outputs]) for term in outputs[0].terms}
    return RewardOutput(torch.cat([o.rewards for o in outputs]), torch.cat([o.strict for o in outputs]),
                        torch.cat([o.valid for o in outputs]), errors, terms)


@contextlib.contextmanager
def _after(ready: Any, images: torch.Tensor) -> Iterator[None]:
    """On CUDA, this thread's work on a side stream (that starts once ``ready``, the chunk's images on the device,
    has): a model reward's kernels then run beside the sampler's instead of queueing behind them on the default
    stream, and reading its scores back waits for its own work only. Without CUDA, as it is."""
    if ready is None and not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        yield
        return
    stream = torch.cuda.Stream(images.device if images.is_cuda else None)
    if ready is not None:
        stream.wait_event(ready)
        images.record_stream(stream)  # the allocator keeps the images' memory until this stream is done with it
    with torch.cuda.stream(stream):
        yield


class _DaemonThread:
    """One daemon thread that runs submitted calls in order, each answered through a `Future`.

    Not a `ThreadPoolExecutor`: the interpreter joins an executor's threads at exit, so a reward call that
    hangs or sleeps (a stuck reward server, a paced test reward) kept a run that a stop signal had already
    saved and stopped alive until the call returned. A daemon thread ends with the process.
    """

    def __init__(self, name: str) -> None:
        self._calls: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, call: Any, *args: Any) -> Future:
        future: Future = Future()
        self._calls.put((future, call, args))
        return future

    def _run(self) -> None:
        while (item := self._calls.get()) is not None:
            future, call, args = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(call(*args))
            except BaseException as error:  # handed to the caller, as an executor does
                future.set_exception(error)

    def shutdown(self, wait: bool = True) -> None:
        """Stop after what is queued; with ``wait``, once it has run."""
        self._calls.put(None)
        if wait:
            self._thread.join()


class BackgroundReward:
    """``reward`` run on one background thread: `prefetch` queues a chunk, `score` collects (module docstring)."""

    def __init__(self, reward: Reward) -> None:
        self.reward = reward
        self.name = reward.name
        self.uses_metadata = bool(getattr(reward, "uses_metadata", False))
        self.requires_metadata = bool(getattr(reward, "requires_metadata", True))
        self._thread = _DaemonThread("reward")
        self._prefetched: list[_Chunk] = []
        self.prefetched_used = 0  # batches whose score came from chunks scored during sampling

    def __getattr__(self, name: str) -> Any:  # has_strict, ...: what callers ask of the reward
        if name == "reward":  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.reward, name)

    def _submit(self, images: torch.Tensor, prompts: Sequence[str], metadata: Sequence[Metadata] | None) -> Future:
        ready = None
        if images.is_cuda:
            ready = torch.cuda.Event()
            ready.record(torch.cuda.current_stream(images.device))
        records = _records(metadata)
        return self._thread.submit(self._guarded, images, list(prompts), records, ready)

    def _guarded(self, images: torch.Tensor, prompts: list[str], metadata: list[dict[str, Any]] | None,
                 ready: Any) -> RewardOutput:
        with _after(ready, images):
            return guarded_score(self.reward, images, prompts, metadata)

    def prefetch(self, images: torch.Tensor, prompts: Sequence[str], metadata: Sequence[Metadata] | None = None,
                 key: torch.Tensor | None = None) -> None:
        """Start scoring a finished chunk; a later `score` (or `collect`) of these chunks, in order, takes them.

        A reward that needs metadata it was not given is not prefetched: it is scored when the metadata comes.
        """
        if self.uses_metadata and self.requires_metadata and metadata is None:
            return
        self._prefetched.append(_Chunk(images.detach(), list(prompts), _records(metadata), key,
                                       self._submit(images.detach(), prompts, metadata)))

    def _take(self, prompts: Sequence[str], metadata: Sequence[Metadata] | None) -> list[_Chunk] | None:
        """The prefetched chunks if they are exactly these prompts and metadata, else None (and forget them)."""
        chunks, self._prefetched = self._prefetched, []
        if not chunks or [p for chunk in chunks for p in chunk.prompts] != list(prompts):
            return None
        prefetched = None if chunks[0].metadata is None else [m for c in chunks for m in c.metadata or []]
        return chunks if prefetched == _records(metadata) else None

    def _outputs(self, chunks: list[_Chunk]) -> RewardOutput | None:
        """The chunks' outputs as one; None when a chunk failed as a whole (the caller then scores the batch
        afresh, so that a chunk of nothing but bad samples marks only those, as one call would)."""
        try:
            outputs = [chunk.result.result() for chunk in chunks]
        except RewardContractError:
            raise
        except Exception:
            return None
        self.prefetched_used += 1
        return concat(outputs)

    def score(self, images: torch.Tensor, prompts: Sequence[str],
              metadata: Sequence[Metadata] | None = None) -> RewardOutput:
        """The prefetched chunks' outputs when they are this batch; otherwise the batch, scored on the thread now."""
        chunks = self._take(prompts, metadata)
        if chunks is not None and torch.equal(torch.cat([chunk.images for chunk in chunks]), images.detach()):
            out = self._outputs(chunks)
            if out is not None:
                return out
        return self._submit(images.detach(), prompts, metadata).result()

    def collect(self, prompts: Sequence[str], key: torch.Tensor) -> RewardOutput | None:
        """The prefetched chunks' outputs if they were decoded from ``key`` (the rollout's final latents) for
        these prompts; None otherwise, and for a reward that reads metadata (the caller decodes and scores).
        Saves decoding the rollout a second time."""
        if self.uses_metadata:
            return None
        chunks = self._take(prompts, None)
        if chunks is None or any(chunk.key is None for chunk in chunks):
            return None
        if not torch.equal(torch.cat([chunk.key for chunk in chunks]), key):  # type: ignore[misc]
            return None
        return self._outputs(chunks)

    def __reduce__(self) -> Any:
        """Sent to another process (mode disaggregated's generators) it is the reward, on its own thread there."""
        return (BackgroundReward, (self.reward,))

    def close(self) -> None:
        """Stop the thread (after what is queued) and the wrapped reward's own workers, if it has any."""
        self._thread.shutdown(wait=True)
        close = getattr(self.reward, "close", None)
        if callable(close):
            close()
