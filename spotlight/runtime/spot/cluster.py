"""The device pools of a run and the controller thread that keeps them moving (GRPO-free).

The driver process is the on-demand device and the single controller. `SpotCluster` starts the
pools (a local cluster of logical nodes with a replayed spot trace, or an attached cluster whose
spot nodes run preemption watchers), the pull queue, and, with ``runtime.sp_degree`` > 1, the
elastic SP groups. A controller thread ticks every 20 ms while the main thread computes:

- membership: the trace's notices (the node's devices finish their step, commit, take no more
  work), removals at the deadlines, returns (a fresh node, device and the current weights); on an
  attached cluster the same from the watchers and Ray's node list;
- an open exploration round (`spotlight.runtime.queue.rounds.Round`): idle devices holding its weights
  (or the SP groups) serve the queue until it is drained;
- finished calls: exploration calls feed the round, the rest wait in ``finished`` for the main thread.

It bills held and busy device-seconds in the ledger and writes events.jsonl; ``close`` settles the
bill and writes summary.json. What the requests and calls mean is the Ray backend's.
"""

from __future__ import annotations

import dataclasses
import json
import math
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import ray
import torch
from ray.exceptions import GetTimeoutError, RayError

from spotlight.market.billing import DeviceLedger
from spotlight.market.prices import default_prices
from spotlight.market.traces import Availability, resolve_trace
from spotlight.models.weight_payload import object_store_mb, payload_nbytes, refuse_full_fine_tune_on_spot
from spotlight.modes import Mode
from spotlight.run_error import RunError
from spotlight.runtime.gpus import gpu_layout
from spotlight.runtime.queue.durable import start_durable_queue_actor
from spotlight.runtime.queue.rounds import Round
from spotlight.runtime.section import RuntimeSection
from spotlight.runtime.sp.elastic import ElasticSP
from spotlight.runtime.sp.groups import start_elastic_sp
from spotlight.runtime.spot.attached import AttachedSpotNodes
from spotlight.runtime.spot.events import EventLog
from spotlight.runtime.spot.pools import CallResult, LocalCluster, PoolError, SpotPool, attach_cluster
from spotlight.runtime.spot.preemption import TraceReplay
from spotlight.runtime.spot.usage import run_totals
from spotlight.runtime.spot.watchers import WatchSettings
from spotlight.runtime.spot.worker import WorkerSettings

__all__ = ["ON_DEMAND", "TICK_S", "SpotCluster"]

ON_DEMAND = "on-demand-0"
TICK_S = 0.02
# With SP groups (runtime.sp_degree > 1) each spot node runs an agent and its device processes: on a
# loaded machine their raylets miss Ray's default health checks (5 x 3 s) and live nodes are declared
# dead. Trace removals never wait on the check (the controller acts on the notice), so it can be tolerant.
SP_HEAD_SYSTEM_CONFIG = {"health_check_failure_threshold": 20, "health_check_timeout_ms": 20000}


