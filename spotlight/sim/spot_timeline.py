"""The spot pool's live devices over time, from a trace, with the prefix sums the simulator's phases need."""

from __future__ import annotations

import math

import numpy as np

from spotlight.market.traces import Availability

__all__ = ["SpotTimeline"]


class SpotTimeline:
    """The spot pool's live devices over time, with prefix sums for O(log K) phase arithmetic.

    Built from an Availability: times × `time_scale`, counts × spot_devices / peak (rounded down).
    One period is [0, D); a run longer than D replays the trace from the start, and the jump from
    the last count back to the first is an event at each multiple of D (not at 0, where the run
    starts). Per change point j: `live[j]` devices from `tau[j]` on, `usable[j]` of them in whole SP
    groups, and the devices removed / added there relative to the point before.
    """

    def __init__(self, trace: Availability, spot_devices: int, time_scale: float, sp_degree: int) -> None:
        if spot_devices < 0 or sp_degree < 1:
            raise ValueError(
                f"SpotTimeline needs spot_devices >= 0 and sp_degree >= 1 (got {spot_devices}, {sp_degree})"
            )
        self.sp_degree = sp_degree
        period = trace.duration_s * time_scale
        times = np.asarray(trace.times_s, dtype=np.float64) * time_scale
        counts = np.asarray(trace.counts, dtype=np.int64)
        if period <= 0:  # a trace of one instant: a constant pool at its final count
            period, times, counts = 1.0, np.zeros(1), counts[-1:] if len(counts) else np.zeros(1, dtype=np.int64)
        keep = times < period  # a change at exactly D never holds: the replay restarts there
        times, counts = times[keep], counts[keep]
        if len(times) == 0 or times[0] > 0:
            times, counts = np.concatenate([[0.0], times]), np.concatenate([[0], counts])
        peak = int(trace.counts.max()) if len(trace.counts) and trace.counts.max() > 0 else 1
        self.period_s = float(period)
        self.tau = times
        self.live = (counts * spot_devices) // peak
        self.usable = (self.live // sp_degree) * sp_degree
        segment = np.diff(np.append(times, period))
        self._cum_live = np.concatenate([[0.0], np.cumsum(self.live * segment)])
        self._cum_usable = np.concatenate([[0.0], np.cumsum(self.usable * segment)])
        before = np.roll(self.live, 1)  # index 0: the wrap from the last count
        removed = np.maximum(before - self.live, 0)
        added = np.maximum(self.live - before, 0)
        usable_after_removal = np.where(removed > 0, self.usable, 0)
        self._events = {
            "removed": removed,
            "groups_hit": -(-removed // sp_degree),  # a preemption takes whole groups: ⌈removed / sp⌉
            "removal_points": (removed > 0).astype(np.int64),
            "usable_after_removal": usable_after_removal,
            "added": added,
        }
        self._event_prefix = {name: np.concatenate([[0], np.cumsum(v)]) for name, v in self._events.items()}

    def _locate(self, t: float) -> tuple[int, float]:
        """Return (period index, time inside the period) of absolute time t ≥ 0."""
        k = math.floor(t / self.period_s)
        return k, t - k * self.period_s

    def live_at(self, t: float) -> int:
        """Return the live spot devices at time t (events at t count as done)."""
        _, r = self._locate(t)
        return int(self.live[np.searchsorted(self.tau, r, side="right") - 1])

    def usable_at(self, t: float) -> int:
        """Return the live spot devices at time t that form whole SP groups."""
        _, r = self._locate(t)
        return int(self.usable[np.searchsorted(self.tau, r, side="right") - 1])

    def _integral(self, t: float, values: np.ndarray, cumulative: np.ndarray) -> float:
        k, r = self._locate(t)
        j = int(np.searchsorted(self.tau, r, side="right") - 1)
        return k * float(cumulative[-1]) + float(cumulative[j]) + float(values[j]) * (r - float(self.tau[j]))

    def live_device_seconds(self, t0: float, t1: float) -> float:
        """Return ∫ live spot devices dt over [t0, t1]: what the spot pool is billed for."""
        return self._integral(t1, self.live, self._cum_live) - self._integral(t0, self.live, self._cum_live)

    def usable_device_seconds(self, t0: float, t1: float) -> float:
        """Return ∫ usable spot devices dt over [t0, t1]."""
        return self._integral(t1, self.usable, self._cum_usable) - self._integral(t0, self.usable, self._cum_usable)

    def events(self, t0: float, t1: float) -> dict[str, int]:
        """Return the totals over change points in [t0, t1) of removed, groups_hit, removal_points,
        usable_after_removal and added devices."""
        return {name: self._events_before(t1, name) - self._events_before(t0, name) for name in self._events}

    def joining_device_seconds(self, t0: float, t1: float, ready_after_s: float) -> float:
        """Return Σ over devices added at τ of |[τ, τ + ready_after_s] ∩ [t0, t1]|: the device-seconds
        inside [t0, t1] that joining devices are live (billed) but not yet able to work.

        A device that joins is usable `ready_after_s` later (start-up and weights), so it adds no
        capacity before then, however the phases fall. A device preempted before it is ready is
        counted to τ + ready_after_s (an upper bound of its unusable time). The devices live at the
        start of the run (point 0 of period 0) were ready before it began.
        """
        if ready_after_s <= 0 or t1 <= t0:
            return 0.0
        low = max(0.0, t0 - ready_after_s)  # a join before this is ready by t0
        joined = np.flatnonzero(self._events["added"])
        total = 0.0
        for k in range(math.floor(low / self.period_s), math.floor(t1 / self.period_s) + 1):
            at = k * self.period_s + self.tau[joined]
            keep = (at >= low) & (at < t1) & ~((k == 0) & (joined == 0))
            overlap = np.minimum(at[keep] + ready_after_s, t1) - np.maximum(at[keep], t0)
            total += float(np.sum(self._events["added"][joined[keep]] * np.maximum(overlap, 0.0)))
        return total

    def _events_before(self, t: float, name: str) -> int:
        if t <= 0:
            return 0
        k, r = self._locate(t)
        j = int(np.searchsorted(self.tau, r, side="left"))
        prefix = self._event_prefix[name]
        return int(k * prefix[-1] + prefix[j] - self._events[name][0])  # point 0 of period 0 is the start

    def time_to_capacity(self, t0: float, work: float, od_rate: float, spot_rate: float) -> float:
        """Return the first t ≥ t0 with od_rate·(t − t0) + spot_rate·∫_{t0}^{t} usable = work (inf if never).

        The capacity function H(t) = od_rate·t + spot_rate·U(t) is increasing and piecewise linear:
        one period adds od_rate·D + spot_rate·U(D), so whole periods are skipped arithmetically and
        the rest is a binary search over the change points.
        """
        if work <= 0:
            return t0
        per_period = od_rate * self.period_s + spot_rate * float(self._cum_usable[-1])
        if per_period <= 0:
            return math.inf
        target = od_rate * t0 + spot_rate * self._integral(t0, self.usable, self._cum_usable) + work
        k = math.floor(target / per_period)
        remainder = target - k * per_period
        at_points = od_rate * self.tau + spot_rate * self._cum_usable[:-1]
        j = int(np.searchsorted(at_points, remainder, side="right") - 1)
        slope = od_rate + spot_rate * float(self.usable[j])
        offset = (remainder - float(at_points[j])) / slope if slope > 0 else 0.0
        return max(t0, k * self.period_s + float(self.tau[j]) + offset)
