"""The Spotlight loop on Ray (orchestration, beside pipeline.py: it runs the RL code of pipeline.py over the
runtime's pools; runtime/ itself knows nothing of GRPO): one iteration spread over on-demand and spot devices.

    iteration i  (θ_i goes to every spot device once, through the object store)
      seeds     spotlight: chosen by the exploration that ran during iteration i-1's training
                sync-explore: explore P_i with θ_i on the spot devices now (on the critical path)
                vanilla / spot-rollout: random
      rollout   P_i's groups split over the on-demand device and the spot devices holding θ_i
      train     θ_i → θ_{i+1} on the on-demand device; in spotlight mode, AT THE SAME TIME, the spot
                devices explore P_{i+1} with θ_i through the queue, under the planner's budget (the
                predicted training time), plus a re-score of a few of P_i's candidates with θ_i
                for the staleness monitor (Kendall τ of stale vs fresh rankings)

The driver is the on-demand device (single-threaded, on the node offering ``on_demand``) and the
single controller. The RL maths is pipeline.py's (`Trainer.train_step`, `score_rollout`,
`select_explored`, the planner, the monitor): this module only decides where it runs. A controller
thread keeps the pools moving while the main thread computes: it replays the preemption trace
(notice → the node's devices commit and stop → the node is removed; later a node joins and gets a
fresh device and the current weights), hands idle spot devices exploration work while a round is
open, and collects finished calls. Lost rollout parts are redone on the on-demand device; lost
exploration requests resume from their committed latents on whichever device pulls them next.
"""

from __future__ import annotations

import dataclasses
import json
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import ray
import torch
from ray.exceptions import GetTimeoutError, RayError

from spotlight.config import TrainConfig
from spotlight.diffusion.sampler import Trajectory
from spotlight.explore.candidates import exploration_sampling, score_latents
from spotlight.explore.planner import ExplorationPlanner, ExplorePlan, round_budget
from spotlight.generation import generate
from spotlight.market.billing import DeviceLedger
from spotlight.market.prices import default_prices
from spotlight.market.traces import resolve_trace
from spotlight.models.tinydit import TinyDiTConfig
from spotlight.pipeline import (
    Exploration,
    RunError,
    RunSummary,
    Trainer,
    candidate_seeds,
    group_requests,
    iteration_generator,
    iteration_prompts,
    rollout_plan,
    score_rollout,
    select_explored,
)
from spotlight.rewards.base import Reward
from spotlight.runtime.attached import AttachedSpotNodes
from spotlight.runtime.device import ComputeClock
from spotlight.runtime.elastic_sp import ElasticSP, ElasticSPSettings, LocalSpotNodes
from spotlight.runtime.events import EventLog
from spotlight.runtime.pools import CallResult, LocalCluster, PoolError, SpotPool, attach_cluster
from spotlight.runtime.preemption import TraceReplay
from spotlight.runtime.queue import Request, start_queue_actor
from spotlight.runtime.watchers import WatchSettings
from spotlight.runtime.worker import WorkerSettings, model_weights

__all__ = ["RayRuntime", "run_on_ray", "uses_ray"]

ON_DEMAND = "on-demand-0"
TICK_S = 0.02
# With SP groups (runtime.sp_degree > 1) each spot node runs an agent and its device processes: on a
# loaded machine their raylets miss Ray's default health checks (5 x 3 s) and live nodes are declared
# dead. Trace removals never wait on the check (the controller acts on the notice), so it can be tolerant.
SP_HEAD_SYSTEM_CONFIG = {"health_check_failure_threshold": 20, "health_check_timeout_ms": 20000}


def uses_ray(config: TrainConfig) -> bool:
    """Whether ``config`` runs on the Ray runtime (always for spot-rollout / spotlight)."""
    return config.uses_ray


def run_on_ray(config: TrainConfig, resume: bool = False, reward: Reward | None = None,
               on_iteration: Callable[[int, dict[str, Any]], None] | None = None) -> RunSummary:
    """Start the pools, run the loop, tear the pools down; the history as `Trainer.run` returns it."""
    if config.mode == "stale-explore":
        raise RunError("mode stale-explore runs in one process only: set runtime.use_ray=false, or use mode spotlight "
                       "(stale exploration hidden behind training on spot devices)")
    runtime = RayRuntime(config, reward=reward, resume=resume)
    try:
        return runtime.run(on_iteration)
    finally:
        runtime.close()


