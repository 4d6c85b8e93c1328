"""Spot availability traces: how many spot nodes are live over time, and which ones come and go.

`Availability` is the one timeline type. Its source of truth is the list of per-node events
(`add` / `remove`); the step function `times_s` / `counts` is derived from them, so the two can
never disagree. Time runs from 0 (the first line of the source) to `duration_s`.

Sources: the real Bamboo traces (`load_trace`, format sniffed from the content) and two seeded
synthetic generators (`poisson_trace`, `diurnal_trace`). Transforms (`scaled`, `window`, `clipped`)
return new traces, so a multi-hour cloud trace can drive a few local logical nodes for minutes.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Literal, overload

import numpy as np

EventKind = Literal["add", "remove"]

EVENT_FORMAT = "'milliseconds,add|remove,nodeN'"
SAMPLE_FORMAT = "'date, time, available_nodes' (e.g. '2021-12-11, 11:11:30, 55')"
TRACE_DIR = Path(__file__).resolve().parents[1] / "assets" / "traces"  # shipped with the package

_INTEGER = re.compile(r"\d+")
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
_NODE_NAME = re.compile(r"[^\s,]+")


class TraceError(ValueError):
    """A trace file that cannot be read; the message names the file, the line and the fix."""


@dataclass(frozen=True)
class NodeEvent:
    """One spot node joining (`add`) or being preempted (`remove`) at `time_s` seconds."""

    time_s: float
    kind: EventKind
    node: str


@dataclass(frozen=True, eq=False)
class Availability:
    """A timeline of live spot nodes over [0, duration_s].

    `events` are sorted by time on construction (stable, so same-time events keep their order).
    `times_s` (K,) and `counts` (K,) are derived: the live count is `counts[k]` from `times_s[k]`
    up to the next change point, and 0 before `times_s[0]`. Both arrays are read-only.
    """

    events: tuple[NodeEvent, ...]
    duration_s: float
    times_s: np.ndarray = field(init=False, repr=False)
    counts: np.ndarray = field(init=False, repr=False)
    _event_times: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        events = tuple(sorted(self.events, key=lambda event: event.time_s))
        _check_events(events)
        last = events[-1].time_s if events else 0.0
        if not (math.isfinite(self.duration_s) and self.duration_s >= last):
            raise ValueError(
                f"Availability.duration_s must be finite and ≥ the last event time ({last} s), "
                f"got {self.duration_s}"
            )
        times_s, counts = _step_function(events)
        event_times = np.array([event.time_s for event in events], dtype=np.float64)
        for array in (times_s, counts, event_times):
            array.setflags(write=False)
        object.__setattr__(self, "events", events)
        object.__setattr__(self, "duration_s", float(self.duration_s))
        object.__setattr__(self, "times_s", times_s)
        object.__setattr__(self, "counts", counts)
        object.__setattr__(self, "_event_times", event_times)

    @overload
    def count_at(self, t: float) -> int: ...
    @overload
    def count_at(self, t: np.ndarray) -> np.ndarray: ...

    def count_at(self, t: float | np.ndarray) -> int | np.ndarray:
        """Return the number of live nodes at time `t` (seconds): an int, or an int array for an array.

        Events at exactly `t` count as done. Before the first event the count is 0; after
        `duration_s` it stays at its last value, so a run longer than the trace sees no new churn.
        """
        index = np.searchsorted(self.times_s, t, side="right") - 1
        counts = np.where(index >= 0, self.counts[np.maximum(index, 0)] if len(self.counts) else 0, 0)
        return int(counts) if np.ndim(t) == 0 else counts

    def events_between(self, t0: float, t1: float) -> tuple[NodeEvent, ...]:
        """Return the events with t0 ≤ time < t1, in trace order.

        Half-open so that consecutive ticks [0, dt), [dt, 2dt), … of a replayer see every event once.
        """
        start, stop = np.searchsorted(self._event_times, [t0, t1], side="left")
        return self.events[start:stop]

    @property
    def mean_count(self) -> float:
        """Return the time-weighted mean number of live nodes over [0, duration_s]."""
        if self.duration_s == 0.0:
            return float(self.count_at(0.0))
        edges = np.append(self.times_s, self.duration_s)
        return float(np.sum(self.counts * np.diff(edges)) / self.duration_s)

    @property
    def preemption_count(self) -> int:
        """Return the number of `remove` events (every removal of a spot node is a preemption)."""
        return sum(1 for event in self.events if event.kind == "remove")

    def scaled(self, time_scale: float) -> Availability:
        """Return the trace with every time multiplied by `time_scale` (> 0).

        `time_scale=1/60` replays an hour of cloud time in a minute; counts, order and the number
        of preemptions are unchanged, so `mean_count` is too.
        """
        if not (math.isfinite(time_scale) and time_scale > 0):
            raise ValueError(f"time_scale must be a finite number > 0, got {time_scale}")
        return Availability(
            tuple(NodeEvent(e.time_s * time_scale, e.kind, e.node) for e in self.events),
            self.duration_s * time_scale,
        )

    def window(self, t0: float, t1: float) -> Availability:
        """Return the part of the trace in [t0, t1), shifted so that t0 becomes 0.

        Nodes live just before t0 appear as `add` events at 0, oldest first, so the window is a
        complete trace on its own: `window(t0, t1).count_at(t - t0) == count_at(t)`.
        """
        if not (0.0 <= t0 < t1 <= self.duration_s):
            raise ValueError(f"window needs 0 ≤ t0 < t1 ≤ duration_s = {self.duration_s}, got [{t0}, {t1})")
        start, stop = np.searchsorted(self._event_times, [t0, t1], side="left")
        live = _live_nodes(self.events[:start])
        opening = [NodeEvent(0.0, "add", node) for node in live]
        inside = [NodeEvent(e.time_s - t0, e.kind, e.node) for e in self.events[start:stop]]
        return Availability(tuple(opening + inside), t1 - t0)

    def clipped(self, max_nodes: int) -> Availability:
        """Return the trace mapped onto `max_nodes` logical nodes named node0 … node{max_nodes-1}.

        Each logical node follows one real node at a time. A real node that joins takes the lowest
        free logical node, or is never seen if all are taken. When the real node behind a logical
        node is preempted, the logical node goes down until the next real node joins. So logical
        nodes live the real per-node lifetimes and wait the real time for a replacement, and the
        live count is at most min(count, max_nodes). Clipping the count alone would not do: a
        32-node trace clipped to 3 would almost never drop below 3, so nothing would be preempted.
        """
        if max_nodes < 1:
            raise ValueError(f"max_nodes must be ≥ 1, got {max_nodes}")
        free = list(range(max_nodes))
        slot_of: dict[str, int] = {}
        logical: list[NodeEvent] = []
        for event in self.events:
            if event.kind == "add" and free:
                slot = min(free)
                free.remove(slot)
                slot_of[event.node] = slot
                logical.append(NodeEvent(event.time_s, "add", f"node{slot}"))
            elif event.kind == "remove" and event.node in slot_of:
                slot = slot_of.pop(event.node)
                free.append(slot)
                logical.append(NodeEvent(event.time_s, "remove", f"node{slot}"))
        return Availability(tuple(logical), self.duration_s)


def _check_events(events: tuple[NodeEvent, ...]) -> None:
    """Raise ValueError unless every event has a finite time ≥ 0 and adds/removes a node consistently."""
    live: set[str] = set()
    for index, event in enumerate(events):
        if event.kind not in ("add", "remove"):
            raise ValueError(f"event {index}: kind must be 'add' or 'remove', got {event.kind!r}")
        if not (math.isfinite(event.time_s) and event.time_s >= 0):
            raise ValueError(f"event {index}: time_s must be finite and ≥ 0, got {event.time_s}")
        if event.kind == "add":
            if event.node in live:
                raise ValueError(f"event {index}: adds {event.node} at {event.time_s} s; it is already live")
            live.add(event.node)
        else:
            if event.node not in live:
                raise ValueError(f"event {index}: removes {event.node} at {event.time_s} s; it is not live")
            live.remove(event.node)


def _step_function(events: tuple[NodeEvent, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Return (times_s, counts): the live count after all events at each time where it changes."""
    times: list[float] = []
    counts: list[int] = []
    count = 0
    for index, event in enumerate(events):
        count += 1 if event.kind == "add" else -1
        is_last_at_this_time = index + 1 == len(events) or events[index + 1].time_s != event.time_s
        if is_last_at_this_time and count != (counts[-1] if counts else 0):
            times.append(event.time_s)
            counts.append(count)
    return np.array(times, dtype=np.float64), np.array(counts, dtype=np.int64)