class SpotCluster:
    """The pools, the queue, the bill and the controller thread of one run (see the module docstring).

    ``model`` is the on-demand device's model at start-up: its config sizes the spot devices and its
    weights seed the SP groups; ``core_of(k)`` pins local spot device k.
    """

    def __init__(self, section: RuntimeSection, mode: Mode, model: Any, run_dir: Path,
                 core_of: Callable[[int], int | None], control_cores: Sequence[int] | None = None) -> None:
        self.section, self.mode, self.run_dir = section, mode, run_dir
        self.num_spot = section.num_spot_devices if mode.rents_spot else 0
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
        self.finished: list[CallResult] = []  # calls other than exploration, for the main thread
        self.round: Round | None = None
        self.feed: Callable[[], None] | None = None  # more work for idle devices, each tick (a shared validation)
        self.stop = threading.Event()
        self.controller: threading.Thread | None = None
        self.controller_error: BaseException | None = None
        self.elastic: ElasticSP | None = None  # runtime.sp_degree > 1: exploration on elastic SP groups
        self.sp_devices: set[str] = set()  # the SP device processes held in the ledger ("node:k")
        self.closed = False
        try:
            self._start(model, core_of, control_cores)
        except BaseException:  # a start that fails half-way leaves no Ray processes behind
            self.closed = True
            if self.cluster is not None:
                self.cluster.shutdown()
            elif ray.is_initialized():
                ray.shutdown()
            raise

    def now(self) -> float:
        """Seconds on the run's clock."""
        return time.perf_counter() - self.t0

    # -- start-up and tear-down ---------------------------------------------------------------------
    def _start(self, model: Any, core_of: Callable[[int], int | None], control_cores: Sequence[int] | None) -> None:
        section = self.section
        availability: Availability | None = None
        on = next(model.parameters()).device
        device = on.type  # spot devices run where the trainer's policy runs
        refuse_full_fine_tune_on_spot(model, self.num_spot)  # before any Ray process starts
        if section.address is None:  # each node told its physical GPUs: never the driver's to a rank (placement.py)
            # the object store holds θ's payload twice (the version loading, the next one) without spilling
            self.cluster = LocalCluster(object_store_mb=object_store_mb(payload_nbytes(model)),
                                        node_timeout_s=section.node_timeout_s, spot_gpus=int(device == "cuda"),
                                        control_cores=control_cores, gpus=gpu_layout(str(on)),
                                        system_config=SP_HEAD_SYSTEM_CONFIG if section.sp_degree > 1 else None)
            if self.num_spot and section.trace is not None:
                availability = resolve_trace(section.trace, "runtime.trace (null: no preemptions)").clipped(
                    self.num_spot)
            initial = {f"node{k}": 1 for k in range(self.num_spot)} if availability is None else \
                {e.node: 1 for e in availability.events if e.time_s == 0 and e.kind == "add"}
            # With SP groups the spot nodes are ElasticSP's (its agents), not the pool's.
            initial_ids = {} if section.sp_degree > 1 else {name: self.cluster.add_spot_node(name) for name in initial}
        else:
            found = attach_cluster(section.address)
            initial_ids = {name: node_id for name, (node_id, _) in found.items()}
            initial = {name: devices for name, (_, devices) in found.items()}
            if not self.mode.rents_spot:
                initial_ids, initial = {}, {}
        self.queue = start_durable_queue_actor(self._queue_log_path(), section.lease_timeout_s, resource="on_demand")
        settings = WorkerSettings(capacity=section.worker_capacity, forward_batch=section.forward_batch,
                                  heartbeat_s=1.0, idle_wait_s=0.02, min_step_s=section.min_step_s, device=device)
        local = section.address is None  # attached spot nodes are machines of their own: Ray places them
        self.pool = SpotPool(self.queue, model.config, settings, self.ledger, self.events, self.now,
                             self.epoch0, core_of=core_of if local else lambda k: None)
        for name, node_id in initial_ids.items():
            self.pool.node_added(name, node_id, initial[name])
        if section.address is not None and self.mode.rents_spot:
            watch = WatchSettings(section.cloud, section.metadata_url, section.watch_interval_s)
            self.attached = AttachedSpotNodes(self.pool, watch, self.now)
            for name, node_id in initial_ids.items():
                self.attached.watch(name, node_id)
        if section.sp_degree > 1:
            self.elastic = start_elastic_sp(section, self.queue, model, self.cluster.cluster, list(initial),
                                            self.run_dir / "reconfigurations.jsonl", self.now, TICK_S)
        deadline = time.monotonic() + section.node_timeout_s
        while self.pool.devices(state="starting"):  # a device that dies while starting is dropped, not awaited
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
        self.events = self.pool.events = EventLog(self.run_dir / "events.jsonl")
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

    def _queue_log_path(self) -> Path:
        """A new write-ahead log for this driver's queue: queue-log-<n>.jsonl, n counting the run's drivers.

        A restarted queue actor replays its own driver's log; a resumed run starts a log of its own
        (the rounds it needs again come from its checkpoint or are requested again), keeping the old ones.
        """
        taken = {path.name for path in self.run_dir.glob("queue-log-*.jsonl")}
        return self.run_dir / next(f"queue-log-{n}.jsonl" for n in range(len(taken) + 1)
                                   if f"queue-log-{n}.jsonl" not in taken)

    def _sp_node_added(self, node: str) -> None:
        """Log and bill a spot node of the SP groups (its sp_degree device processes) from now."""
        now = self.now()
        self.events.write(now, "node_added", node=node)
        for k in range(self.section.sp_degree):
            if not self.ledger.is_held(f"{node}:{k}"):
                self.ledger.hold(f"{node}:{k}", "spot", now)
                self.sp_devices.add(f"{node}:{k}")

    def _sp_node_removed(self, node: str, at: float) -> None:
        self.events.write(at, "node_removed", node=node)
        for device in [d for d in self.sp_devices if d.rpartition(":")[0] == node]:
            self.ledger.release(device, at)
            self.sp_devices.discard(device)

    def close(self, queue_stats: Callable[[], dict[str, Any]] | None = None) -> None:
        """Stop the controller, settle the bill, write summary.json and stop this run's cluster; once."""
        if self.closed:
            return
        self.closed = True
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
        summary = run_totals(self.ledger, self.events, self.mode, end)
        if self.elastic is not None:
            report = self.elastic.report
            summary["elastic_sp"] = {"sp_degree": self.section.sp_degree, "notices": report.notices,
                                     "joins": report.joins, "removals": report.removals,
                                     "lost_nodes": report.lost_nodes, "requeued": report.requeued,
                                     "reconfigurations": report.reconfigurations,
                                     "log": str(self.elastic.log_path)}
        try:
            summary["queue"] = dataclasses.asdict(ray.get(self.queue.stats.remote(), timeout=30.0))
        except (RayError, GetTimeoutError) as error:
            summary["queue"] = {"error": f"{type(error).__name__}: {error}"}
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        self.events.close()
        if self.cluster is not None:
            self.cluster.shutdown()
        else:
            ray.shutdown()

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
                        for result in self.pool.poll(0.0):
                            self._collect(result)
                        self._feed_round()
                        if self.feed is not None:
                            self.feed()
                time.sleep(TICK_S)
        except BaseException as error:  # surfaced in the main thread by wait
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
        # A controller that fell behind (a tick blocked for seconds) can read a node's remove, add, remove, add
        # at once: its removals collapse into one above, and its returns must too, or the second add of a
        # node that is up by then fails for ever and holds up every later join (seen in
        # benchmarks/reliability/chaos.py).
        for joined in self.trace.returns():
            if joined.node_id not in self.joining:
                self.joining.append(joined.node_id)
        for node in list(self.joining):
            if self.cluster.is_live(node):  # up already: nothing to start
                self.joining.remove(node)
                continue
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
        if ray.get(self.queue.remaining.remote(round_.version)) == 0:
            round_.drained = True
            # Each group is one explorer to the planner: its device time is the round's wall time.
            round_.device_s = (self.now() - round_.opened_at) * max(1, self.explorers())
            return
        self.elastic.serve()

    def explorers(self) -> int:
        """How many explorers the run holds: spot devices, or SP groups on live agents (under lock)."""
        if self.elastic is None:
            return len(self.pool.devices())
        return sum(1 for group in self.elastic.groups if group.nodes[0] in self.elastic.agents)

    def ready_explorers(self) -> int:
        """How many explorers a round can plan on: held ones whose process is up (under lock).

        A device whose node just joined is held (and billed) from then, but its process takes seconds to
        start (importing torch, building the model): counted by the planner, the first round and the round
        after each return of a node were sized for a device that was not there yet and overran the
        exploration wait (docs/results-notes.md, the headline's causes). It still pulls work once it is up.
        """
        if self.elastic is None:
            return len(self.pool.devices()) - len(self.pool.devices(state="starting"))
        return self.explorers()

    def _collect(self, result: CallResult) -> None:
        """A finished call: exploration results feed the round; everything else waits for the main thread."""
        if result.phase != "explore":
            self.finished.append(result)
            return
        round_ = self.round
        if round_ is None or result.call is None:
            return
        report = result.call.result
        if report.weights_version != round_.version:  # a call of an earlier round, with other weights
            return
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

    def wait(self, done: Callable[[], bool], timeout_s: float = math.inf) -> bool:
        """Block the main thread (the on-demand device idles) until ``done()`` (checked under lock) or the timeout."""
        deadline = time.monotonic() + timeout_s
        while True:
            if isinstance(self.controller_error, torch.OutOfMemoryError):  # a spot device's: the run's one line
                raise self.controller_error
            if self.controller_error is not None:
                raise RunError(f"the runtime controller failed: {self.controller_error}") from self.controller_error
            with self.lock:
                if done():
                    return True
            if time.monotonic() > deadline:
                return False
            time.sleep(TICK_S)
