"""The simulator's phase arithmetic: when a phase of work ends on the two pools, and how its time is billed.

A phase is a fluid (the module docstring of `spotlight.sim.simulator` gives the time model): it ends
when the pools' capacity integral reaches its work plus the overheads that spot events inside it
cause (lost work, re-forming groups, joining devices); its rented time is then booked to the cost
meter. The simulation decides which phases run and when; this module only answers "when does it
end" and "what did it cost".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from spotlight.market.billing import CostMeter, Phase
from spotlight.market.pools import POOLS, Pool
from spotlight.sim.sim_config import ClusterSection
from spotlight.sim.spot_timeline import SpotTimeline
from spotlight.sim.workload import DeviceTimes

__all__ = ["STALL_HORIZON_S", "PhaseOutcome", "PhaseRunner", "PoolTimes", "Stalled", "joined"]

# A phase whose overheads keep outrunning its progress (e.g. cold restarts longer than the gaps
# between preemptions) never ends; past this horizon it is declared stalled.
STALL_HORIZON_S = 1e9


@dataclass(frozen=True)
class PoolTimes:
    """Per-pool device times and the fixed facts of one run."""

    od: DeviceTimes
    spot: DeviceTimes
    od_devices: int
    od_usable: int

    @property
    def od_rate(self) -> float:
        """Sample-steps per second of the whole usable on-demand pool."""
        return self.od_usable / self.od.sample_step_device_s

    @property
    def spot_rate(self) -> float:
        """Sample-steps per second of one usable spot device."""
        return 1.0 / self.spot.sample_step_device_s


@dataclass
class PhaseOutcome:
    """A phase's end and its bookings per pool: useful work, overheads (device-seconds)."""

    end_s: float
    work_done: float  # sample-steps
    busy_s: dict[Pool, float]
    reconfiguring_s: dict[Pool, float]
    lost_s: dict[Pool, float]


class Stalled(RuntimeError):
    """A phase that never ends: overheads outrun progress (e.g. cold restarts longer than the gaps)."""

    def __init__(self, t0: float) -> None:
        super().__init__(f"a phase starting at {t0:.0f} s never ends: preemption overheads outrun its progress")


def joined(first: PhaseOutcome, second: PhaseOutcome) -> PhaseOutcome:
    """One phase run in two pieces, `second` right after `first`: its end and summed bookings."""
    return PhaseOutcome(
        end_s=second.end_s,
        work_done=first.work_done + second.work_done,
        busy_s={pool: first.busy_s[pool] + second.busy_s[pool] for pool in POOLS},
        reconfiguring_s={pool: first.reconfiguring_s[pool] + second.reconfiguring_s[pool] for pool in POOLS},
        lost_s={pool: first.lost_s[pool] + second.lost_s[pool] for pool in POOLS},
    )


