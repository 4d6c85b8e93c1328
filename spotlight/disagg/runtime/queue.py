"""The disaggregated pipeline's unit queue: generators pull units, the trainer takes results (and units, for TAG).

Pull, not push: a generator asks for its next unit the moment it finishes one, so it never waits for
the trainer (which is busy training a group when a push scheduler would have to hand out work). The
queue holds:

- the published weights, one ``ObjectRef`` per version, the newest ``max_lag + 1`` under the version
  gate (`spotlight.disagg.versions.VersionGate`);
- unstarted tasks in submission order: rollout units (step s's, and with one-step asynchrony step
  s+1's, which may start with θ_s) and, behind them, exploration tasks (Spotlight's stale-seed
  exploration of step s+1 with the newest weights, served only when no unit is eligible);
- finished results until the trainer drains them.

A unit is served with the NEWEST version the gate allows for its step: θ_s for step s once it is
published, θ_{s-1} for step s before it is (asynchrony on), nothing before that (off: the generator
waits). The generator loads weights only between tasks, so each trajectory has one version.

`UnitQueue` is plain Python (tests drive it directly); the backend runs it as a threaded Ray actor,
where ``pull`` and ``results`` block on a condition variable instead of being polled.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from spotlight.disagg.versions import VersionGate

__all__ = ["Task", "UnitQueue"]


@dataclass(frozen=True)
class Task:
    """One unit of work: ``kind`` "rollout" (members (prompt, sample) of step ``step``'s batch) or "explore"
    (candidates of one prompt of step ``step``); ``payload`` is what the generator needs to run it."""

    kind: str
    step: int
    index: int
    payload: dict[str, Any] = field(default_factory=dict)


class UnitQueue:
    """Tasks, published weights and results of the disaggregated pipeline (see the module docstring)."""

    def __init__(self, gate: VersionGate) -> None:
        self.gate = gate
        self._weights: dict[int, Any] = {}
        self._tasks: deque[Task] = deque()
        self._results: list[dict[str, Any]] = []
        self._busy_since: dict[str, float] = {}  # generator → when it pulled the task it is running
        self._closed = False
        self._changed = threading.Condition()

    def reopen(self, gate: VersionGate) -> None:
        """Empty and open again for another run under ``gate`` (a lent cluster keeps its queue between runs)."""
        with self._changed:
            self.gate = gate
            self._weights.clear()
            self._tasks.clear()
            self._results.clear()
            self._busy_since.clear()
            self._closed = False

    def publish(self, version: int, weights: list[Any]) -> None:
        """θ_version is out (``weights``: a one-element list, so Ray keeps the ref a ref); older versions go."""
        with self._changed:
            self._weights[version] = weights[0]
            for old in [v for v in self._weights if v < version - self.gate.max_lag]:
                del self._weights[old]
            self._changed.notify_all()

    def submit(self, tasks: list[Task]) -> None:
        with self._changed:
            self._tasks.extend(tasks)
            self._changed.notify_all()

    def _eligible(self) -> tuple[Task, int] | None:
        if not self._weights:
            return None
        newest = max(self._weights)
        for task in self._tasks:  # rollout units first, in order; exploration only when no unit may start
            if task.kind != "rollout":
                continue
            allowed = [v for v in self._weights if self.gate.may_start(task.step, v)]
            if allowed:
                return task, max(allowed)
            break  # a later step's unit must not overtake an earlier one that waits for its weights
        for task in self._tasks:
            if task.kind == "explore":
                return task, newest
        return None

    def pull(self, generator: str, timeout_s: float) -> tuple[Task, int, list[Any]] | str | None:
        """The next task with the version to run it with and that version's weights; "stop" once closed,
        None if nothing became eligible within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            self._busy_since.pop(generator, None)
            while True:
                if self._closed:
                    return "stop"
                found = self._eligible()
                if found is not None:
                    task, version = found
                    self._tasks.remove(task)
                    self._busy_since[generator] = time.time()
                    return task, version, [self._weights[version]]
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._changed.wait(left)

    def push(self, generator: str, result: dict[str, Any]) -> None:
        """A finished task's result (the generator is free again once it pulls)."""
        with self._changed:
            self._busy_since.pop(generator, None)
            self._results.append(result)
            self._changed.notify_all()

    def take(self, step: int, count: int) -> list[Task]:
        """Up to ``count`` unstarted units of step ``step``, removed from the queue (TAG: the trainer draws them)."""
        with self._changed:
            taken = [task for task in self._tasks if task.kind == "rollout" and task.step == step][:count]
            for task in taken:
                self._tasks.remove(task)
            return taken

    def cancel_explore(self, step: int) -> int:
        """Drop the unstarted exploration tasks of ``step`` (its seeds are being chosen now); how many went."""
        with self._changed:
            dropped = [task for task in self._tasks if task.kind == "explore" and task.step == step]
            for task in dropped:
                self._tasks.remove(task)
            return len(dropped)

    def results(self, timeout_s: float) -> dict[str, Any]:
        """Every result pushed since the last call (waiting up to ``timeout_s`` for one), with the queue's state:
        unstarted units per step, and for each busy generator the wall time it started its task."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while not self._results and not self._closed:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._changed.wait(left)
            results, self._results = self._results, []
            unstarted: dict[int, int] = {}
            for task in self._tasks:
                if task.kind == "rollout":
                    unstarted[task.step] = unstarted.get(task.step, 0) + 1
            return {"results": results, "unstarted": unstarted, "busy_since": dict(self._busy_since),
                    "now": time.time()}

    def close(self) -> None:
        with self._changed:
            self._closed = True
            self._changed.notify_all()
