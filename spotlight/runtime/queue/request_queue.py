"""The pull-based, preemption-aware request queue: leases, commits on preemption, exactly-once results.

A request (prompt, seed, plan) moves through three states::

    pending ──pull──▶ leased(worker, expiry, committed latent & step) ──complete──▶ done(result)
       ▲                 │
       └──commit/expire──┘   (back to pending, keeping the committed (latent, step))

Workers *pull* as much as they can carry, so a fast or big worker takes more and a slow one never
holds work it cannot start. A lease lives while its worker heartbeats (a pull or a heartbeat extends
all of that worker's leases). On a preemption notice a worker commits each in-flight request's
(latent, step) and the request goes back to the front of the queue, so the next worker resumes it at
that step: the sampler draws step k's noise from stream (seed, k), so the resumed sample is
bit-identical to an uninterrupted one. A worker that vanishes without notice stops heartbeating; its
leases expire and go back from their last committed step (or from scratch).

One policy per request: a request names the weights version it must be denoised with
(``weights_version``, the iteration i of θ_i). A worker declares the version it holds on every pull,
commit and completion; it is leased only requests of that version, and a commit or completion
stamped with another version is refused and the request goes back to the queue. So a device still
holding θ_v after its round was cancelled can never serve (nor finish) a request of θ_{v+1}.

Exactly once: the first completion of a request is kept and every later one (from a worker whose
lease had expired and whose request was re-leased) is ignored and counted, never overwrites it.
A commit from a worker that no longer holds the lease is stale and rejected, so an old worker cannot
roll a request back.

`RequestQueue` is a plain class with an injectable clock, so every rule above is unit-tested without
Ray; `spotlight.runtime.queue.remote` runs it as one Ray actor pinned to the on-demand node, whose
calls Ray serialises (so the class needs no locks), and gives workers the same blocking interface over
the actor handle that the plain class offers in-process. Every change of a request passes
through `RequestQueue._note`, which `spotlight.runtime.queue.durable` writes to a write-ahead log so
that a restarted queue actor rebuilds its state.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch

from spotlight.diffusion.sampler import SamplingPlan

__all__ = [
    "Lease",
    "QueueError",
    "QueueStats",
    "Request",
    "RequestQueue",
]

Status = Literal["pending", "leased", "done"]


class QueueError(RuntimeError):
    """A call that breaks the queue's protocol; the message names the request, the worker and the fix."""


@dataclass(frozen=True)
class Request:
    """One sample to denoise: a pure function of (θ_weights_version, prompt, seed, plan)."""

    request_id: str
    prompt: str
    seed: int
    plan: SamplingPlan
    weights_version: int  # the iteration i of the θ_i it must be denoised with; no other weights may serve it


@dataclass(frozen=True)
class Lease:
    """A request handed to ``worker_id`` until ``expires_at`` (queue clock, seconds).

    ``step`` is the committed schedule index to resume from and ``latent`` (C, H, W) the latent at
    that step; ``latent is None`` (with ``step == 0``) means start from the seed's initial noise.
    """

    request: Request
    worker_id: str
    step: int
    latent: torch.Tensor | None
    expires_at: float


@dataclass(frozen=True)
class QueueStats:
    """Counts of the queue's states and events, and the time the queue spends serving a pull.

    ``resumed``: leases granted from a committed step > 0 (work some other worker had done).
    ``stale_commits``: commits from a worker that no longer held the lease (rejected).
    ``duplicate_completions``: completions of a request already done (ignored, never stored).
    ``late_completions``: first completions that came from a worker whose lease had lapsed (kept).
    ``cancelled``: requests dropped by `RequestQueue.cancel` before they were done.
    ``wrong_weights``: commits and completions refused because the worker held other weights than
    the request's (the request went back to the queue).
    ``mean_pull_s`` / ``max_pull_s``: service time of ``pull`` inside the queue (wall clock); a
    worker's round trip adds the RPC on top. ``restarts``: times a durable queue rebuilt itself from its log.
    ``reclaimed``: leases a worker held without knowing it (granted by a pull whose answer was lost to a
    queue restart and retried), sent back to the queue when the worker's next call declared what it holds.
    ``forgotten_calls``: late commits and completions of requests `RequestQueue.forget_settled` had dropped
    (settled long before: ignored, never stored).
    """

    submitted: int
    pending: int
    leased: int
    done: int
    pulls: int
    leases_granted: int
    resumed: int
    commits: int
    checkpoints: int
    stale_commits: int
    duplicate_completions: int
    late_completions: int
    expirations: int
    cancelled: int
    wrong_weights: int
    mean_pull_s: float
    max_pull_s: float
    restarts: int = 0
    reclaimed: int = 0
    forgotten_calls: int = 0


