"""What rented devices cost: every rented device-second, what it did, and its dollars.

Two meters, one billing rule (clouds bill GPU machines per second, from the moment a device is
live until it goes, busy or not): `CostMeter` books the simulator's device-seconds by phase,
`DeviceLedger` records the runtime's held and busy intervals on the run's clock.

## CostMeter (the simulator)

Two pools, `on_demand` and `spot`, each with a price per GPU-hour (from `prices.Offering`). Every
rented device-second is booked to exactly one phase, so per pool the phases add up to what was
rented and the utilisation shares add up to 1:
- rollout, train, explore: useful work;
- broadcast: moving θ_{i+1} to the devices that did not train it;
- reconfiguring: re-forming SP groups or restarting after a preemption, warming up a new device;
- lost: work done and then thrown away (a preempted request without notice);
- idle: rented and waiting (the spot pool during training when it does not explore, the tail of a
  phase when the queue runs dry).
Billing is per second (AWS, GCP and Azure bill GPU machines per second) of every rented device:
a spot device costs from the moment it is live until it is preempted, busy or not.

## DeviceLedger (the runtime)

A device is *held* (rented, billed) from the moment its node is live until the node goes, busy or
not, as clouds bill GPU machines per second. Within that, it is *busy* in intervals labelled with
a phase (rollout, train, explore, broadcast, eval). From the two the meter answers, for any window
of the run's clock: held and busy seconds per pool (utilisation = busy / held), the dollars so far
per pool, and the share of busy time that was model compute (the rest is the runtime's overhead:
RPCs, leases, tokenising, weight loading). A device may also mark when its process came up
(`started`): until then it is held and *starting*, neither busy nor waiting for work.

`activity_s` breaks a pool's held time down by what its devices did: each busy phase (a weight load,
``broadcast``, is the activity ``weights``), ``starting``, and ``idle`` (held, up, given nothing), the
parts adding up to the held time exactly, so a utilisation below 1 says where the rest went.

Times are seconds on the run's clock (0 = the start of the run). Prices are per GPU-hour, one
device = one GPU; the defaults come from the package's price table (`spotlight.market.prices`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal, get_args

from spotlight.market.pools import POOLS, Pool
from spotlight.market.prices import DevicePrices

__all__ = ["ACTIVITY_OF_PHASE", "BUSY_PHASES", "PHASES", "CostMeter", "DeviceLedger", "Phase", "Usage"]

Phase = Literal["rollout", "train", "explore", "broadcast", "reconfiguring", "lost", "idle"]
PHASES: tuple[Phase, ...] = get_args(Phase)
BUSY_PHASES: tuple[Phase, ...] = ("rollout", "train", "explore")

# A runtime busy phase's name as an activity of held time (DeviceLedger.activity_s); others keep their name.
ACTIVITY_OF_PHASE = {"broadcast": "weights"}

# Booked amounts may come out a hair negative from float round-off of "rented − busy"; anything
# beyond this (device-seconds) is a bookkeeping error, not round-off.
_TOLERANCE_DEVICE_S = 1e-6


@dataclass(frozen=True)
class Usage:
    """What one pool rented and cost: device_seconds per phase, their total, the dollars, and
    utilisation = busy (rollout + train + explore) / rented (NaN for a pool that rented nothing)."""

    pool: Pool
    price_per_gpu_hour: float
    device_seconds: dict[Phase, float]

    @property
    def rented_device_s(self) -> float:
        """Return all device-seconds rented in this pool (the sum over phases)."""
        return sum(self.device_seconds.values())

    @property
    def dollars(self) -> float:
        """Return rented device-hours × price per GPU-hour."""
        return self.rented_device_s / 3600.0 * self.price_per_gpu_hour

    @property
    def utilisation(self) -> float:
        """Return the busy fraction of rented time (NaN when nothing was rented)."""
        rented = self.rented_device_s
        busy = sum(self.device_seconds[phase] for phase in BUSY_PHASES)
        return busy / rented if rented > 0 else math.nan

    def shares(self) -> dict[Phase, float]:
        """Return each phase's fraction of rented time; they sum to 1 (all NaN when nothing was rented)."""
        rented = self.rented_device_s
        return {phase: (seconds / rented if rented > 0 else math.nan) for phase, seconds in self.device_seconds.items()}


