"""The queue that survives the loss of its actor: every change logged before a call returns, replayed on restart.

`DurableQueue` is `RequestQueue` with a write-ahead log (`spotlight.runtime.queue.log`) in the run
directory. Each public call that changes requests appends one record per changed request (its
status, committed step, lease holder and the workers that ever held it; the latent on a commit, the
result on a completion) and one record of the counters, then fsyncs once; only then does the call
answer. `start_durable_queue_actor` runs it as a Ray actor that Ray restarts when it dies
(``max_restarts=-1``) and whose calls Ray retries on the new actor (``max_task_retries=-1``): the
new actor's constructor replays the log, so workers and the driver keep their handle and only see
a call take longer.

What a restart keeps: every submitted request, every committed (latent, step), every result not yet
handed over, every lease (renewed for one lease timeout, so a worker still computing carries on) and
every worker that held a request (so its late completion is recognised). Exactly-once survives
retries because every call is safe to apply twice: a repeated submit of the same request is skipped,
a repeated completion is a counted duplicate that stores nothing, a repeated commit of a lease that
was already released is stale, and a repeated pull's first leases (whose answer was lost) go back to
the queue at the worker's next call, which declares the requests it holds (`RequestQueue._reclaim`).
The driver reads results with `results_of` and frees them with `forget` in a second call, so an
answer lost to a restart loses no result.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import ray
import torch

from spotlight.runtime.queue.log import (
    QueueLog,
    decode_request,
    decode_tensor,
    encode_request,
    encode_tensor,
    read_log,
)
from spotlight.runtime.queue.request_queue import QueueError, QueueStats, RequestQueue, _Entry

__all__ = ["DurableQueue", "DurableQueueActor", "start_durable_queue_actor"]

Method = TypeVar("Method", bound=Callable[..., Any])


def _logged(method: Method) -> Method:
    """``method`` of `RequestQueue`, made durable: what it changed is logged and synced before it returns
    (once, at the outermost call: a pull that expires leases syncs once)."""

    @functools.wraps(method)
    def durable(self: DurableQueue, *args: Any, **kwargs: Any) -> Any:
        self._depth += 1
        try:
            return method(self, *args, **kwargs)
        finally:
            self._depth -= 1
            if self._depth == 0:
                self._flush()

    return durable  # type: ignore[return-value]


class DurableQueue(RequestQueue):
    """`RequestQueue` whose state lives in the log at ``log_path`` too (module docstring); replays it if present."""

    def __init__(self, log_path: str | Path, lease_timeout_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(lease_timeout_s, clock)
        self.log_path = Path(log_path)
        self._depth = 0
        self._dirty: dict[str, tuple[_Entry, set[str]]] = {}
        records, intact = read_log(self.log_path)
        self.restarts = self._replay(records)
        self._log = QueueLog(self.log_path, intact)

    submit = _logged(RequestQueue.submit)
    pull = _logged(RequestQueue.pull)
    heartbeat = _logged(RequestQueue.heartbeat)  # it may reclaim leases (RequestQueue._reclaim)
    commit = _logged(RequestQueue.commit)
    complete = _logged(RequestQueue.complete)
    complete_many = _logged(RequestQueue.complete_many)
    release = _logged(RequestQueue.release)
    expire = _logged(RequestQueue.expire)
    cancel = _logged(RequestQueue.cancel)
    take_results = _logged(RequestQueue.take_results)

    def results_of(self, request_ids: Sequence[str]) -> dict[str, torch.Tensor]:
        """The results of the done requests among ``request_ids``, kept until `forget` (safe to ask twice)."""
        return {rid: entry.result for rid in self._known(request_ids) if (entry := self._entry(rid)).result is not None}

    def forget(self, request_ids: Sequence[str]) -> int:
        """Free the results of ``request_ids`` once the driver holds them; returns how many were freed."""
        return len(self.take_results(request_ids))

    def compact(self) -> tuple[int, int]:
        """Forget the settled requests and rewrite the log as the live state alone; (bytes before, after).

        Called at each checkpoint, when no round is open: the log then holds what is in flight (pending and
        leased requests with their committed latents, results not yet handed over) and the counters, so it is
        bounded by the work in flight, not by the run's length. The new log is written beside the old, synced,
        and renamed over it: a kill at any point leaves one complete log, the old or the new.
        """
        before = self.log_path.stat().st_size if self.log_path.exists() else 0
        self._flush()
        self.forget_settled()
        temporary = self.log_path.with_name(self.log_path.name + ".compacting")
        snapshot = QueueLog(temporary, 0)
        for entry in sorted(self._entries.values(), key=lambda entry: entry.order):
            snapshot.append({"submit": encode_request(entry.request), "order": entry.order})
            snapshot.append(self._state_record(entry, latent=True, result=True))
        snapshot.append(self._counts_record())
        snapshot.sync()
        snapshot.close()
        self._log.close()
        os.replace(temporary, self.log_path)
        directory = os.open(self.log_path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)  # the rename itself is durable
        finally:
            os.close(directory)
        self._log = QueueLog(self.log_path, self.log_path.stat().st_size)
        return before, self.log_path.stat().st_size

    def stats(self) -> QueueStats:
        return dataclasses.replace(super().stats(), restarts=self.restarts)

    def pid(self) -> int:
        """The process serving the queue (fault-injection tests kill it)."""
        return os.getpid()

    # -- the log ----------------------------------------------------------------------------------
    def _note(self, entry: _Entry, change: str) -> None:
        self._dirty.setdefault(entry.request.request_id, (entry, set()))[1].add(change)

    def _flush(self) -> None:
        """Append a record per changed request and the counters, then fsync: the call may answer now."""
        if not self._dirty:
            return
        for entry, changes in self._dirty.values():
            if "submit" in changes:
                self._log.append({"submit": encode_request(entry.request), "order": entry.order})
            record = self._state_record(entry, latent="commit" in changes, result="complete" in changes)
            if "take" in changes:
                record["taken"] = True
            self._log.append(record)
        self._log.append(self._counts_record())
        self._dirty.clear()
        self._log.sync()

    def _state_record(self, entry: _Entry, latent: bool, result: bool) -> dict[str, Any]:
        """A request's state as a log record, with its committed latent and its result when asked and present."""
        record: dict[str, Any] = {"id": entry.request.request_id, "status": entry.status, "step": entry.step,
                                  "worker": entry.worker_id, "holders": sorted(entry.holders)}
        if latent and entry.latent is not None:
            record["latent"] = encode_tensor(entry.latent)
        if result and entry.result is not None:
            record["result"] = encode_tensor(entry.result)
        return record

    def _counts_record(self) -> dict[str, Any]:
        return {"counts": self._counts, "restarts": self.restarts, "forgotten": self._forgotten,
                "forgotten_below": self._forgotten_below, "next_order": self._next_order}

    def _replay(self, records: list[dict[str, Any]]) -> int:
        """Rebuild the queue from ``records``; returns the restart count (0: a new log)."""
        restarts = -1
        for record in records:
            if "submit" in record:
                request = decode_request(record["submit"])
                self._entries[request.request_id] = _Entry(request, order=int(record["order"]))
            elif "counts" in record:
                self._counts.update(record["counts"])
                restarts = int(record["restarts"])
                self._forgotten = int(record.get("forgotten", 0))
                self._forgotten_below = record.get("forgotten_below")
                self._next_order = int(record.get("next_order", len(self._entries)))
            else:
                entry = self._entries.get(record["id"])
                if entry is None:
                    raise QueueError(f"queue log {self.log_path} changes request {record['id']!r} before submitting "
                                     "it: the file is not a queue log; move it aside to start the queue empty")
                entry.status, entry.step, entry.worker_id = record["status"], int(record["step"]), record["worker"]
                entry.holders = set(record["holders"])
                if "latent" in record:
                    entry.latent = decode_tensor(record["latent"])
                if "result" in record:
                    entry.result = decode_tensor(record["result"])
                if record.get("taken"):
                    entry.result = None
                if entry.status == "done":
                    entry.latent = None
        self._next_order = max(self._next_order, max((e.order for e in self._entries.values()), default=-1) + 1)
        expires_at = self._clock() + self.lease_timeout_s  # a live worker's leases last until it next heartbeats
        for rid, entry in self._entries.items():
            if entry.status == "leased":
                self._leases.setdefault(entry.worker_id, set()).add(rid)
                entry.expires_at = expires_at
        waiting = sorted((e for e in self._entries.values() if e.status == "pending"),
                         key=lambda e: (e.step == 0, e.order))
        self._pending = deque(entry.request.request_id for entry in waiting)  # resumed work first, as before
        return restarts + 1 if records else 0


DurableQueueActor = ray.remote(DurableQueue)


def start_durable_queue_actor(log_path: str | Path, lease_timeout_s: float = 10.0,
                              resource: str | None = "on_demand") -> Any:
    """Start a `DurableQueue` actor logging to ``log_path`` that Ray restarts (replaying the log) when it dies.

    Pinned to a node offering ``resource`` like `spotlight.runtime.queue.remote.start_queue_actor`; the log must
    be on that node's disk (the on-demand node: the driver's, where the run directory is).
    """
    options: dict[str, Any] = {"num_cpus": 0, "max_concurrency": 1, "max_restarts": -1, "max_task_retries": -1}
    if resource is not None:
        if ray.cluster_resources().get(resource, 0) <= 0:
            raise QueueError(f"no Ray node offers the resource {resource!r} to pin the queue to: start the "
                             f"on-demand node with resources={{{resource!r}: 1}}, or pass resource=None")
        options["resources"] = {resource: 0.001}
    return DurableQueueActor.options(**options).remote(str(log_path), lease_timeout_s=lease_timeout_s)