@dataclass
class _Entry:
    """The queue's mutable record of one request."""

    request: Request
    order: int  # submission index: fixes the order of requests that expire together
    status: Status = "pending"
    step: int = 0
    latent: torch.Tensor | None = None
    worker_id: str | None = None
    expires_at: float = 0.0
    holders: set[str] = field(default_factory=set)
    result: torch.Tensor | None = None


def _cpu_copy(tensor: torch.Tensor) -> torch.Tensor:
    """A compact CPU copy: a view would otherwise drag its whole storage across Ray with it."""
    return tensor.detach().to("cpu", copy=True).contiguous()


class RequestQueue:
    """The request queue (see the module docstring); every method is one atomic step.

    ``lease_timeout_s``: how long a lease lives after its worker's last pull or heartbeat; it must
    exceed the longest gap between a worker's heartbeats (one denoising step plus slack), or live
    workers lose leases and redo work. ``clock``: seconds, monotonic; injectable for tests.
    """

    def __init__(self, lease_timeout_s: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        if not lease_timeout_s > 0:
            raise QueueError(f"lease_timeout_s must be > 0 seconds (got {lease_timeout_s})")
        self.lease_timeout_s = float(lease_timeout_s)
        self._clock = clock
        self._entries: dict[str, _Entry] = {}
        self._pending: deque[str] = deque()  # may hold ids completed while pending; pull skips them
        self._leases: dict[str, set[str]] = {}  # worker_id -> request ids it holds
        self._pull_seconds: list[float] = []
        self._next_order = 0  # submission order; not len(_entries), which `forget_settled` shrinks
        # every request forgotten by `forget_settled` was made for a weights version below this
        self._forgotten_below: int | None = None
        self._forgotten = 0
        self._counts = dict.fromkeys(
            ("leases_granted", "resumed", "commits", "checkpoints", "stale_commits", "duplicate_completions",
             "late_completions", "expirations", "cancelled", "wrong_weights", "reclaimed", "forgotten_calls"),
            0,
        )

    # -- producer side -------------------------------------------------------------------------
    def submit(self, requests: Sequence[Request]) -> int:
        """Queue ``requests`` in order; returns how many were new. A request identical to one already
        submitted is skipped (a retried call after a queue restart); another request under a used id is refused."""
        for request in requests:
            known = self._entries.get(request.request_id)
            if known is not None and known.request != request:
                raise QueueError(f"request id {request.request_id!r} was already submitted for another request: "
                                 "give every request a unique id")
        new = [request for request in requests if request.request_id not in self._entries]
        for request in new:
            self._entries[request.request_id] = entry = _Entry(request, order=self._next_order)
            self._next_order += 1
            self._pending.append(request.request_id)
            self._note(entry, "submit")
        return len(new)

    def results(self) -> dict[str, torch.Tensor]:
        """The result of every done request, by request id (each stored exactly once)."""
        return {rid: entry.result for rid, entry in self._entries.items() if entry.result is not None}

    def remaining(self, weights_version: int | None = None) -> int:
        """How many submitted requests are not done yet (pending or leased); of ``weights_version`` only
        when given (what a worker holding those weights could still serve)."""
        return sum(1 for entry in self._entries.values() if entry.status != "done"
                   and (weights_version is None or entry.request.weights_version == weights_version))

    def take_results(self, request_ids: Sequence[str]) -> dict[str, torch.Tensor]:
        """Hand over the results of the done requests among ``request_ids`` and free their memory.

        A long run submits thousands of requests; keeping every latent would grow the queue actor
        without bound. The entries stay (done, without a result), so a late duplicate completion
        is still recognised and ignored rather than mistaken for an unknown request.
        """
        taken = {}
        for request_id in self._known(request_ids):
            entry = self._entry(request_id)
            if entry.result is not None:
                taken[request_id], entry.result = entry.result, None
                self._note(entry, "take")
        return taken

    def cancel(self, request_ids: Sequence[str]) -> int:
        """Drop the requests among ``request_ids`` that are not done yet; returns how many.

        For work that is no longer wanted (exploration that could not finish before its iteration
        needed it). A cancelled request counts as done without a result: a worker still holding it
        has its commit rejected as stale and its completion ignored as a duplicate, so nothing of
        it is ever stored and exactly-once holds for every request that was not cancelled.
        """
        cancelled = 0
        for request_id in self._known(request_ids):
            entry = self._entry(request_id)
            if entry.status == "done":
                continue
            if entry.status == "leased":
                self._leases[entry.worker_id].discard(request_id)
            entry.status, entry.worker_id, entry.latent = "done", None, None
            self._note(entry, "cancel")
            cancelled += 1
        self._counts["cancelled"] += cancelled
        return cancelled

    def forget_settled(self) -> int:
        """Drop every request that is settled: done (completed or cancelled) with its result handed over.

        What keeps a long run's queue, and its log, bounded by the work in flight rather than by every
        request ever made. Exactly-once still holds for them: a request is leased only to a worker holding
        its weights version, so a late commit or completion of a forgotten request comes with a version
        below `_forgotten_below` and is ignored (counted in ``forgotten_calls``), never stored. Returns how
        many were forgotten.
        """
        settled = [rid for rid, entry in self._entries.items() if entry.status == "done" and entry.result is None]
        if not settled:
            return 0
        newest = max(self._entries[rid].request.weights_version for rid in settled)
        self._forgotten_below = max(newest + 1, self._forgotten_below or newest + 1)
        for rid in settled:
            del self._entries[rid]
        # a request cancelled while pending is settled but still has its place in line: drop the place too
        self._pending = deque(rid for rid in self._pending if rid in self._entries)
        self._forgotten += len(settled)
        return len(settled)

    def _known(self, request_ids: Sequence[str]) -> list[str]:
        """``request_ids`` less those `forget_settled` may have dropped (settled already: nothing to take or
        cancel); before anything was forgotten every id must be known, and an unknown one is refused."""
        return [rid for rid in request_ids if rid in self._entries or not self._forgotten]

    def _forgotten_call(self, request_id: str, weights_version: int) -> bool:
        """Whether a call names a request `forget_settled` dropped (it is counted and ignored)."""
        if request_id in self._entries or self._forgotten_below is None or weights_version >= self._forgotten_below:
            return False
        self._counts["forgotten_calls"] += 1
        return True

    def leases_by_worker(self) -> dict[str, int]:
        """How many leases each worker holds now (workers with none are left out)."""
        return {worker: len(ids) for worker, ids in self._leases.items() if ids}

    # -- worker side ---------------------------------------------------------------------------
    def pull(
        self, worker_id: str, max_requests: int, weights_version: int, holding: Sequence[str] | None = None
    ) -> list[Lease]:
        """Lease up to ``max_requests`` pending requests of ``weights_version`` to ``worker_id``, resumed ones first.

        Returns the leases (possibly none); requests of other versions keep their place in the queue
        for workers that hold their weights. Overdue leases are expired first, so idle workers
        reclaim a vanished worker's requests without a separate timer; the pull also counts as a
        heartbeat for the worker's other leases. ``holding``: the request ids the worker has in
        flight (see `_reclaim`; None trusts the leases as they stand).
        """
        started = time.perf_counter()
        if max_requests < 0:
            raise QueueError(f"pull(max_requests={max_requests}) must be ≥ 0")
        self._reclaim(worker_id, holding)
        now = self._clock()
        self.expire(now)
        expires_at = now + self.lease_timeout_s
        held = self._leases.setdefault(worker_id, set())
        for request_id in held:
            self._entries[request_id].expires_at = expires_at
        leases, other_weights = [], []
        while self._pending and len(leases) < max_requests:
            entry = self._entries[self._pending.popleft()]
            if entry.status != "pending":  # completed by a lapsed worker while it waited here
                continue
            if entry.request.weights_version != weights_version:
                other_weights.append(entry.request.request_id)
                continue
            entry.status, entry.worker_id, entry.expires_at = "leased", worker_id, expires_at
            entry.holders.add(worker_id)
            held.add(entry.request.request_id)
            self._note(entry, "lease")
            self._counts["leases_granted"] += 1
            self._counts["resumed"] += entry.step > 0
            leases.append(Lease(entry.request, worker_id, entry.step, entry.latent, expires_at))
        self._pending.extendleft(reversed(other_weights))  # back in their places, in order
        self._pull_seconds.append(time.perf_counter() - started)
        return leases

    def heartbeat(self, worker_id: str, holding: Sequence[str] | None = None) -> list[str]:
        """Extend every lease ``worker_id`` holds; returns the ids it still holds.

        A worker drops in-flight requests missing from the answer: their leases lapsed and they
        now belong to the queue again (or to another worker). ``holding``: as for `pull`.
        """
        self._reclaim(worker_id, holding)
        expires_at = self._clock() + self.lease_timeout_s
        held = self._leases.get(worker_id, set())
        for request_id in held:
            self._entries[request_id].expires_at = expires_at
        return sorted(held)

    def commit(
        self, worker_id: str, request_id: str, latent: torch.Tensor, step: int, weights_version: int,
        keep_lease: bool = False,
    ) -> bool:
        """Store ``latent`` (C, H, W), made with θ_weights_version, as the request's progress at index ``step``.

        With ``keep_lease=False`` (a preemption notice) the request goes back to the front of the
        queue to be resumed at ``step``; with ``keep_lease=True`` (a checkpoint) the worker keeps
        going and a later expiry resumes from here rather than from scratch. Returns False, and
        changes nothing, when ``worker_id`` no longer holds the lease (a stale commit); returns False
        and sends the request back to the queue when the latent was made with other weights than the request's.
        """
        if self._forgotten_call(request_id, weights_version):
            return False
        entry = self._entry(request_id)
        if entry.status != "leased" or entry.worker_id != worker_id:
            self._counts["stale_commits"] += 1
            return False
        if self._wrong_weights(entry, weights_version):
            return False
        num_steps = entry.request.plan.num_steps
        if not entry.step <= step < num_steps:
            raise QueueError(
                f"worker {worker_id} committed request {request_id} at step {step}, outside "
                f"[{entry.step}, {num_steps}) (its last committed step, the plan's steps): "
                "commit the step reached, and call complete() once all steps are done"
            )
        entry.latent, entry.step = _cpu_copy(latent), int(step)
        if keep_lease:
            entry.expires_at = self._clock() + self.lease_timeout_s
            self._counts["checkpoints"] += 1
        else:
            self._release(entry)
            self._counts["commits"] += 1
        self._note(entry, "commit")
        return True

    def complete(self, worker_id: str, request_id: str, result: torch.Tensor, weights_version: int) -> bool:
        """Record ``result``, made with θ_weights_version, as the request's final output; returns whether it was kept.

        A result made with other weights than the request's is refused (False) and the request goes
        back to the queue from its last committed step. Otherwise the first completion wins, even from
        a worker whose lease has lapsed (results are a pure
        function of the request, so it is the same result, and the work is not wasted); a later
        completion returns False and is counted, never stored.
        """
        if self._forgotten_call(request_id, weights_version):
            return False
        entry = self._entry(request_id)
        if worker_id not in entry.holders:
            raise QueueError(
                f"worker {worker_id} completed request {request_id} without ever leasing it: "
                "complete only requests handed out by pull()"
            )
        if entry.status == "done":
            self._counts["duplicate_completions"] += 1
            return False
        if self._wrong_weights(entry, weights_version):
            return False
        if entry.status == "leased":
            if entry.worker_id != worker_id:
                self._counts["late_completions"] += 1
            self._leases[entry.worker_id].discard(request_id)
        else:
            self._counts["late_completions"] += 1
        entry.status, entry.worker_id, entry.latent = "done", None, None
        entry.result = _cpu_copy(result)
        self._note(entry, "complete")
        return True

    def release(self, worker_id: str) -> list[str]:
        """Send every lease ``worker_id`` holds back to pending now; returns their ids.

        For a worker known to be gone (its node died): its requests resume from their last committed
        (latent, step) at once instead of after the lease timeout. Should the worker still be alive,
        its later commits are stale and rejected, and its completion is kept only if it comes first,
        so exactly-once holds either way.
        """
        held = sorted((self._entries[rid] for rid in self._leases.get(worker_id, ())), key=lambda e: e.order)
        for entry in reversed(held):  # appendleft in reverse: they go first, in submission order
            self._release(entry)
        return [entry.request.request_id for entry in held]

    def complete_many(
        self, worker_id: str, results: Sequence[tuple[str, torch.Tensor]], weights_version: int
    ) -> list[bool]:
        """`complete` for several requests made with θ_weights_version at once; returns whether each was kept.

        One call per denoising pass instead of one per request: over Ray each call is a round trip
        that the device spends waiting instead of computing.
        """
        return [self.complete(worker_id, request_id, result, weights_version) for request_id, result in results]

    def expire(self, now: float | None = None) -> list[str]:
        """Send leases overdue at ``now`` (default: the clock) back to pending; returns their ids.

        They resume from their last committed (latent, step), or from the seed if none.
        """
        now = self._clock() if now is None else now
        expired = [
            entry for ids in self._leases.values() for rid in ids
            if (entry := self._entries[rid]).expires_at <= now
        ]
        expired.sort(key=lambda entry: entry.order)
        self._release_first(expired)
        self._counts["expirations"] += len(expired)
        return [entry.request.request_id for entry in expired]

    def stats(self) -> QueueStats:
        """A snapshot of the counts (see `QueueStats`)."""
        statuses = [entry.status for entry in self._entries.values()]
        pulls = self._pull_seconds
        return QueueStats(
            submitted=len(statuses) + self._forgotten, pending=statuses.count("pending"),
            leased=statuses.count("leased"), done=statuses.count("done") + self._forgotten, pulls=len(pulls),
            mean_pull_s=sum(pulls) / len(pulls) if pulls else 0.0,
            max_pull_s=max(pulls, default=0.0), **self._counts,
        )

    # -- internals -----------------------------------------------------------------------------
    def _entry(self, request_id: str) -> _Entry:
        entry = self._entries.get(request_id)
        if entry is None:
            raise QueueError(f"unknown request id {request_id!r}: it was never submitted to this queue")
        return entry

    def _wrong_weights(self, entry: _Entry, weights_version: int) -> bool:
        """Whether work on ``entry`` was done with other weights than its request's; if so it is counted
        and, when leased, the request goes back to the front of the queue for a worker holding the right ones."""
        if weights_version == entry.request.weights_version:
            return False
        self._counts["wrong_weights"] += 1
        if entry.status == "leased":
            self._release(entry)
        return True

    def _reclaim(self, worker_id: str, holding: Sequence[str] | None) -> None:
        """Send back to the queue the leases of ``worker_id`` that are not among ``holding`` (its in-flight ids).

        Such leases exist when a pull was applied but its answer never reached the worker (the queue
        actor died before replying, and Ray retried the call on the restarted actor, which leased
        again). Left alone they would never lapse: every later pull and heartbeat of the same worker
        extends them, so the round would wait forever on requests nobody computes. The worker's
        calls are sequential, so what it declares is exactly what it computes.
        """
        if holding is None:
            return
        declared = set(holding)
        orphans = [self._entries[rid] for rid in self._leases.get(worker_id, ()) if rid not in declared]
        self._release_first(orphans)
        self._counts["reclaimed"] += len(orphans)

    def _release_first(self, entries: Sequence[_Entry]) -> None:
        """Release ``entries`` to the front of the queue, in submission order (resumed work goes first)."""
        for entry in sorted(entries, key=lambda entry: entry.order, reverse=True):  # appendleft in reverse
            self._release(entry)

    def _release(self, entry: _Entry) -> None:
        """Leased -> pending, keeping the committed state; resumed work goes first."""
        self._leases[entry.worker_id].discard(entry.request.request_id)
        entry.status, entry.worker_id = "pending", None
        self._pending.appendleft(entry.request.request_id)
        self._note(entry, "release")

    def _note(self, entry: _Entry, change: str) -> None:
        """Hook: ``entry`` just changed (``change`` says how); a durable queue logs it, this one keeps nothing."""