class CostMeter:
    """Accumulates device-seconds per (pool, phase) and prices them.

    `book` adds time to one phase; `book_window` books a whole stretch of rented time at once:
    the given busy / reconfiguring / lost amounts, and the rest of the rented time as idle. The
    meter never infers what was rented — the simulator tells it — so it can be checked: a window
    whose parts exceed what was rented is a bug and raises.
    """

    def __init__(self, on_demand_per_gpu_hour: float, spot_per_gpu_hour: float) -> None:
        given = {"on_demand_per_gpu_hour": on_demand_per_gpu_hour, "spot_per_gpu_hour": spot_per_gpu_hour}
        for name, price in given.items():
            if not (math.isfinite(price) and price >= 0):
                raise ValueError(f"CostMeter: {name} must be a finite price >= 0 in $/GPU-hour (got {price})")
        self._prices: dict[Pool, float] = {"on_demand": on_demand_per_gpu_hour, "spot": spot_per_gpu_hour}
        self._seconds: dict[Pool, dict[Phase, float]] = {pool: dict.fromkeys(PHASES, 0.0) for pool in POOLS}

    def book(self, pool: Pool, phase: Phase, device_seconds: float) -> None:
        """Add `device_seconds` (≥ 0) of rented time in `pool` to `phase`."""
        if pool not in POOLS:
            raise ValueError(f"CostMeter.book: pool must be one of {POOLS} (got {pool!r})")
        if phase not in PHASES:
            raise ValueError(f"CostMeter.book: phase must be one of {PHASES} (got {phase!r})")
        if not math.isfinite(device_seconds) or device_seconds < -_TOLERANCE_DEVICE_S:
            raise ValueError(
                f"CostMeter.book: device_seconds for {pool}/{phase} must be finite and >= 0 (got {device_seconds})"
            )
        self._seconds[pool][phase] += max(0.0, device_seconds)

    def book_window(
        self,
        pool: Pool,
        rented_device_s: float,
        busy: dict[Phase, float] | None = None,
        reconfiguring_s: float = 0.0,
        lost_s: float = 0.0,
    ) -> float:
        """Book a stretch of `rented_device_s` in `pool`: `busy` {phase: seconds}, reconfiguring,
        lost, and the remainder as idle. Returns the idle device-seconds booked.

        Raises ValueError when the parts exceed the rented time (beyond float round-off).
        """
        busy = busy or {}
        used = sum(busy.values()) + reconfiguring_s + lost_s
        idle = rented_device_s - used
        if idle < -_TOLERANCE_DEVICE_S * max(1.0, rented_device_s):
            raise ValueError(
                f"CostMeter.book_window: {pool} work and overheads ({used:.6g} device-s) exceed the rented "
                f"{rented_device_s:.6g} device-s; the caller's accounting is inconsistent"
            )
        for phase, seconds in busy.items():
            self.book(pool, phase, seconds)
        self.book(pool, "reconfiguring", reconfiguring_s)
        self.book(pool, "lost", lost_s)
        self.book(pool, "idle", idle)
        return max(0.0, idle)

    def usage(self, pool: Pool) -> Usage:
        """Return the Usage of one pool so far (a copy: later bookings do not change it)."""
        return Usage(pool, self._prices[pool], dict(self._seconds[pool]))

    @property
    def dollars(self) -> float:
        """Return the total cost so far over both pools."""
        return sum(self.usage(pool).dollars for pool in POOLS)


@dataclass
class _Device:
    pool: Pool
    held: list[list[float]] = field(default_factory=list)  # [start, end]; end = inf while held
    busy: list[tuple[float, float, str]] = field(default_factory=list)
    compute_s: float = 0.0
    starting: list[tuple[float, float]] = field(default_factory=list)  # held, process not up yet


def _overlap(start: float, end: float, t0: float, t1: float) -> float:
    return max(0.0, min(end, t1) - max(start, t0))