@dataclass
class Round:
    """One exploration round: candidates of ``target``'s prompts denoised with θ_version via the queue."""

    target: int
    version: int
    plan: ExplorePlan
    prompts: list[str]
    candidates: torch.Tensor  # (P, N)
    ids: list[str]
    monitor: dict[str, Any] | None = None  # fresh re-score of the previous round's first prompts
    opened_at: float = 0.0
    drained: bool = False
    device_s: float = 0.0
    pull_trips_s: list[float] = field(default_factory=list)
    plan_metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class Explored:
    """A finished round, ready to seed its iteration: the selection and the candidates' rewards."""

    round: Round
    exploration: Exploration
    rewards: torch.Tensor
    plan_metrics: dict[str, float]


class RayRuntime:
    """The pools, the controller thread and the per-iteration `step` (see the module docstring)."""

    def __init__(self, config: TrainConfig, reward: Reward | None = None, resume: bool = False) -> None:
        if resume:
            raise RunError("--resume is not supported on the Ray runtime yet: start a new run_dir, or resume with "
                           "runtime.use_ray=false and a single-process mode")
        section = config.runtime
        self.config = config
        self.mode = config.mode
        self.trainer = Trainer(config, reward=reward)
        torch.set_num_threads(1)  # the on-demand device is one thread, like every device here
        # Validation and checkpoints run between steps; these clocks tell how much of it was model compute.
        self.eval_clocks = [ComputeClock(model) for model in {id(m): m for m in (self.trainer.model,
                                                                                 self.trainer.eval_model)}.values()]
        self.eval_compute_mark = 0.0
        self.explores = self.mode in ("spotlight", "sync-explore")
        if self.explores and self.trainer.planner is None:
            self.trainer.planner = ExplorationPlanner(section.planner)
        self.num_spot = 0 if self.mode == "vanilla" else section.num_spot_devices
        self.ledger = DeviceLedger(default_prices(section.prices.instance, section.prices.on_demand_per_gpu_hour,
                                                  section.prices.spot_per_gpu_hour))
        self.events = EventLog(None)  # start-up events are not on the run's clock; the log opens at t = 0
        self.t0, self.epoch0 = time.perf_counter(), time.time()
        self.lock = threading.RLock()
        self.cluster: LocalCluster | None = None
        self.trace: TraceReplay | None = None
        self.attached: AttachedSpotNodes | None = None  # --address: watchers, joins and losses of spot nodes
        self.removals: dict[str, float] = {}  # node -> removal time (run clock)
        self.joining: list[str] = []  # nodes the trace brought back that are not up yet
        self.finished: list[CallResult] = []
        self.round: Round | None = None
        self.explored: Explored | None = None
        self.pending_monitor: dict[str, Any] | None = None
        self.stop = threading.Event()
        self.controller: threading.Thread | None = None
        self.controller_error: BaseException | None = None
        self.last_step_end = 0.0
        self.elastic: ElasticSP | None = None  # runtime.sp_degree > 1: exploration on elastic SP groups
        self.sp_devices: set[str] = set()  # the SP device processes held in the ledger ("node:k")
        self._start_pools()

    # -- set-up and tear-down ----------------------------------------------------------------------
    def now(self) -> float:
        """Seconds on the run's clock."""
        return time.perf_counter() - self.t0

    def _start_pools(self) -> None:
        section = self.config.runtime
        availability = None
        if section.address is None:
            self.cluster = LocalCluster(node_timeout_s=section.node_timeout_s,
                                        system_config=SP_HEAD_SYSTEM_CONFIG if section.sp_degree > 1 else None)
            if self.num_spot and section.trace is not None:
                trace = resolve_trace(section.trace, "runtime.trace (null: no preemptions)")
                availability = trace.clipped(self.num_spot)
            initial = {f"node{k}": 1 for k in range(self.num_spot)} if availability is None else \
                {e.node: 1 for e in availability.events if e.time_s == 0 and e.kind == "add"}
            # With SP groups the spot nodes are ElasticSP's (its agents), not the pool's.
            initial_ids = {} if section.sp_degree > 1 else {name: self.cluster.add_spot_node(name) for name in initial}
        else:
            found = attach_cluster(section.address)
            initial_ids = {name: node_id for name, (node_id, _) in found.items()}
            initial = {name: devices for name, (_, devices) in found.items()}
            if self.mode == "vanilla":
                initial_ids, initial = {}, {}
        self.queue = start_queue_actor(section.lease_timeout_s, resource="on_demand")
        settings = WorkerSettings(capacity=section.worker_capacity, forward_batch=section.forward_batch,
                                  heartbeat_s=1.0, idle_wait_s=0.02, min_step_s=section.min_step_s)
        local = section.address is None  # attached spot nodes are machines of their own: Ray places them
        self.pool = SpotPool(self.queue, self.trainer.model.config, settings, self.ledger, self.events, self.now,
                             self.epoch0, core_of=lambda k: self.config.device_core(k + 1) if local else None)
        for name, node_id in initial_ids.items():
            self.pool.node_added(name, node_id, initial[name])
        if section.address is not None and self.mode != "vanilla":
            watch = WatchSettings(section.cloud, section.metadata_url, section.watch_interval_s)
            self.attached = AttachedSpotNodes(self.pool, watch, self.now)
            for name, node_id in initial_ids.items():
                self.attached.watch(name, node_id)
        if section.sp_degree > 1:
            self._start_elastic(list(initial))
        deadline = time.monotonic() + section.node_timeout_s
        while len(self.pool.devices(state="idle")) < sum(initial[name] for name in initial_ids):
            self.pool.poll(0.1)
            if time.monotonic() > deadline:
                raise PoolError(f"spot devices did not start within {section.node_timeout_s:.0f} s: the machine is "
                                "overloaded; retry, or raise runtime.node_timeout_s")
        # The run's clock starts now: cluster boot is not billed, the trace starts at 0.
        self.t0, self.epoch0 = time.perf_counter(), time.time()
        self.pool.epoch0 = self.epoch0
        self.ledger = DeviceLedger(self.ledger.prices)
        self.pool.ledger = self.ledger
        self.ledger.hold(ON_DEMAND, "on_demand", 0.0)
        self.events = self.pool.events = EventLog(self.trainer.run_dir / "events.jsonl")
        for name in initial_ids:
            self.events.write(0.0, "node_added", node=name)
        for device in self.pool.devices():
            self.ledger.hold(device, "spot", 0.0)
        if self.elastic is not None:
            self.elastic.restart_clock()
            for name in initial:
                self._sp_node_added(name)
        if availability is not None:
            self.trace = TraceReplay(availability, time_scale=section.time_scale, grace_s=section.grace_s,
                                     clock=self.now)
            self.trace.returns()  # the nodes of t = 0 are live already
        self.controller = threading.Thread(target=self._control, name="spotlight-controller", daemon=True)
        self.controller.start()

    def _start_elastic(self, initial: list[str]) -> None:
        """Start the elastic SP controller and the agents of the ``initial`` spot nodes; wait until they serve."""
        section, model = self.config.runtime, self.trainer.model
        if not isinstance(getattr(model, "config", None), TinyDiTConfig):
            raise RunError(f"runtime.sp_degree={section.sp_degree} needs a TinyDiT base model (the SP agents run "
                           f"TinyDiT); got {type(model).__name__}: set runtime.sp_degree=1")
        if model.config.num_heads % section.sp_degree:
            raise RunError(f"runtime.sp_degree={section.sp_degree} does not divide the model's "
                           f"{model.config.num_heads} attention heads: use a divisor of {model.config.num_heads}")
        settings = ElasticSPSettings(sp_degrees={model.config.image_size: section.sp_degree},
                                     devices_per_node=section.sp_degree, min_step_s=section.min_step_s, poll_s=TICK_S)
        self.elastic = ElasticSP(self.queue, model.config, ray.put(model_weights(model)),
                                 LocalSpotNodes(self.cluster.cluster), settings,
                                 self.trainer.run_dir / "reconfigurations.jsonl", clock=self.now)
        for name in initial:
            self.elastic.node_joined(name)
        deadline = time.monotonic() + section.node_timeout_s
        while len(self.elastic.agents) < len(initial):
            self.elastic.poll_agents()
            if time.monotonic() > deadline:
                raise PoolError(f"spot node agents did not start within {section.node_timeout_s:.0f} s: the machine "
                                "is overloaded; retry, or raise runtime.node_timeout_s")
            time.sleep(0.1)

    def _sp_node_added(self, node: str) -> None:
        """Log and bill a spot node of the SP groups (its sp_degree device processes) from now."""
        now = self.now()
        self.events.write(now, "node_added", node=node)
        for k in range(self.config.runtime.sp_degree):
            if not self.ledger.is_held(f"{node}:{k}"):
                self.ledger.hold(f"{node}:{k}", "spot", now)
                self.sp_devices.add(f"{node}:{k}")

    def _sp_node_removed(self, node: str, at: float) -> None:
        self.events.write(at, "node_removed", node=node)
        for device in [d for d in self.sp_devices if d.rpartition(":")[0] == node]:
            self.ledger.release(device, at)
            self.sp_devices.discard(device)

    def close(self) -> None:
        """Stop the controller, settle the bill, write summary.json and stop this run's cluster."""
        self.stop.set()
        if self.controller is not None:
            self.controller.join(timeout=10.0)
        end = self.now()
        with self.lock:
            if self.attached is not None:
                self.attached.close()
            self.pool.release_all()
            for device in self.sp_devices:
                self.ledger.release(device, end)
            if self.elastic is not None:
                try:
                    self.elastic.shutdown()
                except RayError:  # a node going away as the run ends
                    pass
        self.ledger.release(ON_DEMAND, end)
        summary = self.summary(end)
        if self.elastic is not None:
            report = self.elastic.report
            summary["elastic_sp"] = {"sp_degree": self.config.runtime.sp_degree, "notices": report.notices,
                                     "joins": report.joins, "removals": report.removals,
                                     "lost_nodes": report.lost_nodes, "requeued": report.requeued,
                                     "reconfigurations": report.reconfigurations,
                                     "log": str(self.elastic.log_path)}
        try:
            summary["queue"] = dataclasses.asdict(ray.get(self.queue.stats.remote(), timeout=30.0))
        except (RayError, GetTimeoutError) as error:
            summary["queue"] = {"error": f"{type(error).__name__}: {error}"}
        (self.trainer.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        self.events.close()
        if self.cluster is not None:
            self.cluster.shutdown()
        else:
            ray.shutdown()

    def summary(self, end: float) -> dict[str, Any]:
        """Totals of the run: dollars, utilisation, compute share, preemptions, queue latency."""
        ledger = self.ledger
        trips = [row for row in self.events.rows if row["kind"] == "pull_round_trip"]
        return {
            "mode": self.mode, "wall_s": end, "prices": vars(ledger.prices),
            "cost/usd": ledger.dollars("on_demand", end) + ledger.dollars("spot", end),
            "cost/usd_on_demand": ledger.dollars("on_demand", end), "cost/usd_spot": ledger.dollars("spot", end),
            "util/on_demand": ledger.utilisation("on_demand", 0.0, end),
            "util/spot": ledger.utilisation("spot", 0.0, end),
            "util/compute_share": ledger.compute_share(), "util/compute_share_spot": ledger.compute_share("spot"),
            "preemption_notices": self.events.count("preemption_notice"),
            "nodes_removed": self.events.count("node_removed"), "nodes_added": self.events.count("node_added"),
            "queue/pull_round_trip_ms": 1e3 * float(np.mean([t["mean_s"] for t in trips])) if trips else math.nan,
        }

    # -- the controller thread ----------------------------------------------------------------------
    def _control(self) -> None:
        try:
            while not self.stop.is_set():
                self._membership()
                with self.lock:
                    if self.elastic is not None:
                        self.elastic.remove_due_nodes()
                        self.elastic.poll_agents()
                        self._serve_round()
                    else:
                        results = self.pool.poll(0.0)
                        for result in results:
                            self._collect(result)
                        self._feed_round()
                time.sleep(TICK_S)
        except BaseException as error:  # surfaced in the main thread by _wait
            self.controller_error = error

    def _membership(self) -> None:
        """Replay the trace: notices, removals at their deadlines, returns (a fresh node, device, weights).

        On an attached cluster the same from the nodes' preemption watchers and Ray's membership.
        """
        if self.attached is not None:
            with self.lock:
                for lost in self.attached.poll():
                    self._collect(lost)
            return
        if self.trace is None:
            return
        if self.elastic is not None:
            self._sp_membership()
            return
        now = self.now()
        for notice in self.trace.poll():
            if notice.node_id in self.joining:  # it never made it up; the trace has moved on
                self.joining.remove(notice.node_id)
                continue
            with self.lock:
                self.pool.notify(notice.node_id, notice.deadline_s)
            self.removals[notice.node_id] = now + notice.deadline_s
        for node in [n for n, at in self.removals.items() if at <= now]:
            del self.removals[node]
            self.cluster.remove_spot_node(node)
            with self.lock:
                for lost in self.pool.node_removed(node):
                    self._collect(lost)
        self.joining += [joined.node_id for joined in self.trace.returns()]
        for node in list(self.joining):
            try:
                node_id = self.cluster.add_spot_node(node)
            except PoolError as error:  # retried on the next tick, as a cloud retries a spot request
                self.events.write(self.now(), "node_add_failed", node=node, error=str(error))
                break
            self.joining.remove(node)
            with self.lock:
                self.pool.node_added(node, node_id)

    def _sp_membership(self) -> None:
        """The trace's events for the SP groups' nodes: ElasticSP re-plans (and logs) on each notice and join."""
        with self.lock:
            for notice in self.trace.poll():
                now = self.now()
                self.events.write(now, "preemption_notice", node=notice.node_id, deadline_s=round(notice.deadline_s, 3))
                self.removals[notice.node_id] = now + notice.deadline_s
                self.elastic.node_noticed(notice.node_id, notice.deadline_s)
            for node in [n for n, at in self.removals.items() if at <= self.now()]:
                self._sp_node_removed(node, self.removals.pop(node))
            self.elastic.remove_due_nodes()
            for joined in self.trace.returns():
                self.elastic.node_joined(joined.node_id)
                self._sp_node_added(joined.node_id)

    def _serve_round(self) -> None:
        """While a round is open, every SP group serves the queue; the round is drained once nothing is left."""
        round_ = self.round
        if round_ is None or round_.drained:
            return
        if ray.get(self.queue.remaining.remote()) == 0:
            round_.drained = True
            # Each group is one explorer to the planner: its device time is the round's wall time.
            round_.device_s = (self.now() - round_.opened_at) * max(1, self._explorers())
            return
        self.elastic.serve()

    def _explorers(self) -> int:
        """How many explorers serve the queue: idle-able spot devices, or SP groups on live agents."""
        if self.elastic is None:
            return len(self.pool.devices())
        return sum(1 for group in self.elastic.groups if group.nodes[0] in self.elastic.agents)

    def _collect(self, result: CallResult) -> None:
        """A finished call: exploration results feed the round; everything else waits for the main thread."""
        if result.phase != "explore":
            self.finished.append(result)
            return
        round_ = self.round
        if round_ is None or result.call is None:
            return
        report = result.call.result
        round_.device_s += result.call.end - result.call.start
        round_.pull_trips_s += report.pull_round_trip_s
        if report.stopped_by == "drained":
            round_.drained = True

    def _feed_round(self) -> None:
        """While a round is open, every idle device holding its weights serves the queue."""
        round_ = self.round
        if round_ is None or round_.drained:
            return
        for device in self.pool.devices(version=round_.version, state="idle"):
            self.pool.call(device, "explore", "explore")

    def _wait(self, done: Callable[[], bool], timeout_s: float = math.inf) -> bool:
        """Block the main thread (the on-demand device idles) until ``done()`` or the timeout."""
        deadline = time.monotonic() + timeout_s
        while True:
            if self.controller_error is not None:
                raise RunError(f"the runtime controller failed: {self.controller_error}") from self.controller_error
            with self.lock:
                if done():
                    return True
            if time.monotonic() > deadline:
                return False
            time.sleep(TICK_S)

    # -- one iteration ------------------------------------------------------------------------------
    def run(self, on_iteration: Callable[[int, dict[str, Any]], None] | None = None) -> RunSummary:
        """`Trainer.run` with this runtime's `step`, stopping at runtime.max_wall_s."""
        return self.trainer.run(on_iteration, step=self.step, max_wall_s=self.config.runtime.max_wall_s)

    def step(self, iteration: int) -> dict[str, Any]:
        """One iteration on the pools; returns its metrics (the report's contract, see docs/runtime.md)."""
        config, trainer = self.config, self.trainer
        started, previous_end = self.now(), self.last_step_end
        compute_mark = sum(clock.seconds for clock in self.eval_clocks)
        if started > self.last_step_end:  # validation and checkpointing since the last step
            self.ledger.busy(ON_DEMAND, self.last_step_end, started, "eval",
                             compute_s=min(started - self.last_step_end, compute_mark - self.eval_compute_mark))
        prompts = iteration_prompts(trainer.train_prompts, config.seed, iteration, config.rollout.prompts_per_iteration)
        weights_ref = ray.put(model_weights(trainer.model))  # θ_i: one object, every spot device maps it
        with self.lock:
            self.pool.set_weights(iteration, weights_ref)
        if self.elastic is not None:  # a sample must not mix two policies: the groups finish first
            if not self._wait(lambda: not self.elastic.serving, timeout_s=self.elastic.settings.agent_call_s):
                raise RunError("the SP groups did not stop serving after the last round: a spot node hangs")
            with self.lock:
                self.elastic.set_weights(weights_ref)
        self._wait(lambda: not self.pool.devices(state="loading"), timeout_s=10.0)  # ~10 ms: then they can help
        record: dict[str, Any] = {}
        exploration, plan = self._seeds(iteration, prompts, record)

        rollout_started = self.now()
        scored = self._rollout(iteration, prompts, exploration.seeds)
        rollout_ended = self.now()
        if trainer.planner is not None and plan is not None:
            trainer.planner.observe_reward(plan, scored.metrics["rollout/group_reward_var"])
        if self.mode == "spotlight" and iteration + 1 < config.iterations:
            self._open_round(iteration + 1, iteration, record)
        update = trainer.train_step(iteration, scored)
        train_ended = self.now()
        self.ledger.busy(ON_DEMAND, rollout_ended, train_ended, "train", compute_s=train_ended - rollout_ended)
        if self.mode == "spotlight" and self.round is not None:
            self._close_round()
        ended = self.now()
        self.last_step_end = ended
        self.eval_compute_mark = sum(clock.seconds for clock in self.eval_clocks)
        record.update({"iteration": iteration + 1, **scored.metrics, **exploration.metrics, **update})
        record.update(self._usage(previous_end, started, rollout_started, rollout_ended, train_ended, ended))
        return record

    def _seeds(self, iteration: int, prompts: list[str],
               record: dict[str, Any]) -> tuple[Exploration, ExplorePlan | None]:
        """This iteration's seeds by mode (see the module docstring) and the plan that chose them."""
        config = self.config
        random_seeds = candidate_seeds(config.seed, iteration, len(prompts), config.rollout.group_size)
        if self.mode == "sync-explore":
            self._open_round(iteration, iteration, record)
            waited = self.now()
            if self.round is not None:  # None: no plan fits (or no spot device): random seeds
                self._close_round()
            record["time/explore_s"] = self.now() - waited
        explored, self.explored = self.explored, None
        if explored is None or explored.round.target != iteration:
            return Exploration(seeds=random_seeds), None
        record.update(explored.plan_metrics)
        record.update(explored.exploration.metrics)
        return explored.exploration, explored.round.plan

    def _rollout(self, iteration: int, prompts: list[str], seeds: torch.Tensor):
        """Sample the groups on the on-demand device and the spot devices holding θ_i, then score them."""
        trainer, plan = self.trainer, rollout_plan(self.config)
        with self.lock:
            helpers = [] if self.mode == "vanilla" else self.pool.devices(version=iteration, state="idle")
        helpers = helpers[:len(prompts) - 1]  # a part per device, none empty: more devices than prompts idle
        parts = np.array_split(np.arange(len(prompts)), 1 + len(helpers))
        requests = [group_requests([prompts[p] for p in part], seeds[part]) for part in parts]
        with self.lock:
            for device, (part_prompts, part_seeds) in zip(helpers, requests[1:], strict=True):
                self.pool.call(device, "rollout", "sample", part_prompts, part_seeds, plan)
        own_started = self.now()
        trajectories: dict[int, Trajectory] = {0: generate(trainer.model, *requests[0], plan)}
        own_ended = self.now()
        self.ledger.busy(ON_DEMAND, own_started, own_ended, "rollout", compute_s=own_ended - own_started)
        index = {device: k + 1 for k, device in enumerate(helpers)}

        def collected() -> bool:
            for result in [r for r in self.finished if r.phase == "rollout"]:
                self.finished.remove(result)
                k = index[result.device_id]
                trajectories[k] = None if result.call is None else Trajectory(*result.call.result, start_step=0)
            return len(trajectories) == len(parts)

        self._wait(collected)
        for k, trajectory in trajectories.items():
            if trajectory is None:  # its device was preempted: redo the part here
                redo_started = self.now()
                trajectories[k] = generate(trainer.model, *requests[k], plan)
                self.ledger.busy(ON_DEMAND, redo_started, self.now(), "rollout", compute_s=self.now() - redo_started)
        ordered = [trajectories[k] for k in range(len(parts))]
        trajectory = Trajectory(torch.cat([t.latents for t in ordered]), torch.cat([t.log_probs for t in ordered]), 0)
        score_started = self.now()
        scored = score_rollout(trainer.model, prompts, seeds, trajectory, self.config, trainer.reward)
        self.ledger.busy(ON_DEMAND, score_started, self.now(), "rollout")
        return scored

    # -- exploration rounds -------------------------------------------------------------------------
    def _open_round(self, target: int, version: int, record: dict[str, Any]) -> None:
        """Queue the candidates of ``target``'s prompts for the devices holding θ_version, as the planner says."""
        config, trainer = self.config, self.trainer
        prompts = iteration_prompts(trainer.train_prompts, config.seed, target, config.rollout.prompts_per_iteration)
        with self.lock:
            devices = self._explorers()
        monitor = self.pending_monitor if self.mode == "spotlight" else None
        budget = round_budget(trainer.planner, trainer.budget_s, devices,
                              None if monitor is None else (monitor["plan"], len(monitor["prompts"])))
        decision = trainer.planner.choose(budget, num_devices=devices, num_prompts=len(prompts))
        plan_metrics = {"planner/budget_s": trainer.budget_s, "planner/predicted_s": decision.predicted_time_s,
                        "planner/feasible_arms": float(len(decision.feasible_arms)), "planner/spot_devices": devices}
        if decision.plan is None:
            self.pending_monitor = None
            record.update(plan_metrics)
            return
        plan = decision.plan
        plan_metrics.update({"planner/num_candidates": float(plan.num_candidates),
                             "planner/num_steps": float(plan.num_steps)})
        candidates = candidate_seeds(config.seed, target, len(prompts), plan.num_candidates)
        rollout_sampling = rollout_plan(config)
        sampling = exploration_sampling(plan, rollout_sampling)
        requests = [Request(f"x{target}-{p}-{c}", prompt, int(candidates[p, c]), sampling)
                    for p, prompt in enumerate(prompts) for c in range(plan.num_candidates)]
        if monitor is not None:
            monitor_sampling = exploration_sampling(monitor["plan"], rollout_sampling)
            monitor["ids"] = [f"m{monitor['target']}-{p}-{c}" for p in range(len(monitor["prompts"]))
                              for c in range(monitor["candidates"].shape[1])]
            requests += [Request(rid, monitor["prompts"][p], int(monitor["candidates"][p, c]), monitor_sampling)
                         for rid, (p, c) in zip(monitor["ids"], np.ndindex(*monitor["candidates"].shape), strict=True)]
        ray.get(self.queue.submit.remote(requests))
        own_ids = [r.request_id for r in requests[:len(prompts) * plan.num_candidates]]
        round_ = Round(target, version, plan, prompts, candidates, own_ids, monitor=monitor, opened_at=self.now(),
                       plan_metrics=plan_metrics)
        with self.lock:
            self.round = round_

    def _close_round(self) -> None:
        """Wait for the open round (cancelling what is left after runtime.explore_wait_s), score and select."""
        round_ = self.round
        drained = self._wait(lambda: round_.drained, self.config.runtime.explore_wait_s)
        with self.lock:
            self.round = None
        ids = round_.ids + (round_.monitor["ids"] if round_.monitor else [])
        if not drained:
            ray.get(self.queue.cancel.remote(ids))
        results = ray.get(self.queue.take_results.remote(ids))
        config, trainer = self.config, self.trainer
        latents = self._latents(results, round_.ids, trainer.model.config.latent_shape)
        rewards = score_latents(latents, round_.prompts, trainer.reward)
        missing = torch.tensor([rid not in results for rid in round_.ids]).reshape(rewards.shape)
        rewards[missing] = math.nan
        exploration = select_explored(rewards, round_.candidates, config, iteration_generator(config.seed,
                                                                                               round_.target, 3))
        trips = round_.pull_trips_s
        exploration.metrics.update({
            "explore/missed_fraction": float(missing.float().mean()),
            "queue/pull_round_trip_ms": 1e3 * float(np.mean(trips)) if trips else math.nan,
            "queue/pulls": float(len(trips)),
        })
        if trips:
            self.events.write(self.now(), "pull_round_trip", mean_s=float(np.mean(trips)), pulls=len(trips))
        if round_.device_s > 0 and not missing.any():
            trainer.planner.observe_cost(round_.plan, round_.device_s * self._round_share(round_),
                                         rewards.numel(), round_.plan.num_steps)
        if round_.monitor is not None:
            exploration.metrics.update(self._staleness(round_.monitor, results))
        self.explored = Explored(round_, exploration, rewards, round_.plan_metrics)
        if self.mode == "spotlight":
            m = min(config.explore.monitor_prompts, len(round_.prompts))
            self.pending_monitor = None if m == 0 else {
                "target": round_.target, "plan": round_.plan, "prompts": round_.prompts[:m],
                "candidates": round_.candidates[:m], "stale_rewards": rewards[:m],
                "stale_seeds": exploration.seeds[:m]}

    @staticmethod
    def _latents(results: dict[str, torch.Tensor], ids: list[str], shape: tuple[int, ...]) -> torch.Tensor:
        """Results in request order; a cancelled request's slot is zeros (its reward is set to NaN after)."""
        return torch.stack([results.get(rid, torch.zeros(shape)) for rid in ids])

    @staticmethod
    def _round_share(round_: Round) -> float:
        """The fraction of a round's device time that went to its own candidates (not the monitor's)."""
        own = len(round_.ids) * round_.plan.num_steps
        if round_.monitor is None:
            return 1.0
        extra = len(round_.monitor["ids"]) * round_.monitor["plan"].num_steps
        return own / (own + extra)

    def _staleness(self, monitor: dict[str, Any], results: dict[str, torch.Tensor]) -> dict[str, float]:
        """Kendall τ of the monitor prompts' candidate rankings under θ_{i-1} (stale) and θ_i (fresh)."""
        if any(rid not in results for rid in monitor["ids"]):
            return {}
        config, trainer = self.config, self.trainer
        latents = self._latents(results, monitor["ids"], trainer.model.config.latent_shape)
        fresh_rewards = score_latents(latents, monitor["prompts"], trainer.reward)
        fresh = select_explored(fresh_rewards, monitor["candidates"], config,
                                iteration_generator(config.seed, monitor["target"], 3))
        entry = trainer.monitor.record(monitor["target"], monitor["stale_rewards"], fresh_rewards,
                                       monitor["stale_seeds"], fresh.seeds)
        return {"staleness/kendall_tau": entry.tau, "staleness/selection_overlap": entry.overlap,
                "staleness/iteration": float(monitor["target"] + 1)}

    # -- metrics -------------------------------------------------------------------------------------
    def _usage(self, previous_end: float, started: float, rollout_started: float, rollout_ended: float,
               train_ended: float, ended: float) -> dict[str, float]:
        """Times, utilisation per pool and phase, compute share and cumulative dollars of this iteration."""
        ledger = self.ledger
        with self.lock:
            live = self._explorers()
        return {
            "time/rollout_s": rollout_ended - rollout_started,
            "time/explore_wait_s": ended - train_ended,
            "time/seeds_s": rollout_started - started,
            "time/iteration_s": ended - previous_end,
            "util/spot_train_phase": ledger.utilisation("spot", rollout_ended, train_ended),
            "util/spot_rollout_phase": ledger.utilisation("spot", rollout_started, rollout_ended),
            "util/spot": ledger.utilisation("spot", started, ended),
            "util/on_demand": ledger.utilisation("on_demand", started, ended),
            "util/compute_share": ledger.compute_share(),
            "util/compute_share_spot": ledger.compute_share("spot"),
            "cost/usd_on_demand": ledger.dollars("on_demand", ended),
            "cost/usd_spot": ledger.dollars("spot", ended),
            "cost/usd": ledger.dollars("on_demand", ended) + ledger.dollars("spot", ended),
            "runtime/spot_devices": float(live),
            "runtime/preemption_notices": float(self.events.count("preemption_notice")),
        }

