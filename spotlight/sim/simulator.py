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
overheads are computed (`phases.PhaseRunner.overheads`): a preemption takes whole SP groups (groups live inside
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

import math
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import torch

from spotlight.explore.planner import ExplorationPlanner, ExplorePlan, round_budget
from spotlight.market.billing import CostMeter
from spotlight.market.pools import POOLS, Pool
from spotlight.market.prices import Offering, PriceError, load_prices, price_override
from spotlight.market.traces import Availability, resolve_trace
from spotlight.modes import Mode
from spotlight.schema import ConfigError
from spotlight.sim.convergence import SignalModel, resolve_convergence
from spotlight.sim.phases import PhaseOutcome, PhaseRunner, PoolTimes, Stalled, joined
from spotlight.sim.results import IterationRecord, SimResult
from spotlight.sim.sim_config import SIMULATED_MODES, SimConfig, not_simulated
from spotlight.sim.spot_timeline import SpotTimeline
from spotlight.sim.workload import (
    WorkloadSection,
    device_times,
    explore_cost_factor,
    measured_device_times,
)

__all__ = ["simulate"]


class _Simulation:
    """One run of the loop; `run` returns the SimResult. State lives here, decisions in the runtime's code."""

    def __init__(self, config: SimConfig, trace: Availability, prices: Mapping[str, Offering]) -> None:
        self.config = config
        self.cluster = config.cluster
        if config.mode not in SIMULATED_MODES:  # a config changed by model_copy skips the field's validator
            raise ConfigError(not_simulated(config.mode))
        self.mode: Mode = config.mode
        self.uses_spot = config.mode.rents_spot and config.cluster.spot_devices > 0
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
        spot_devices = self.cluster.spot_devices if self.uses_spot else 0
        self.spot = SpotTimeline(trace, spot_devices, self.cluster.trace_time_scale, sp)
        self.meter = CostMeter(od_price, spot_price)
        self.phases = PhaseRunner(self.cluster, sp, self.spot, self.meter, self.uses_spot)
        try:
            self._use_times(workload)
        except ValueError as error:
            raise ConfigError(str(error)) from None
        self.planner = ExplorationPlanner(config.planner)
        self.signal = SignalModel(config.signal, workload.rollout_steps, config.seed)
        try:
            self.alpha, self.alpha_source = resolve_convergence(config.convergence)
        except ValueError as error:
            raise ConfigError(f"convergence.measured: {error}") from None

    def _use_times(self, workload: WorkloadSection) -> None:
        """Set the pools' device times, the training time and exploration's cost from `workload`."""
        measured = workload.measured
        od_gpus, spot_gpus = self.gpus_per_machine
        self.phases.pools = PoolTimes(
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

    @property
    def pools(self) -> PoolTimes:
        """The device times now (per iteration when measured per iteration)."""
        return self.phases.pools

    def _use_iteration_times(self, iteration: int) -> None:
        """Replay iteration `iteration`'s own measured times when the workload has them (`MeasuredTimes.at`)."""
        measured = self.config.workload.measured
        if measured is not None and measured.per_iteration is not None:
            self._use_times(self.config.workload.model_copy(update={"measured": measured.at(iteration)}))

    def _explore_work(self, plan: ExplorePlan, num_prompts: int | None = None) -> float:
        """Return a plan's work on `num_prompts` prompts (default: an iteration's) in rollout
        sample-steps: candidate-steps × exploration's relative cost."""
        prompts = self.config.loop.prompts_per_iteration if num_prompts is None else num_prompts
        return float(plan.num_candidates * plan.num_steps * prompts) * self.explore_cost

    def _observe_cost(self, plan: ExplorePlan, outcome: PhaseOutcome, own_work: float) -> None:
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
        during = self.phases.run(t0, work, work, plan.num_steps, False, train_end)
        self.phases.book(t0, train_end, "explore", during, "train")
        outcome, closed = during, train_end
        left = work - during.work_done
        if left > 1e-9 * work and loop.explore_wait_s > 0:
            after = self.phases.run(train_end, left, left, plan.num_steps, False, train_end + loop.explore_wait_s)
            self.phases.book(train_end, after.end_s, "explore", after, None)
            outcome, closed = joined(during, after), after.end_s
        self._observe_cost(plan, outcome, own)
        score_s = self.score_candidate_s * prompts * plan.num_candidates / self.pools.od_usable
        if score_s > 0:
            self.phases.book(closed, closed + score_s, "explore", None, "explore")
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
                    outcome = self.phases.run(t, work, work, plan.num_steps, True, math.inf)
                    self.phases.book(t, outcome.end_s, "explore", outcome, None)
                    self._observe_cost(plan, outcome, work)
                    sync_s, t, explored = outcome.end_s - t, outcome.end_s, prompts
            elif self.mode == "spotlight":
                plan, explored, stale = next_plan, next_explored, True

            # 2. rollout P_i × G on the devices holding θ_i, padded to whole rounds of the groups live now.
            groups = self.pools.od_usable // sp + (self.spot.usable_at(t) // sp if self.uses_spot else 0)
            padded = math.ceil(requests / groups) * groups * batch * steps
            outcome = self.phases.run(t, rollout_work, float(padded), steps, True, math.inf)
            self.phases.book(t, outcome.end_s, "rollout", outcome, None)
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
                    self.phases.book(t, train_end, "explore", None, "train")
            else:
                self.phases.book(t, train_end, "train", None, "train")
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
    except Stalled:
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