def _union(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """Sorted, disjoint intervals covering the same time as ``intervals``."""
    merged: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


class DeviceLedger:
    """Held and busy intervals of every device, priced (see the module docstring)."""

    def __init__(self, prices: DevicePrices) -> None:
        self.prices = prices
        self._devices: dict[str, _Device] = {}

    def hold(self, device: str, pool: Pool, at: float) -> None:
        """Start renting ``device`` at ``at`` (its node is live)."""
        if pool not in POOLS:
            raise ValueError(f"pool must be one of {POOLS} (got {pool!r})")
        entry = self._devices.setdefault(device, _Device(pool))
        if entry.held and math.isinf(entry.held[-1][1]):
            raise ValueError(f"device {device} is already held since {entry.held[-1][0]:.3f} s; release it first")
        entry.held.append([at, math.inf])

    def release(self, device: str, at: float) -> None:
        """Stop renting ``device`` at ``at`` (its node is gone, or the run ended); idempotent."""
        entry = self._devices.get(device)
        if entry is not None and entry.held and math.isinf(entry.held[-1][1]):
            entry.held[-1][1] = max(at, entry.held[-1][0])

    def busy(self, device: str, start: float, end: float, phase: str, compute_s: float = 0.0) -> None:
        """Record that ``device`` worked on ``phase`` from ``start`` to ``end``, ``compute_s`` of it in the model."""
        entry = self._devices.get(device)
        if entry is None:
            raise ValueError(f"busy interval for device {device}, which was never held: call hold() first")
        if end < start:
            raise ValueError(f"busy interval of {device} ends before it starts ({start:.3f} > {end:.3f})")
        entry.busy.append((start, end, phase))
        entry.compute_s += compute_s

    def started(self, device: str, at: float) -> None:
        """``device``'s process is up at ``at``: from its hold until then it was starting (billed, unable to work)."""
        entry = self._devices.get(device)
        if entry is not None and entry.held and math.isinf(entry.held[-1][1]) and at > entry.held[-1][0]:
            entry.starting.append((entry.held[-1][0], at))

    def is_held(self, device: str) -> bool:
        entry = self._devices.get(device)
        return entry is not None and bool(entry.held) and math.isinf(entry.held[-1][1])

    def held_s(self, pool: Pool, t0: float, t1: float) -> float:
        """Device-seconds rented in ``pool`` during [t0, t1)."""
        return sum(_overlap(start, end, t0, t1) for entry in self._pool(pool) for start, end in entry.held)

    def peak_held(self, pool: Pool, until: float) -> int:
        """The most devices of ``pool`` held at once before ``until``: the capacity held time is measured against.

        A spot device that leaves and comes back is a new device with a new interval, so counting the
        devices ever held would overstate the capacity; the peak of concurrent holds does not.
        """
        edges = sorted((point, step) for entry in self._pool(pool) for start, end in entry.held if start < until
                       for point, step in ((start, 1), (min(end, until), -1)))
        held = peak = 0
        for _, step in edges:  # at a tie the release (-1) sorts first: a hand-over is not two devices
            held += step
            peak = max(peak, held)
        return peak

    def held_fraction(self, pool: Pool, t0: float, t1: float) -> float:
        """Held device-seconds of ``pool`` in [t0, t1) over (peak devices held × t1 - t0); NaN when none was held.

        With utilisation (busy / held) beside it, it tells a spot device that idled from one that was gone:
        a device busy 92% of the time it existed, present half the run, is utilisation 0.92 and held 0.5.
        """
        capacity = self.peak_held(pool, t1) * (t1 - t0)
        return self.held_s(pool, t0, t1) / capacity if capacity > 0 else math.nan

    def busy_s(self, pool: Pool, t0: float, t1: float, phase: str | None = None) -> float:
        """Device-seconds busy in ``pool`` during [t0, t1) (only ``phase`` if given)."""
        return sum(_overlap(start, end, t0, t1) for entry in self._pool(pool) for start, end, label in entry.busy
                   if phase is None or label == phase)

    def activity_s(self, pool: Pool, t0: float, t1: float) -> dict[str, float]:
        """Held device-seconds of ``pool`` in [t0, t1) by activity: busy phases (`ACTIVITY_OF_PHASE` renames),
        ``starting`` and ``idle``; the values sum to `held_s` (each interval is cut to the held time it falls in).

        Busy intervals are timed on the device and may stick out of its held interval by a clock's
        rounding (or a call answered after its node was released); only the part inside counts, and idle
        is what is left, so the breakdown always adds up to what was billed.
        """
        seconds: dict[str, float] = {"starting": 0.0, "idle": 0.0}
        for entry in self._pool(pool):
            labelled = sorted([*((s, e, ACTIVITY_OF_PHASE.get(p, p)) for s, e, p in entry.busy),
                               *((s, e, "starting") for s, e in entry.starting)])
            for held_start, held_end in entry.held:
                start, end = max(held_start, t0), min(held_end, t1)
                if end <= start:
                    continue
                cursor = start  # each instant counts once, for the first interval that covers it
                for part_start, part_end, activity in labelled:
                    part = min(part_end, end) - max(part_start, cursor)
                    if part > 0:
                        seconds[activity] = seconds.get(activity, 0.0) + part
                        cursor = min(part_end, end)
                seconds["idle"] += (end - start) - sum(
                    max(0.0, min(e, end) - max(s, start)) for s, e in _union((s, e) for s, e, _ in labelled))
        return seconds

    def utilisation(self, pool: Pool, t0: float, t1: float) -> float:
        """Busy / held device-seconds of ``pool`` in [t0, t1); NaN when nothing was held.

        Busy is the held time neither idle nor starting (`activity_s`): the busy activities of its breakdown.
        """
        seconds = self.activity_s(pool, t0, t1)
        held = sum(seconds.values())
        return (held - seconds["idle"] - seconds["starting"]) / held if held > 0 else math.nan

    def dollars(self, pool: Pool, until: float) -> float:
        """What ``pool`` cost from the start of the run to ``until``."""
        return self.held_s(pool, 0.0, until) * self.prices.per_second(pool)

    def compute_share(self, pool: Pool | None = None) -> float:
        """Model-compute seconds / busy seconds over the whole run (NaN when nothing was busy)."""
        entries = [entry for name in POOLS if pool in (None, name) for entry in self._pool(name)]
        busy = sum(end - start for entry in entries for start, end, _ in entry.busy)
        return sum(entry.compute_s for entry in entries) / busy if busy > 0 else math.nan

    def _pool(self, pool: Pool) -> list[_Device]:
        return [entry for entry in self._devices.values() if entry.pool == pool]
