"""Elastic sequence parallelism on a Ray cluster: serve the queue with SP groups through preemptions.

`ElasticSP` is the single controller: it keeps one `NodeAgentActor` per live spot node, asks the
planner (`spotlight.runtime.reconfigure`) for groups whenever a node is noticed, leaves, joins or
loses a device, carries the plan out (stop and dissolve only the groups that broke, form the new
ones) and keeps every group serving the `RequestQueue`. Every reconfiguration is appended to a
JSONL log: when, why, the old and the new groups, and how long it took.

Where nodes come from is a `NodeProvider`: `LocalSpotNodes` adds and removes logical Ray nodes of
a local ``ray.cluster_utils.Cluster`` as a spot trace says; on a real cluster the provider is the
autoscaler and only ``start_agent`` is needed. `run_elastic_sp` drives a whole run from a
`TraceReplay` and is what a training loop calls to have a batch of requests denoised.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import ray

from spotlight.models.tinydit import TinyDiTConfig
from spotlight.runtime.agent import NodeAgentActor, ServeReport
from spotlight.runtime.preemption import TraceReplay
from spotlight.runtime.reconfigure import PlanDiff, SPGroup, plan_groups

__all__ = ["ElasticSP", "ElasticSPReport", "ElasticSPSettings", "LocalSpotNodes", "NodeProvider", "run_elastic_sp"]


@dataclass(frozen=True)
class ElasticSPSettings:
    """How the elastic SP runtime serves: ``sp_degrees`` maps a resolution to the SP degree it needs.

    ``devices_per_node``: device processes per agent. ``min_step_s``: lower bound on a step's wall
    time (emulates a slower accelerator so preemptions land mid-sample locally; 0 on real devices).
    ``poll_s``: how often the controller looks at notices and serving groups.
    """

    sp_degrees: Mapping[int, int] = field(default_factory=lambda: {32: 2})
    devices_per_node: int = 2
    num_threads: int = 1
    min_step_s: float = 0.0
    poll_s: float = 0.05
    collective_timeout_s: float = 20.0


class NodeProvider(Protocol):
    """Starts an agent on a node that joined, and takes a node away when its deadline passes."""

    def start_agent(self, node_id: str, settings: ElasticSPSettings) -> Any: ...

    def remove(self, node_id: str) -> None: ...


class LocalSpotNodes:
    """Logical spot nodes of a local Ray cluster: each node is a raylet with resource ``node:<id>``."""

    def __init__(self, cluster: Any, cpus_per_node: int = 1) -> None:
        self.cluster, self.cpus_per_node = cluster, cpus_per_node
        self._nodes: dict[str, Any] = {}

    def start_agent(self, node_id: str, settings: ElasticSPSettings) -> Any:
        """Add the Ray node and start its agent pinned there (returns the actor handle at once)."""
        resource = f"spot_{node_id}"
        self._nodes[node_id] = self.cluster.add_node(
            num_cpus=self.cpus_per_node, resources={"spot": 1, resource: 1}
        )
        return NodeAgentActor.options(num_cpus=0, resources={resource: 0.01}).remote(
            node_id, settings.devices_per_node, num_threads=settings.num_threads,
            collective_timeout_s=settings.collective_timeout_s,
        )

    def remove(self, node_id: str) -> None:
        node = self._nodes.pop(node_id, None)
        if node is not None:
            self.cluster.remove_node(node, allow_graceful=False)


@dataclass
class ElasticSPReport:
    """What a run did: counts of notices, node joins, reconfigurations and the queue's final stats."""

    notices: int = 0
    joins: int = 0
    removals: int = 0
    reconfigurations: int = 0
    serve_reports: list[ServeReport] = field(default_factory=list)
    queue_stats: Any = None
    wall_s: float = 0.0


