"""A discrete-event simulator of the Spotlight loop on a cluster of on-demand and spot GPUs.

It answers, before renting anything: how long and how many dollars to the target, and how busy
each pool is, for each mode of the loop (DESIGN.md, "The loop"):
- `vanilla`: the on-demand devices roll out and train; no spot device is rented;
- `spot-rollout`: spot devices that hold θ_i help the rollout and idle while the trainer trains;
- `sync-explore`: as spot-rollout, plus exploration with the fresh θ_i on every device before each
  rollout, on the critical path;
- `spotlight`: as spot-rollout, and while the on-demand devices train, the spot devices explore the
  next prompts with the stale θ_i inside the training time.

The loop per iteration i: [sync-explore: explore P_i on all devices] → rollout P_i × G samples of
T steps on the devices that hold θ_i → GRPO update on the on-demand devices [spotlight: explore
P_{i+1} on spot meanwhile] → broadcast θ_{i+1} to the spot devices. Decisions are the runtime's:
the exploration plan comes from `ExplorationPlanner.choose` (budget = the predicted training time,
devices = the live spot devices in SP groups), fed back with `observe_cost` (device-seconds the
exploration took) and `observe_reward` (the realised group reward variance); the seeds come from
`select_seeds` inside `convergence.SignalModel`. Neither is re-implemented here. sync-explore asks
the planner the same question (budget = the predicted training time) for all its devices, so it
explores at least as hard as spotlight could; it pays in wall time instead of hiding it. Progress
per iteration comes from the convergence law (`convergence.ConvergenceModel`): vanilla and
spot-rollout take exactly `vanilla_iterations`, exploring modes fewer by (σ / σ_random)^α.

Time model. Work is counted in sample-steps (one sample, one denoising step). The pull-based
queue keeps every live SP group busy, so a phase is a fluid: it ends when the capacity integral
∫ (rate_od · n_od + rate_spot · usable_spot(t)) dt reaches its work plus the preemption overheads,
found by searching the prefix sums of the availability step function (`SpotTimeline`) — O(log K)
per phase, whatever the cluster size. The cost that grows with scale is the seed selection over
P × N candidate rewards: 100 iterations of a 1,024-GPU cluster (256 prompts) take about 0.7 s.
Two granularity corrections: spot devices only count in whole SP groups
(usable = ⌊live / sp⌋ · sp), and a rollout is padded to whole rounds of the groups live at its start
(the last round leaves groups idle while the slowest request finishes).

Preemptions come from the availability timeline (a real trace, scaled in time and mapped onto the
spot pool's size, replayed from the start when the run outlasts it). Assumptions, stated where the
overheads are computed (`_phase_overheads`): a preemption takes whole SP groups (groups live inside
one machine); with a notice at least one denoising step long, the in-flight request finishes its
step and commits, so it loses at most one step; without one, the work since its last commit (on
average half a request) is lost. Recovery is `elastic` (per-node agents re-form the hit groups in
`elastic_reconfigure_s`; a joining device is billed from its join and adds capacity only once it
holds the weights, `weight_copy_s` later) or `cold` (a static process group: every removal stalls
the whole phase's pool for `cold_restart_s`; a joining device cold-starts on its own). The
on-demand pool is never preempted. Removals while the pool idles (training in spot-rollout and
sync-explore) or receives weights cost nothing. Billing: every live spot device from its start to
its preemption in the modes that rent spot; vanilla rents none.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, get_args

import numpy as np
import torch
from pydantic import Field, model_validator

from spotlight.explore.planner import ExplorationPlanner, ExplorePlan, PlannerConfig, round_budget
from spotlight.market.billing import CostMeter, Phase, Usage
from spotlight.market.pools import POOLS, Pool
from spotlight.market.prices import Offering, PriceError, load_prices, price_override
from spotlight.market.traces import Availability, resolve_trace
from spotlight.schema import ConfigError, Section
from spotlight.sim.convergence import ConvergenceConfig, SignalConfig, SignalModel, resolve_convergence
from spotlight.sim.workload import (
    DeviceTimes,
    WorkloadConfig,
    device_times,
    explore_cost_factor,
    measured_device_times,
)

__all__ = [
    "MODES",
    "ClusterConfig",
    "IterationRecord",
    "LoopConfig",
    "MixRow",
    "MixSweep",
    "Mode",
    "SimConfig",
    "SimResult",
    "SpotTimeline",
    "cheapest_mix",
    "price_sources",
    "simulate",
]

Mode = Literal["vanilla", "spot-rollout", "sync-explore", "spotlight"]
MODES: tuple[Mode, ...] = get_args(Mode)
_USES_SPOT: dict[Mode, bool] = {"vanilla": False, "spot-rollout": True, "sync-explore": True, "spotlight": True}

# A phase whose overheads keep outrunning its progress (e.g. cold restarts longer than the gaps
# between preemptions) never ends; past this horizon it is declared stalled.
_STALL_HORIZON_S = 1e9


class ClusterConfig(Section):
    """The devices, their prices and their preemptions.

    trace: a path, or the name of a trace shipped in the package (`traces.find_trace`). Its live
    count is mapped onto `spot_devices` (count · spot_devices / the trace's peak, rounded down) and
    its times multiplied by `trace_time_scale`. notice_s: warning before a preemption (AWS gives
    120 s, GCP 30 s; 0 = none). recovery: `elastic` (agents re-form SP groups in
    `elastic_reconfigure_s`, sub-second) or `cold` (restart the pool's processes, `cold_restart_s`:
    process start, imports, loading 40 GB of weights from storage, a new process group — minutes;
    the default 120 s is an assumption until the runtime's recovery benchmark measures it).
    """

    on_demand_devices: int = Field(32, ge=1)
    spot_devices: int = Field(32, ge=0)
    on_demand_instance: str = "p5.48xlarge"
    spot_instance: str = "p5.48xlarge"
    price_overrides: dict[str, dict[str, Any]] = Field(default_factory=dict)
    trace: str = "aws-p3-bamboo.csv"
    trace_time_scale: float = Field(1.0, gt=0)
    notice_s: float = Field(120.0, ge=0)
    recovery: Literal["elastic", "cold"] = "elastic"
    elastic_reconfigure_s: float = Field(0.5, ge=0)
    cold_restart_s: float = Field(120.0, ge=0)


class LoopConfig(Section):
    """The GRPO loop's shape: P prompts × G samples per iteration, and when to stop.

    explore_wait_s (spotlight): how long the trainer waits, after training, for an exploration
    round that has not finished, before cancelling the rest (the runtime's `runtime.explore_wait_s`,
    default 15 s there); 0 cuts exploration off when training ends. initial_budget_s: the planner's
    budget for the first round, before any update has been timed (the runtime's
    `explore.initial_budget_s`); None: the training time. Later rounds get the previous update's
    time, as in the runtime. monitor_prompts (spotlight): the staleness monitor's re-score, as the
    runtime's `explore.monitor_prompts` (4 there; 0 = none): each round also re-scores that many of
    the previous round's prompts with its plan, after its own candidates, and the planner's budget
    is reduced by its predicted time (`round_budget`).
    """

    prompts_per_iteration: int = Field(32, ge=1)
    group_size: int = Field(16, ge=2)
    max_iterations: int = Field(1000, ge=1)
    stop_at_target: bool = True
    explore_wait_s: float = Field(0.0, ge=0)
    initial_budget_s: float | None = Field(None, gt=0)
    monitor_prompts: int = Field(0, ge=0)


class SimConfig(Section):
    """Everything `simulate` needs; the defaults simulate Qwen-Image at 1280² on 32 + 32 H100s."""

    mode: Mode = "spotlight"
    seed: int = 0
    cluster: ClusterConfig = ClusterConfig()
    workload: WorkloadConfig = WorkloadConfig()
    loop: LoopConfig = LoopConfig()
    planner: PlannerConfig = PlannerConfig(num_candidates=(16, 32, 64, 128))
    signal: SignalConfig = SignalConfig()
    convergence: ConvergenceConfig = ConvergenceConfig()

    @model_validator(mode="after")
    def _candidates_cover_group(self) -> SimConfig:
        smallest = min(self.planner.num_candidates)
        if smallest < self.loop.group_size:
            raise ValueError(
                f"planner.num_candidates must all be >= loop.group_size ({smallest} < {self.loop.group_size}); "
                "drop the smaller values or lower the group size"
            )
        return self


# ---------------------------------------------------------------------------------------------
# The spot pool over time


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


# ---------------------------------------------------------------------------------------------
# Results


@dataclass(frozen=True)
class IterationRecord:
    """One iteration of the simulated loop. Times in seconds from the start of the run.

    sync_explore_s: exploration on the critical path (sync-explore only); explore_s: spot
    exploration from the start of training (spotlight only; ≤ train_s + loop.explore_wait_s);
    explore_wait_s: the trainer's wait after training, for the round past training (idle on
    on-demand) and for scoring its candidates on on-demand (the runtime's `time/explore_wait_s`);
    spot_explore_train_s: spot device-seconds of exploration while the trainer trained; plan: the (N, S) plan whose
    seeds this rollout used, None for random seeds; explored_prompts: prompts whose seeds it chose;
    group_std / random_std: the realised mean group reward std and what random seeds would have
    given; progress: cumulative fraction of the way to the target after this iteration; dollars:
    cumulative cost at its end; spot_removed: spot devices preempted during it.
    """

    iteration: int
    start_s: float
    sync_explore_s: float
    rollout_s: float
    train_s: float
    explore_s: float
    explore_wait_s: float
    spot_explore_train_s: float
    broadcast_s: float
    end_s: float
    spot_live: int
    plan: tuple[int, int] | None
    explored_prompts: int
    group_std: float
    random_std: float
    progress: float
    dollars: float
    spot_removed: int


@dataclass(frozen=True)
class SimResult:
    """What `simulate` returns.

    reached: whether the target was reached within loop.max_iterations; time_to_target_s and
    dollars_to_target: at the end of the iteration that reached it (inf when not reached);
    iterations_to_target: that iteration's count (None when not reached); usage: per pool, the
    device-seconds per phase of the whole simulated run, its dollars and utilisation;
    alpha / alpha_source: the convergence exponent used and where it came from.
    """

    mode: Mode
    reached: bool
    time_to_target_s: float
    dollars_to_target: float
    iterations_to_target: int | None
    iterations_run: int
    simulated_s: float
    dollars: float
    usage: dict[Pool, Usage]
    timeline: list[IterationRecord]
    alpha: float
    alpha_source: str
    prices_per_gpu_hour: dict[Pool, float] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        """Return the headline numbers and per-pool utilisation as plain (JSON-able) data."""
        return {
            "mode": self.mode,
            "reached": self.reached,
            "time_to_target_h": self.time_to_target_s / 3600.0,
            "dollars_to_target": self.dollars_to_target,
            "iterations_to_target": self.iterations_to_target,
            "mean_iteration_s": self.simulated_s / max(1, self.iterations_run),
            "mean_group_std": _mean([r.group_std for r in self.timeline]),
            "mean_random_std": _mean([r.random_std for r in self.timeline]),
            "spot_removed": sum(r.spot_removed for r in self.timeline),
            "alpha": self.alpha,
            "alpha_source": self.alpha_source,
            "utilisation": {pool: self.usage[pool].utilisation for pool in POOLS},
            "phase_shares": {pool: self.usage[pool].shares() for pool in POOLS},
            "dollars_by_pool": {pool: self.usage[pool].dollars for pool in POOLS},
            "prices_per_gpu_hour": self.prices_per_gpu_hour,
        }

    def timeline_dicts(self) -> list[dict[str, Any]]:
        """Return the per-iteration timeline as a list of plain dicts."""
        return [asdict(record) for record in self.timeline]


def _mean(values: list[float]) -> float:
    return float(np.mean(values)) if values else math.nan


# ---------------------------------------------------------------------------------------------
# The simulation


@dataclass(frozen=True)
class _Pools:
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
class _PhaseOutcome:
    """A phase's end and its bookings per pool: useful work, overheads (device-seconds)."""

    end_s: float
    work_done: float  # sample-steps
    busy_s: dict[Pool, float]
    reconfiguring_s: dict[Pool, float]
    lost_s: dict[Pool, float]


class _Simulation:
    """One run of the loop; `run` returns the SimResult. State lives here, decisions in the runtime's code."""

    def __init__(self, config: SimConfig, trace: Availability, prices: Mapping[str, Offering]) -> None:
        self.config = config
        self.cluster = config.cluster
        self.mode: Mode = config.mode
        self.uses_spot = _USES_SPOT[config.mode] and config.cluster.spot_devices > 0
        od_offering = _offering(prices, self.cluster.on_demand_instance, "cluster.on_demand_instance")
        spot_offering = _offering(prices, self.cluster.spot_instance, "cluster.spot_instance")
        od_price = _price(od_offering, "on_demand", "cluster.on_demand_instance")
        spot_price = _price(spot_offering, "spot", "cluster.spot_instance") if self.uses_spot else 0.0
        self.prices: dict[Pool, float] = {"on_demand": od_price, "spot": spot_price}
        workload = config.workload
        sp = workload.sp_degree
        od_usable = (self.cluster.on_demand_devices // sp) * sp
        if od_usable == 0:
            raise ConfigError(
                f"cluster.on_demand_devices ({self.cluster.on_demand_devices}) is below workload.sp_degree "
                f"({sp}): no SP group fits; add on-demand devices or lower the SP degree"
            )
        self.gpus_per_machine = (od_offering.gpus_per_machine, spot_offering.gpus_per_machine)
        self.od_usable = od_usable
        try:
            self._use_times(workload)
        except ValueError as error:
            raise ConfigError(str(error)) from None
        spot_devices = self.cluster.spot_devices if self.uses_spot else 0
        self.spot = SpotTimeline(trace, spot_devices, self.cluster.trace_time_scale, sp)
        self.meter = CostMeter(od_price, spot_price)
        self.planner = ExplorationPlanner(config.planner)
        self.signal = SignalModel(config.signal, workload.rollout_steps, config.seed)
        try:
            self.alpha, self.alpha_source = resolve_convergence(config.convergence)
        except ValueError as error:
            raise ConfigError(f"convergence.measured: {error}") from None

    def _use_times(self, workload: WorkloadConfig) -> None:
        """Set the pools' device times, the training time and exploration's cost from `workload`."""
        measured = workload.measured
        od_gpus, spot_gpus = self.gpus_per_machine
        self.pools = _Pools(
            od=device_times(workload, od_gpus) if measured is None
            else measured_device_times(workload, measured.on_demand_sample_step_s),
            spot=device_times(workload, spot_gpus) if measured is None
            else measured_device_times(workload, measured.spot_sample_step_s),
            od_devices=self.cluster.on_demand_devices,
            od_usable=self.od_usable,
        )
        self.explore_cost = explore_cost_factor(workload)
        self.samples = self.config.loop.prompts_per_iteration * self.config.loop.group_size
        self.train_s = self.pools.od.train_s(workload, self.samples, self.cluster.on_demand_devices)
        self.score_candidate_s = 0.0 if measured is None else measured.score_candidate_s

    def _use_iteration_times(self, iteration: int) -> None:
        """Replay iteration `iteration`'s own measured times when the workload has them (`MeasuredTimes.at`)."""
        measured = self.config.workload.measured
        if measured is not None and measured.per_iteration is not None:
            self._use_times(self.config.workload.model_copy(update={"measured": measured.at(iteration)}))

    # --- phases ------------------------------------------------------------------------------
    def _phase_overheads(
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
        sp = self.config.workload.sp_degree
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

    def _run_phase(
        self, t0: float, work: float, padded_work: float, steps_per_request: int, use_od: bool, deadline_s: float
    ) -> _PhaseOutcome:
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
            reconfiguring, lost = self._phase_overheads(t0, horizon, steps_per_request, use_od)
            overhead_work = (reconfiguring["spot"] + lost["spot"]) * spot_rate + reconfiguring["on_demand"] * (
                od_rate / max(1, self.pools.od_usable)
            )
            new_end = self.spot.time_to_capacity(t0, padded_work + overhead_work, od_rate, spot_rate)
            if new_end <= end * (1 + 1e-12) or new_end >= deadline_s or new_end - t0 > _STALL_HORIZON_S:
                end = new_end
                break
            end = new_end
        if end - t0 > _STALL_HORIZON_S and deadline_s == math.inf:
            raise _Stalled(t0)
        end = min(end, deadline_s)
        reconfiguring, lost = self._phase_overheads(t0, end, steps_per_request, use_od)
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
        return _PhaseOutcome(end, work_done, busy_s, reconfiguring, lost)

    def _book(self, t0: float, t1: float, phase: Phase, outcome: _PhaseOutcome | None, od_phase: Phase | None) -> None:
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

    def _explore_work(self, plan: ExplorePlan, num_prompts: int | None = None) -> float:
        """Return a plan's work on `num_prompts` prompts (default: an iteration's) in rollout
        sample-steps: candidate-steps × exploration's relative cost."""
        prompts = self.config.loop.prompts_per_iteration if num_prompts is None else num_prompts
        return float(plan.num_candidates * plan.num_steps * prompts) * self.explore_cost

    def _observe_cost(self, plan: ExplorePlan, outcome: _PhaseOutcome, own_work: float) -> None:
        """Tell the planner what a round cost, as the runtime's `_close_round` does: only for a round
        whose own candidates all finished, the devices' busy seconds times its own share of the work
        (the rest is the monitor's), over all its candidates."""
        if outcome.work_done < own_work * (1 - 1e-9):
            return
        seconds = sum(outcome.busy_s.values()) * own_work / outcome.work_done
        self.planner.observe_cost(plan, seconds, plan.num_candidates * self.config.loop.prompts_per_iteration,
                                  plan.num_steps)

    def _explore_behind(
        self, t0: float, train_end: float, plan: ExplorePlan, monitor: tuple[ExplorePlan, int] | None
    ) -> tuple[int, float, float, float]:
        """Explore `plan` on spot from t0 while the trainer trains until `train_end`, as the runtime's
        `_open_round` / `_close_round` do; book it and return (prompts explored, exploration time,
        the trainer's wait after training, spot device-seconds explored during training).

        Past `train_end` the trainer waits for the round until `train_end + loop.explore_wait_s`
        (idle on-demand time; the spot devices go on exploring), then cancels what is left; then it
        scores every candidate of the round on the on-demand pool (measured `score_candidate_s`
        device-seconds each), the spot devices idling. The monitor's re-score (`monitor`: the
        previous plan, its prompts) is queued after the round's own candidates. Prompts count as
        explored in proportion to the own work done.
        """
        loop = self.config.loop
        prompts = loop.prompts_per_iteration
        own = self._explore_work(plan)
        work = own + (0.0 if monitor is None else self._explore_work(*monitor))
        during = self._run_phase(t0, work, work, plan.num_steps, False, train_end)
        self._book(t0, train_end, "explore", during, "train")
        outcome, closed = during, train_end
        left = work - during.work_done
        if left > 1e-9 * work and loop.explore_wait_s > 0:
            after = self._run_phase(train_end, left, left, plan.num_steps, False, train_end + loop.explore_wait_s)
            self._book(train_end, after.end_s, "explore", after, None)
            outcome, closed = _joined(during, after), after.end_s
        self._observe_cost(plan, outcome, own)
        score_s = self.score_candidate_s * prompts * plan.num_candidates / self.pools.od_usable
        if score_s > 0:
            self._book(closed, closed + score_s, "explore", None, "explore")
        explored = math.floor(prompts * min(outcome.work_done, own) / own + 1e-9)
        return explored, outcome.end_s - t0, closed - train_end + score_s, during.busy_s["spot"]

    # --- the loop ----------------------------------------------------------------------------
    def run(self) -> SimResult:
        config = self.config
        loop = config.loop
        workload = config.workload
        prompts, group = loop.prompts_per_iteration, loop.group_size
        sp, batch, steps = workload.sp_degree, workload.batch_size, workload.rollout_steps
        rollout_work = float(self.samples * steps)
        requests = math.ceil(self.samples / batch)

        t = 0.0
        progress = 0.0
        timeline: list[IterationRecord] = []
        reached_at: IterationRecord | None = None
        next_plan: ExplorePlan | None = None  # spotlight: plan explored during the previous training
        next_explored = 0
        budget_s = None  # the planner's budget: the previous update's time, as the runtime's Trainer.budget_s
        monitor: tuple[ExplorePlan, int] | None = None  # spotlight: the re-score riding in the next round
        for iteration in range(loop.max_iterations):
            self._use_iteration_times(iteration)
            if budget_s is None:
                budget_s = loop.initial_budget_s if loop.initial_budget_s is not None else self.train_s
            start = t
            spot_live = self.spot.live_at(t) if self.uses_spot else 0
            # 1. sync-explore: explore P_i with fresh θ_i on every device, on the critical path.
            plan, explored, stale, sync_s = None, 0, False, 0.0
            if self.mode == "sync-explore":
                devices = self.pools.od_usable + (self.spot.usable_at(t) if self.uses_spot else 0)
                decision = self.planner.choose(budget_s, devices, prompts)
                if decision.plan is not None:
                    plan = decision.plan
                    work = self._explore_work(plan)
                    outcome = self._run_phase(t, work, work, plan.num_steps, True, math.inf)
                    self._book(t, outcome.end_s, "explore", outcome, None)
                    self._observe_cost(plan, outcome, work)
                    sync_s, t, explored = outcome.end_s - t, outcome.end_s, prompts
            elif self.mode == "spotlight":
                plan, explored, stale = next_plan, next_explored, True

            # 2. rollout P_i × G on the devices holding θ_i, padded to whole rounds of the groups live now.
            groups = self.pools.od_usable // sp + (self.spot.usable_at(t) // sp if self.uses_spot else 0)
            padded = math.ceil(requests / groups) * groups * batch * steps
            outcome = self._run_phase(t, rollout_work, float(padded), steps, True, math.inf)
            self._book(t, outcome.end_s, "rollout", outcome, None)
            rollout_s, t = outcome.end_s - t, outcome.end_s
            signal = self.signal.draw(progress, prompts, group, plan, explored, stale)
            if plan is not None and explored > 0:
                self.planner.observe_reward(plan, signal.explored_variance)
            ratio = signal.group_std / signal.random_std if signal.random_std > 0 else 1.0
            progress += ratio**self.alpha / config.convergence.vanilla_iterations

            # 3. train θ_i → θ_{i+1} on on-demand; spotlight explores P_{i+1} on spot meanwhile (not in
            # the last iteration: nothing would use it), waits for it and scores it (`_explore_behind`).
            train_end = t + self.train_s
            explore_s, wait_s, spot_explore_train_s = 0.0, 0.0, 0.0
            next_plan, next_explored = None, 0
            if self.mode == "spotlight" and self.uses_spot and iteration + 1 < loop.max_iterations:
                devices = self.spot.usable_at(t)
                decision = self.planner.choose(round_budget(self.planner, budget_s, devices, monitor), devices, prompts)
                if decision.plan is not None:
                    next_plan = decision.plan
                    next_explored, explore_s, wait_s, spot_explore_train_s = self._explore_behind(
                        t, train_end, next_plan, monitor)
                    shown = min(loop.monitor_prompts, prompts)
                    monitor = (next_plan, shown) if shown > 0 else None
                else:
                    monitor = None
                    self._book(t, train_end, "explore", None, "train")
            else:
                self._book(t, train_end, "train", None, "train")
            budget_s = self.train_s
            t = train_end + wait_s

            # 4. broadcast θ_{i+1} to the spot devices (the trainer already holds it).
            broadcast_s = self.pools.spot.broadcast_s if self.uses_spot else 0.0
            if broadcast_s > 0:
                self.meter.book("on_demand", "broadcast", self.pools.od_devices * broadcast_s)
                self.meter.book("spot", "broadcast", self.spot.live_device_seconds(t, t + broadcast_s))
                t += broadcast_s

            record = IterationRecord(
                iteration=iteration,
                start_s=start,
                sync_explore_s=sync_s,
                rollout_s=rollout_s,
                train_s=self.train_s,
                explore_s=explore_s,
                explore_wait_s=wait_s,
                spot_explore_train_s=spot_explore_train_s,
                broadcast_s=broadcast_s,
                end_s=t,
                spot_live=spot_live,
                plan=(plan.num_candidates, plan.num_steps) if plan is not None and explored > 0 else None,
                explored_prompts=explored,
                group_std=signal.group_std,
                random_std=signal.random_std,
                progress=progress,
                dollars=self.meter.dollars,
                spot_removed=self.spot.events(start, t)["removed"] if self.uses_spot else 0,
            )
            timeline.append(record)
            if reached_at is None and progress >= 1.0 - 1e-9:
                reached_at = record
                if loop.stop_at_target:
                    break

        return SimResult(
            mode=self.mode,
            reached=reached_at is not None,
            time_to_target_s=reached_at.end_s if reached_at else math.inf,
            dollars_to_target=reached_at.dollars if reached_at else math.inf,
            iterations_to_target=reached_at.iteration + 1 if reached_at else None,
            iterations_run=len(timeline),
            simulated_s=t,
            dollars=self.meter.dollars,
            usage={pool: self.meter.usage(pool) for pool in POOLS},
            timeline=timeline,
            alpha=self.alpha,
            alpha_source=self.alpha_source,
            prices_per_gpu_hour=dict(self.prices),
        )


def _joined(first: _PhaseOutcome, second: _PhaseOutcome) -> _PhaseOutcome:
    """One phase run in two pieces, `second` right after `first`: its end and summed bookings."""
    return _PhaseOutcome(
        end_s=second.end_s,
        work_done=first.work_done + second.work_done,
        busy_s={pool: first.busy_s[pool] + second.busy_s[pool] for pool in POOLS},
        reconfiguring_s={pool: first.reconfiguring_s[pool] + second.reconfiguring_s[pool] for pool in POOLS},
        lost_s={pool: first.lost_s[pool] + second.lost_s[pool] for pool in POOLS},
    )


class _Stalled(RuntimeError):
    """A phase that never ends: overheads outrun progress (e.g. cold restarts longer than the gaps)."""

    def __init__(self, t0: float) -> None:
        super().__init__(f"a phase starting at {t0:.0f} s never ends: preemption overheads outrun its progress")


def _offering(prices: Mapping[str, Offering], instance: str, where: str) -> Offering:
    if instance not in prices:
        raise ConfigError(f"{where}: unknown instance {instance!r}; known: {', '.join(sorted(prices))}")
    return prices[instance]


def _price(offering: Offering, kind: Pool, where: str) -> float:
    try:
        return offering.per_gpu_hour(kind)
    except PriceError as error:
        raise ConfigError(f"{where}: {error}") from None


def simulate(
    config: SimConfig,
    trace: Availability | None = None,
    prices: Mapping[str, Offering] | None = None,
) -> SimResult:
    """Return the SimResult of running `config`'s loop on its cluster.

    trace: the spot availability (default: `cluster.trace` loaded from disk); prices: the price
    table (default: the packaged one with `cluster.price_overrides` applied). A run whose phases
    stall forever (overheads outrun progress) returns reached=False with the iterations it did.
    Raises ConfigError for an unknown instance, a missing price or an impossible SP layout.
    """
    if trace is None:
        trace = resolve_trace(config.cluster.trace, "cluster.trace")
    if prices is None:
        prices = price_override(load_prices(), config.cluster.price_overrides, "cluster.price_overrides")
    simulation = _Simulation(config, trace, prices)
    try:
        with _single_threaded_torch():
            return simulation.run()
    except _Stalled:
        return _stalled_result(simulation)


@contextmanager
def _single_threaded_torch() -> Iterator[None]:
    """Run torch on one thread inside, restoring the caller's setting after.

    The only tensors here are the (P, N) candidate rewards of `select_seeds` (at most a few
    hundred by a hundred): spreading them over threads costs more than it saves — 10× on a busy
    2-core machine, measured (44 ms vs 1.3 ms a call).
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _stalled_result(simulation: _Simulation) -> SimResult:
    return SimResult(
        mode=simulation.mode,
        reached=False,
        time_to_target_s=math.inf,
        dollars_to_target=math.inf,
        iterations_to_target=None,
        iterations_run=0,
        simulated_s=math.inf,
        dollars=simulation.meter.dollars,
        usage={pool: simulation.meter.usage(pool) for pool in POOLS},
        timeline=[],
        alpha=simulation.alpha,
        alpha_source=simulation.alpha_source,
        prices_per_gpu_hour=dict(simulation.prices),
    )


# ---------------------------------------------------------------------------------------------
# Which cluster to rent


@dataclass(frozen=True)
class MixRow:
    """One simulated cluster mix: its devices, price sources and outcome."""

    on_demand_devices: int
    spot_devices: int
    on_demand_instance: str
    spot_instance: str
    time_to_target_s: float
    dollars_to_target: float
    meets_deadline: bool


@dataclass(frozen=True)
class MixSweep:
    """The cheapest mix that meets the deadline (None when none does) and every mix tried."""

    best: MixRow | None
    rows: list[MixRow]


def price_sources(prices: Mapping[str, Offering]) -> list[tuple[str, str]]:
    """Return every (on-demand instance, spot instance) pair of one provider that has both prices."""
    on_demand = [o for o in prices.values() if o.on_demand_per_hour is not None]
    spot = [o for o in prices.values() if o.spot_per_hour is not None]
    return [(a.instance, b.instance) for a in on_demand for b in spot if a.provider == b.provider]


def cheapest_mix(
    deadline_s: float,
    base: SimConfig | None = None,
    on_demand_options: Sequence[int] = (8, 16, 32, 64),
    spot_options: Sequence[int] = (0, 16, 32, 64),
    sources: Sequence[tuple[str, str]] | None = None,
    prices: Mapping[str, Offering] | None = None,
    trace: Availability | None = None,
    on_result: Callable[[MixRow], None] | None = None,
) -> MixSweep:
    """Return the cheapest cluster mix whose simulated time to target is within `deadline_s`.

    Sweeps on_demand_options × spot_options × sources ((on-demand instance, spot instance) pairs;
    default: every same-provider pair with both prices), simulating `base` (default SimConfig())
    with each; dollars to target decides, then time. `on_result` sees each row as it is done.
    """
    if not (deadline_s > 0):
        raise ValueError(f"cheapest_mix: deadline_s must be > 0 seconds (got {deadline_s})")
    base = base if base is not None else SimConfig()
    if prices is None:
        prices = price_override(load_prices(), base.cluster.price_overrides, "cluster.price_overrides")
    if trace is None:
        trace = resolve_trace(base.cluster.trace, "cluster.trace")
    sources = list(sources) if sources is not None else price_sources(prices)
    if not sources:
        raise ValueError("cheapest_mix: no price source has both an on-demand and a spot price; pass sources")
    rows: list[MixRow] = []
    for on_demand, spot, (od_instance, spot_instance) in itertools.product(on_demand_options, spot_options, sources):
        cluster = base.cluster.model_copy(update={
            "on_demand_devices": on_demand, "spot_devices": spot,
            "on_demand_instance": od_instance, "spot_instance": spot_instance,
        })
        result = simulate(base.model_copy(update={"cluster": cluster}), trace=trace, prices=prices)
        row = MixRow(on_demand, spot, od_instance, spot_instance, result.time_to_target_s,
                     result.dollars_to_target, result.reached and result.time_to_target_s <= deadline_s)
        rows.append(row)
        if on_result is not None:
            on_result(row)
    meeting = [row for row in rows if row.meets_deadline]
    best = min(meeting, key=lambda row: (row.dollars_to_target, row.time_to_target_s)) if meeting else None
    return MixSweep(best, rows)