def _live_nodes(events: Iterable[NodeEvent]) -> list[str]:
    """Return the nodes live after `events`, in the order they were added."""
    live: dict[str, None] = {}
    for event in events:
        if event.kind == "add":
            live[event.node] = None
        else:
            live.pop(event.node, None)
    return list(live)


# ---------------------------------------------------------------------------------------------
# Files


def default_trace_dir() -> Path:
    """Return the folder of the real spot traces shipped inside the package (`spotlight/assets/traces`).

    They ship with the code (with their licence) so that a fresh install replays them with nothing
    beside it; a user's own trace is a path (`find_trace`).
    """
    return TRACE_DIR


def find_trace(name: str | os.PathLike[str]) -> Path:
    """Return the trace file ``name``: a path as given if it exists, else a file of the shipped traces.

    Raises TraceError naming both places and the shipped files, so a typo is one line to fix.
    """
    path = Path(name)
    if path.is_file():
        return path
    shipped = TRACE_DIR / path.name
    if path.name == str(name) and shipped.is_file():
        return shipped
    names = ", ".join(sorted(p.name for p in TRACE_DIR.iterdir() if p.suffix in (".csv", ".txt")))
    raise TraceError(f"trace {str(name)!r}: no such file, and not one of the shipped traces ({names}); "
                     "give a path to your own trace or one of those names")