class ElasticSP:
    """The controller of the spot nodes' agents and their SP groups (module docstring)."""

    def __init__(
        self,
        queue: Any,
        model_config: TinyDiTConfig,
        weights: Any,
        nodes: NodeProvider,
        settings: ElasticSPSettings,
        log_path: str | Path,
        clock: Any = time.monotonic,
    ) -> None:
        self.queue, self.config, self.weights, self.nodes, self.settings = queue, model_config, weights, nodes, settings
        self.log_path = Path(log_path)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_path.write_text("")
        self._clock, self._start = clock, clock()
        self.agents: dict[str, Any] = {}  # node -> agent with weights loaded
        self.starting: dict[ray.ObjectRef, tuple[str, Any, float]] = {}  # ready ref -> (node, agent, joined at)
        self.leaving: dict[str, float] = {}  # node -> removal time (controller clock)
        self.groups: list[SPGroup] = []
        self.serving: dict[ray.ObjectRef, tuple[str, str]] = {}  # serve ref -> (node, group name)
        self.next_generation = 0
        self.report = ElasticSPReport()

    # -- events --------------------------------------------------------------------------------
    def node_joined(self, node_id: str) -> None:
        """Start the node's agent; it enters the plan once its processes are up and hold the weights."""
        agent = self.nodes.start_agent(node_id, self.settings)
        self.starting[agent.load_weights.remote(self.config.to_dict(), self.weights)] = (node_id, agent, self._now())
        self.report.joins += 1

    def node_noticed(self, node_id: str, deadline_s: float) -> None:
        """A preemption notice: the node's groups finish their step and hand their requests back."""
        self.report.notices += 1
        self.leaving[node_id] = self._now() + deadline_s
        started = self._now()
        agent = self.agents.pop(node_id, None)
        for ref, (node, _, _) in list(self.starting.items()):
            if node == node_id:  # noticed before it was ready: never planned, nothing to hand back
                del self.starting[ref]
        if agent is None:
            return
        agent.notify_preemption.remote()
        self._collect([ref for ref, (node, _) in self.serving.items() if node == node_id], wait=True)
        self._reconfigure(f"notice {node_id} (deadline {deadline_s:.2f} s)", started)

    def poll_agents(self) -> None:
        """Bring ready agents into the plan and handle groups that stopped serving."""
        if self.starting:
            ready, _ = ray.wait(list(self.starting), num_returns=len(self.starting), timeout=0)
            for ref in ready:
                node_id, agent, joined_at = self.starting.pop(ref)
                ray.get(ref)
                self.agents[node_id] = agent
                self._reconfigure(f"join {node_id} (agent started in {self._now() - joined_at:.2f} s)", self._now())
        if self.serving:
            done, _ = ray.wait(list(self.serving), num_returns=len(self.serving), timeout=0)
            broken = self._collect(done, wait=False)
            for node_id in broken:
                started = self._now()
                if node_id in self.agents:
                    ray.get(self.agents[node_id].replace_lost_devices.remote())
                    self._reconfigure(f"device lost on {node_id}", started)

    def remove_due_nodes(self) -> None:
        """Take away noticed nodes whose deadline passed (the trace's removal)."""
        for node_id, at in list(self.leaving.items()):
            if self._now() >= at:
                self.nodes.remove(node_id)
                del self.leaving[node_id]
                self.report.removals += 1

    # -- planning ------------------------------------------------------------------------------
    def _reconfigure(self, cause: str, started: float) -> PlanDiff:
        alive = {node: ray.get(agent.alive_devices.remote()) for node, agent in self.agents.items()}
        num_heads = self.config.num_heads
        diff = plan_groups(alive, self.settings.sp_degrees, num_heads, previous=self.groups,
                           next_generation=self.next_generation, cross_node=False)
        self.next_generation = diff.next_generation
        for group in diff.dissolved:
            node = group.nodes[0]
            if node in self.agents:
                self.agents[node].stop_group.remote(group.name)
        self._collect([ref for ref, (_, name) in self.serving.items()
                       if name in {g.name for g in diff.dissolved}], wait=True)
        by_node: dict[str, list[SPGroup]] = {}
        for group in diff.formed:
            by_node.setdefault(group.nodes[0], []).append(group)
        ray.get([self.agents[node].dissolve.remote([g.name for g in diff.dissolved if g.nodes[0] == node])
                 for node in self.agents])
        ray.get([self.agents[node].form_groups.remote(groups) for node, groups in by_node.items()])
        for node, groups in by_node.items():
            for group in groups:
                ref = self.agents[node].serve.remote(self.queue, group.name, self.settings.min_step_s)
                self.serving[ref] = (node, group.name)
        self.groups = list(diff.new_groups)
        if diff.changed:
            self.report.reconfigurations += 1
            record = {"at_s": round(started - self._start, 3), "cause": cause,
                      "duration_s": round(self._now() - started, 4), **diff.to_json()}
            with self.log_path.open("a") as log:
                log.write(json.dumps(record) + "\n")
        return diff

    def _collect(self, refs: list[ray.ObjectRef], wait: bool) -> list[str]:
        """Reap finished serve calls; returns the nodes whose group broke (lost a device)."""
        broken = []
        for ref in refs:
            node, _ = self.serving.pop(ref)
            try:
                report = ray.get(ref, timeout=None if wait else 0)
            except ray.exceptions.RayActorError:
                continue  # the node went away under it; its leases come back by commit or expiry
            self.report.serve_reports.append(report)
            if report.stopped_by == "broken":
                broken.append(node)
        return broken

    def _now(self) -> float:
        return self._clock()

    def shutdown(self) -> None:
        ray.get([agent.shutdown.remote() for agent in self.agents.values()])


def run_elastic_sp(
    queue: Any,
    model_config: TinyDiTConfig,
    weights: Any,
    replay: TraceReplay,
    nodes: NodeProvider,
    settings: ElasticSPSettings,
    log_path: str | Path,
    timeout_s: float = 600.0,
) -> ElasticSPReport:
    """Serve ``queue`` until it is empty while ``replay`` adds, notices and removes spot nodes.

    ``weights``: a Ray ObjectRef of the model's state dict (numpy arrays), loaded once per node into
    its agent's shared memory. Returns the `ElasticSPReport`; the JSONL log at ``log_path`` has one
    line per reconfiguration. Raises TimeoutError if the queue is not drained in ``timeout_s``.
    """
    controller = ElasticSP(queue, model_config, weights, nodes, settings, log_path)
    started = time.monotonic()
    try:
        while ray.get(queue.remaining.remote()) > 0:
            if time.monotonic() - started > timeout_s:
                raise TimeoutError(f"elastic SP run did not drain the queue in {timeout_s} s: raise timeout_s")
            for joined in replay.returns():
                controller.node_joined(joined.node_id)
            for notice in replay.poll():
                controller.node_noticed(notice.node_id, notice.deadline_s)
            controller.remove_due_nodes()
            controller.poll_agents()
            time.sleep(settings.poll_s)
        controller._collect(list(controller.serving), wait=True)
    finally:
        controller.report.wall_s = time.monotonic() - started
        controller.report.queue_stats = ray.get(queue.stats.remote())
        try:
            controller.shutdown()
        except ray.exceptions.RayError:
            pass
    return controller.report