class PhaseRunner:
    """Runs phases on the cluster's pools and books them: the arithmetic half of the simulation.

    ``pools`` (the device times) is set by the simulation before the first phase, and again before
    an iteration whose measured times differ (`MeasuredTimes.at`).
    """

    pools: PoolTimes

    def __init__(
        self, cluster: ClusterSection, sp_degree: int, spot: SpotTimeline, meter: CostMeter, uses_spot: bool
    ) -> None:
        self.cluster, self.sp_degree, self.spot, self.meter, self.uses_spot = cluster, sp_degree, spot, meter, uses_spot

    def overheads(
        self, t0: float, t1: float, steps_per_request: int, od_in_phase: bool
    ) -> tuple[dict[Pool, float], dict[Pool, float]]:
        """Return (reconfiguring, lost) device-seconds per pool caused by spot events in [t0, t1).

        Per preempted SP group (⌈removed / sp⌉ of them: groups live inside one machine, and a
        preemption takes whole machines): with a notice of at least one step, the request finishes
        its current step and commits, losing at most that step (counted as the whole step, an upper
        bound); without, it loses the work since its last commit — its start, as a request commits
        only on a notice or when done — on average half a request. Elastic recovery: the hit groups'
        survivors re-form in elastic_reconfigure_s (charged to the whole group, an upper bound), and
        a joining device is billed from its join but works only once it holds the weights,
        weight_copy_s + elastic_reconfigure_s later (the runtime's device starts, loads the current
        weights as soon as it is up and then takes queued work): what is charged to [t0, t1) is the
        part of that wait inside it (`SpotTimeline.joining_device_seconds`), never a whole copy to a
        phase that ends first, and the part before t0 belongs to the phases before.
        Cold recovery: each removal time stalls every device of the phase for cold_restart_s (one
        static process group), and each joining device cold-starts for cold_restart_s.
        """
        cluster = self.cluster
        sp = self.sp_degree
        step_s = self.pools.spot.step_s
        events = self.spot.events(t0, t1)
        per_group_lost_s = step_s if cluster.notice_s >= step_s else 0.5 * steps_per_request * step_s
        lost: dict[Pool, float] = {"on_demand": 0.0, "spot": events["groups_hit"] * sp * per_group_lost_s}
        reconfiguring: dict[Pool, float] = {"on_demand": 0.0, "spot": 0.0}
        if cluster.recovery == "elastic":
            ready_after_s = self.pools.spot.weight_copy_s + cluster.elastic_reconfigure_s
            reconfiguring["spot"] = (
                events["groups_hit"] * sp * cluster.elastic_reconfigure_s
                + self.spot.joining_device_seconds(t0, t1, ready_after_s)
            )
        else:
            reconfiguring["spot"] = (events["usable_after_removal"] + events["added"]) * cluster.cold_restart_s
            if od_in_phase:
                reconfiguring["on_demand"] = events["removal_points"] * self.pools.od_usable * cluster.cold_restart_s
        return reconfiguring, lost

    def run(
        self, t0: float, work: float, padded_work: float, steps_per_request: int, use_od: bool, deadline_s: float
    ) -> PhaseOutcome:
        """Run `work` sample-steps (padded to `padded_work` for whole request rounds) from t0 on the
        usable on-demand devices (if use_od) and usable spot devices, until done or `deadline_s`.

        The end solves capacity(t0, t) = padded work + overheads(t0, t) by fixed-point iteration:
        overheads only grow with t, so t only grows, and it stops when no new event falls inside.
        """
        od_rate = self.pools.od_rate if use_od else 0.0
        spot_rate = self.pools.spot_rate if self.uses_spot else 0.0
        end = self.spot.time_to_capacity(t0, padded_work, od_rate, spot_rate)
        overhead_work = 0.0
        while True:
            horizon = min(end, deadline_s)
            reconfiguring, lost = self.overheads(t0, horizon, steps_per_request, use_od)
            overhead_work = (reconfiguring["spot"] + lost["spot"]) * spot_rate + reconfiguring["on_demand"] * (
                od_rate / max(1, self.pools.od_usable)
            )
            new_end = self.spot.time_to_capacity(t0, padded_work + overhead_work, od_rate, spot_rate)
            if new_end <= end * (1 + 1e-12) or new_end >= deadline_s or new_end - t0 > STALL_HORIZON_S:
                end = new_end
                break
            end = new_end
        if end - t0 > STALL_HORIZON_S and deadline_s == math.inf:
            raise Stalled(t0)
        end = min(end, deadline_s)
        reconfiguring, lost = self.overheads(t0, end, steps_per_request, use_od)
        capacity = {
            "on_demand": od_rate * (end - t0),
            "spot": spot_rate * self.spot.usable_device_seconds(t0, end),
        }
        rates = {"on_demand": od_rate / max(1, self.pools.od_usable), "spot": spot_rate}
        remaining = {
            pool: max(0.0, capacity[pool] - (reconfiguring[pool] + lost[pool]) * rates[pool]) for pool in POOLS
        }
        total = sum(remaining.values())
        work_done = min(work, total)
        busy_s = {
            pool: (work_done * remaining[pool] / total / rates[pool] if total > 0 and rates[pool] > 0 else 0.0)
            for pool in POOLS
        }
        return PhaseOutcome(end, work_done, busy_s, reconfiguring, lost)

    def book(self, t0: float, t1: float, phase: Phase, outcome: PhaseOutcome | None, od_phase: Phase | None) -> None:
        """Book [t0, t1] for both pools: the outcome's work under `phase` and its overheads, the rest
        of the rented time as idle; the on-demand pool goes wholly to `od_phase` when given (training)."""
        rented: dict[Pool, float] = {
            "on_demand": self.pools.od_devices * (t1 - t0),
            "spot": self.spot.live_device_seconds(t0, t1) if self.uses_spot else 0.0,
        }
        for pool in POOLS:
            if pool == "on_demand" and od_phase is not None:
                self.meter.book(pool, od_phase, rented[pool])
            elif outcome is None:
                self.meter.book_window(pool, rented[pool])
            else:  # overheads first, then work, each capped by what is left of the rented time
                reconfiguring = min(outcome.reconfiguring_s[pool], rented[pool])
                lost = min(outcome.lost_s[pool], rented[pool] - reconfiguring)
                busy = min(outcome.busy_s[pool], rented[pool] - reconfiguring - lost)
                self.meter.book_window(pool, rented[pool], {phase: busy}, reconfiguring, lost)