def resolve_trace(name: str, setting: str) -> Availability:
    """Return the Availability of the trace a config ``setting`` names: a path, or a shipped trace's name.

    A missing trace is a TraceError that starts with the setting (e.g. ``runtime.trace``), so the
    user knows which line of which config to fix.
    """
    try:
        path = find_trace(name)
    except TraceError as error:
        raise TraceError(f"{setting}: {error}") from None
    return load_trace(path)


def load_trace(path: str | os.PathLike[str], *, seed: int = 0) -> Availability:
    """Return the Availability recorded in a trace file, its format sniffed from the first line.

    Two formats (blank lines and lines starting with '#' are skipped; times are shifted so the
    first line is t = 0):
    - events, `milliseconds,add|remove,nodeN`, one node event a line (AWS p3 Bamboo trace);
    - samples, `date, time, available_nodes`, the live count at that moment (GCP Bamboo trace).
      Samples carry no node names, so events are derived: the first sample adds that many nodes,
      a rise of k adds k new nodes, and a drop of k removes k live nodes drawn uniformly with
      `seed`. Uniform, not last-in-first-out, because in the AWS event trace the preempted node's
      age rank among live nodes is flat (mean 0.52 over 167 removals); LIFO would also leave the
      oldest nodes immortal, so `clipped` traces of it would never preempt anything.
    Raises TraceError with `file:line: what was wrong; expected …, got …`.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TraceError(f"{path}: no such trace file; check the path") from None
    except UnicodeDecodeError:
        raise TraceError(
            f"{path}: not a UTF-8 text file; expected lines of {EVENT_FORMAT} or {SAMPLE_FORMAT}"
        ) from None
    lines = [
        (number, line.strip())
        for number, line in enumerate(text.splitlines(), start=1)
        if line.strip() and not line.lstrip().startswith("#")
    ]
    if not lines:
        raise TraceError(f"{path}: empty trace; expected lines of {EVENT_FORMAT} or {SAMPLE_FORMAT}")
    number, first = lines[0]
    fields = [part.strip() for part in first.split(",")]
    if len(fields) >= 2 and _INTEGER.fullmatch(fields[0]) and fields[1] in ("add", "remove"):
        return _parse_events(path, lines)
    if _DATE.fullmatch(fields[0]):
        return _parse_samples(path, lines, seed)
    raise TraceError(
        f"{path}:{number}: unknown trace format; expected {EVENT_FORMAT} or {SAMPLE_FORMAT}, got {first!r}"
    )


def _parse_events(path: Path, lines: list[tuple[int, str]]) -> Availability:
    """Return the trace of an events file; every malformed or inconsistent line is a TraceError."""
    events: list[NodeEvent] = []
    added_on: dict[str, int] = {}  # live node -> line that added it
    first_ms = previous_ms = None
    for number, line in lines:
        fields = [part.strip() for part in line.split(",")]
        if not (
            len(fields) == 3
            and _INTEGER.fullmatch(fields[0])
            and fields[1] in ("add", "remove")
            and _NODE_NAME.fullmatch(fields[2])
        ):
            raise TraceError(f"{path}:{number}: expected {EVENT_FORMAT}, got {line!r}")
        ms, kind, node = int(fields[0]), fields[1], fields[2]
        if previous_ms is not None and ms < previous_ms:
            raise TraceError(
                f"{path}:{number}: time goes backwards ({ms} ms after {previous_ms} ms); "
                f"expected lines in time order, got {line!r}"
            )
        if kind == "add" and node in added_on:
            raise TraceError(
                f"{path}:{number}: adds {node}, which is already live (added on line {added_on[node]}); "
                f"expected a 'remove' of {node} first, got {line!r}"
            )
        if kind == "remove" and node not in added_on:
            raise TraceError(
                f"{path}:{number}: removes {node}, which is not live (never added, or already removed); "
                f"expected an earlier '<ms>,add,{node}' line, got {line!r}"
            )
        if kind == "add":
            added_on[node] = number
        else:
            del added_on[node]
        first_ms = ms if first_ms is None else first_ms
        previous_ms = ms
        events.append(NodeEvent((ms - first_ms) / 1000.0, kind, node))
    return Availability(tuple(events), events[-1].time_s)


def _parse_samples(path: Path, lines: list[tuple[int, str]], seed: int) -> Availability:
    """Return the trace of a count-samples file, removing uniformly drawn live nodes on a drop."""
    rng = np.random.default_rng(seed)
    events: list[NodeEvent] = []
    live: list[str] = []  # in order of addition
    next_id = 1
    start = previous = None
    t = 0.0
    for number, line in lines:
        fields = [part.strip() for part in line.split(",")]
        stamp = None
        if len(fields) == 3 and _INTEGER.fullmatch(fields[2]):
            try:
                stamp = datetime.strptime(f"{fields[0]} {fields[1]}", "%Y-%m-%d %H:%M:%S")
            except ValueError:
                stamp = None
        if stamp is None:
            raise TraceError(f"{path}:{number}: expected {SAMPLE_FORMAT}, got {line!r}")
        if previous is not None and stamp < previous:
            raise TraceError(
                f"{path}:{number}: time goes backwards ({stamp} after {previous}); "
                f"expected lines in time order, got {line!r}"
            )
        start = stamp if start is None else start
        previous = stamp
        t = (stamp - start).total_seconds()
        count = int(fields[2])
        while len(live) < count:
            live.append(f"node{next_id}")
            next_id += 1
            events.append(NodeEvent(t, "add", live[-1]))
        if len(live) > count:
            chosen = rng.choice(len(live), size=len(live) - count, replace=False).tolist()
            events.extend(NodeEvent(t, "remove", live[index]) for index in chosen)
            preempted = set(chosen)
            live = [node for index, node in enumerate(live) if index not in preempted]
    return Availability(tuple(events), t)


# ---------------------------------------------------------------------------------------------
# Synthetic traces


def poisson_trace(
    num_nodes: int, mean_lifetime_s: float, mean_restart_s: float, duration_s: float, seed: int
) -> Availability:
    """Return a trace where each of `num_nodes` nodes alternates up/down with exponential durations.

    Up spells have mean `mean_lifetime_s` (preemption is memoryless), down spells mean
    `mean_restart_s`. Each node starts in its stationary state — up with probability
    L / (L + R), and by memorylessness the first spell is again exponential — so the expected
    uptime fraction is L / (L + R) at every t, not only after a warm-up. Nodes keep their names
    (node0 …) across restarts, like a fixed set of local logical nodes.
    """
    _require_positive(
        num_nodes=num_nodes,
        mean_lifetime_s=mean_lifetime_s,
        mean_restart_s=mean_restart_s,
        duration_s=duration_s,
    )
    rng = np.random.default_rng(seed)
    up_fraction = mean_lifetime_s / (mean_lifetime_s + mean_restart_s)
    events: list[NodeEvent] = []
    for index in range(num_nodes):
        node = f"node{index}"
        up = bool(rng.random() < up_fraction)
        t = 0.0
        if up:
            events.append(NodeEvent(0.0, "add", node))
        while True:
            t += float(rng.exponential(mean_lifetime_s if up else mean_restart_s))
            if t >= duration_s:
                break
            up = not up
            events.append(NodeEvent(t, "add" if up else "remove", node))
    return Availability(tuple(events), float(duration_s))


def diurnal_trace(
    num_nodes: int, period_s: float, amplitude: float, duration_s: float, seed: int
) -> Availability:
    """Return a trace whose expected live fraction follows a day wave.

    f(t) = 1 − amplitude · (1 − cos(2π t / period_s)) / 2: all nodes at t = 0 (the quiet hours),
    a fraction 1 − amplitude at the half-period peak of demand. In each period every node draws a
    threshold u ~ U(0, 1) and is down while f(t) < u — one preemption a day around the peak, at
    a random depth. Then E[live(t)] = num_nodes · f(t) exactly and each period holds on average
    num_nodes · amplitude preemptions. Thresholds are redrawn only where f = 1, so nodes never
    jump state at period boundaries.
    """
    _require_positive(num_nodes=num_nodes, period_s=period_s, duration_s=duration_s)
    if not (0.0 <= amplitude <= 1.0):
        raise ValueError(f"amplitude must be in [0, 1] (fraction of nodes lost at the peak), got {amplitude}")
    rng = np.random.default_rng(seed)
    events = [NodeEvent(0.0, "add", f"node{index}") for index in range(num_nodes)]
    for period in range(math.ceil(duration_s / period_s)):
        thresholds = rng.random(num_nodes)
        for index, u in enumerate(thresholds):
            # f(t) < u  ⇔  cos θ < 1 − 2(1 − u)/amplitude, with θ = 2π t / period_s
            if amplitude == 0.0:
                continue
            cos_edge = 1.0 - 2.0 * (1.0 - u) / amplitude
            if cos_edge <= -1.0:
                continue
            theta = math.acos(cos_edge)
            down_s = period * period_s + theta / (2 * math.pi) * period_s
            up_s = (period + 1) * period_s - theta / (2 * math.pi) * period_s
            if down_s < duration_s:
                events.append(NodeEvent(down_s, "remove", f"node{index}"))
            if up_s < duration_s:
                events.append(NodeEvent(up_s, "add", f"node{index}"))
    return Availability(tuple(events), float(duration_s))


def _require_positive(**values: float) -> None:
    """Raise ValueError naming the first argument that is not a finite number > 0."""
    for name, value in values.items():
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"{name} must be a finite number > 0, got {value}")
