"""Elastic sequence parallelism on a Ray cluster: serve the queue with SP groups through preemptions.

`ElasticSP` is the single controller: it keeps one `NodeAgentActor` per live spot node, asks the
planner (`spotlight.runtime.sp.reconfigure`) for groups whenever a node is noticed, leaves, joins or
loses a device, carries the plan out (stop and dissolve only the groups that broke, form the new
ones) and keeps every group serving the `RequestQueue`. Every reconfiguration is appended to a
JSONL log: when, why, the old and the new groups, and how long it took.

Where nodes come from is a `NodeProvider`: `spotlight.runtime.spot.local_nodes.LocalSpotNodes` adds
and removes logical Ray nodes of a local ``ray.cluster_utils.Cluster`` as a spot trace says; on a
real cluster the provider is the autoscaler and only ``start_agent`` is needed. `run_elastic_sp`
drives a whole run from a `TraceReplay` and is what a training loop calls to have a batch of
requests denoised.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import ray

from spotlight.models.rebuild import ModelConfig, describe_config
from spotlight.models.spec import attention_heads
from spotlight.runtime.sp.agent import ServeReport
from spotlight.runtime.sp.reconfigure import PlanDiff, SPGroup, plan_groups
from spotlight.runtime.spot.preemption import TraceReplay

__all__ = ["ElasticSP", "ElasticSPReport", "ElasticSPSettings", "NodeProvider", "run_elastic_sp", "serve_until_drained"]


@dataclass(frozen=True)
class ElasticSPSettings:
    """How the elastic SP runtime serves: ``sp_degrees`` maps a resolution to the SP degree it needs.

    ``devices_per_node``: device processes per agent. ``min_step_s``: lower bound on a step's wall
    time (emulates a slower accelerator so preemptions land mid-sample locally; 0 on real devices).
    ``poll_s``: how often the controller looks at notices and serving groups. ``agent_call_s``: how
    long the controller waits for an agent's answer before counting its node as lost (generous: a
    loaded machine answers slowly, and a lost node costs a restart). ``agent_start_s``: how long a
    joining node may take to start its agent and load the weights. ``restart_lost_nodes``: start a
    node again when it died while the trace still has it (a crash, not a preemption), as an
    autoscaler replaces a failed instance.
    """

    sp_degrees: Mapping[int, int] = field(default_factory=lambda: {32: 2})
    devices_per_node: int = 2
    num_threads: int = 1
    min_step_s: float = 0.0
    poll_s: float = 0.05
    collective_timeout_s: float = 20.0
    agent_call_s: float = 120.0
    agent_start_s: float = 900.0
    restart_lost_nodes: bool = True


class NodeProvider(Protocol):
    """Starts an agent on a node that joined, and takes a node away when its deadline passes."""

    def start_agent(self, node_id: str, settings: ElasticSPSettings) -> Any: ...

    def remove(self, node_id: str) -> None: ...


@dataclass
class ElasticSPReport:
    """What a run did: counts of notices, node joins and losses, reconfigurations, the queue's final stats.

    ``lost_nodes``: nodes whose agent died or stopped answering without a notice (each counted once
    per incarnation); ``requeued``: in-flight requests the controller sent back to the queue from
    their last committed step when their node was lost.
    """

    notices: int = 0
    joins: int = 0
    removals: int = 0
    lost_nodes: int = 0
    requeued: int = 0
    reconfigurations: int = 0
    serve_reports: list[ServeReport] = field(default_factory=list)
    queue_stats: Any = None
    wall_s: float = 0.0


_AGENT_GONE = (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError)
"""What a call to an agent raises when its node is gone (died, removed, or not answering in time).

`RayActorError` covers `ActorDiedError` and `ActorUnavailableError` (a removed node shows first as
unavailable, and only after Ray's health check as dead); the controller never waits for the latter.
"""


class ElasticSP:
    """The controller of the spot nodes' agents and their SP groups (module docstring).

    Every call to an agent goes through `_ask` or `_collect`: an agent that died or does not answer
    is a node loss (`_lose`) — its groups count as broken, its in-flight requests go back to the queue
    from their last committed step, and the next reconfiguration (logged) plans without it. The
    controller itself never fails because a node did.
    """

    def __init__(
        self,
        queue: Any,
        model_config: ModelConfig,
        weights: Any,
        nodes: NodeProvider,
        settings: ElasticSPSettings,
        log_path: str | Path,
        clock: Any = time.monotonic,
        *,
        weights_version: int,
    ) -> None:
        self.queue, self.config, self.weights, self.nodes, self.settings = queue, model_config, weights, nodes, settings
        # What each agent's processes rebuild the policy from; ``weights`` is its broadcast state (LoRA only
        # for a diffusers policy). The planner's degrees must divide the heads.
        self.description, self.num_heads = describe_config(model_config), attention_heads(model_config)
        # The version of ``weights``: every group serves only requests made for it (set_weights moves it on).
        self.weights_version = weights_version
        self.log_path = Path(log_path)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_path.write_text("")
        self._clock, self._start = clock, clock()
        self.agents: dict[str, Any] = {}  # node -> agent with weights loaded
        self.starting: dict[ray.ObjectRef, tuple[str, Any, float]] = {}  # ready ref -> (node, agent, joined at)
        self.leaving: dict[str, float] = {}  # node -> removal time (controller clock)
        self.groups: list[SPGroup] = []
        self.serving: dict[ray.ObjectRef, tuple[str, str]] = {}  # serve ref -> (node, group name)
        self.lost: list[tuple[str, str, float]] = []  # (node, why, when) not yet planned around
        self._loaded: dict[ray.ObjectRef, Any] = {}  # starting agent's ready ref -> the weights it loads
        self.next_generation = 0
        self.report = ElasticSPReport()

    def restart_clock(self) -> None:
        """Count the log's times from now: a caller whose clock restarts after boot calls this right after."""
        self._start = self._clock()

    # -- events --------------------------------------------------------------------------------
    def node_joined(self, node_id: str) -> None:
        """Start the node's agent; it enters the plan once its processes are up and hold the weights."""
        agent = self.nodes.start_agent(node_id, self.settings)
        ready = agent.load_weights.remote(self.description, self.weights)
        self.starting[ready], self._loaded[ready] = (node_id, agent, self._now()), self.weights
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
                self._loaded.pop(ref, None)
        if agent is None:
            self.handle_losses()
            return
        agent.notify_preemption.remote()
        self._collect([ref for ref, (node, _) in self.serving.items() if node == node_id], timeout_s=deadline_s)
        self._release_requests(node_id)  # a step that outlived the deadline: its request goes back now
        self._reconfigure(f"notice {node_id} (deadline {deadline_s:.2f} s)", started)

    def poll_agents(self) -> None:
        """Bring ready agents into the plan, handle groups that stopped serving and nodes that were lost."""
        if self.starting:
            ready, _ = ray.wait(list(self.starting), num_returns=len(self.starting), timeout=0)
            for ref in ready:
                node_id, agent, joined_at = self.starting.pop(ref)
                loaded = self._loaded.pop(ref, None)
                try:
                    ray.get(ref)
                except ray.exceptions.RayError as error:  # died while starting, or its constructor failed
                    self._lose(node_id, f"agent failed to start: {_one_line(error)}")
                    continue
                if loaded is not self.weights:  # new weights came while it started
                    if not self._ask({node_id: agent.load_weights.remote(self.description, self.weights)}):
                        continue
                self.agents[node_id] = agent
                self._reconfigure(f"join {node_id} (agent started in {self._now() - joined_at:.2f} s)", self._now())
            for ref, (node_id, _, joined_at) in list(self.starting.items()):
                if self._now() - joined_at > self.settings.agent_start_s:
                    del self.starting[ref]
                    self._loaded.pop(ref, None)
                    self._lose(node_id, f"agent did not start in {self.settings.agent_start_s:.0f} s")
        self._reap_serving()
        self.handle_losses()

    def _reap_serving(self) -> None:
        """Collect the serve calls that returned; a group that broke gets its lost devices replaced and re-formed."""
        if self.serving:
            done, _ = ray.wait(list(self.serving), num_returns=len(self.serving), timeout=0)
            for node_id in self._collect(done, timeout_s=0):
                started = self._now()
                if node_id in self.agents and self._ask({node_id: self.agents[node_id].replace_lost_devices.remote()}):
                    self._reconfigure(f"device lost on {node_id}", started)

    def set_weights(self, weights: Any, weights_version: int) -> float:
        """Copy θ_weights_version (an ObjectRef of the state dict) into every agent's shared memory; returns seconds.

        Call between batches, when no group is serving (the queue drained): a sample must not mix two
        policies. Agents still starting load them once they are up.
        """
        if self.serving:
            raise RuntimeError(f"set_weights while {len(self.serving)} groups are serving: call it once the "
                               "queue is drained (run_elastic_sp returned), before submitting the next batch")
        started = self._now()
        self.weights, self.weights_version = weights, weights_version
        self._ask({node: agent.load_weights.remote(self.description, weights) for node, agent in self.agents.items()})
        self.handle_losses()
        return self._now() - started

    def serve(self) -> None:
        """Start every planned group that is not serving on the queue (after the next batch was submitted).

        A group's serve call returns once it finds the queue empty, so a group that drained just before
        new requests arrived is idle: `serve_until_drained` calls this on every tick.
        """
        self._reap_serving()
        self.handle_losses()
        busy = {name for _, name in self.serving.values()}
        for group in self.groups:
            node = group.nodes[0]
            if group.name not in busy and node in self.agents:
                self.serving[self.agents[node].serve.remote(self.queue, group.name, self.weights_version,
                                                            self.settings.min_step_s)] = (
                    node, group.name)

    def remove_due_nodes(self) -> None:
        """Take away noticed nodes whose deadline passed (the trace's removal)."""
        for node_id, at in list(self.leaving.items()):
            if self._now() >= at:
                self.nodes.remove(node_id)
                del self.leaving[node_id]
                self.report.removals += 1

    def handle_losses(self) -> None:
        """Plan around the nodes lost since the last call (one logged reconfiguration each), restart crashed ones."""
        while self.lost:
            node_id, why, at = self.lost.pop(0)
            self._release_requests(node_id)  # also those of groups formed on it as it died
            self._reconfigure(f"lost {node_id} ({why})", at)
            if node_id in self.leaving or not self.settings.restart_lost_nodes:
                continue  # preempted anyway: the trace's removal and return stand
            try:
                self.nodes.remove(node_id)
            except Exception:  # noqa: BLE001 - a half-dead node must not stop the controller
                pass
            self.node_joined(node_id)

    # -- planning ------------------------------------------------------------------------------
    def _reconfigure(self, cause: str, started: float) -> PlanDiff:
        """Plan from the agents alive now, carry the plan out, log it (if it changed anything)."""
        alive = self._ask({node: agent.alive_devices.remote() for node, agent in self.agents.items()})
        diff = plan_groups(alive, self.settings.sp_degrees, self.num_heads, previous=self.groups,
                           next_generation=self.next_generation, cross_node=False)
        self.next_generation = diff.next_generation
        dissolved = {group.name for group in diff.dissolved}
        for group in diff.dissolved:
            node = group.nodes[0]
            if node in self.agents:
                self.agents[node].stop_group.remote(group.name)
        self._collect([ref for ref, (_, name) in self.serving.items() if name in dissolved],
                      timeout_s=self.settings.agent_call_s)
        by_node: dict[str, list[SPGroup]] = {}
        for group in diff.formed:
            by_node.setdefault(group.nodes[0], []).append(group)
        self._ask({node: agent.dissolve.remote([g.name for g in diff.dissolved if g.nodes[0] == node])
                   for node, agent in self.agents.items()})
        formed = self._ask({node: self.agents[node].form_groups.remote(groups)
                            for node, groups in by_node.items() if node in self.agents})
        for node in formed:
            if node not in self.agents:
                continue
            for group in by_node[node]:
                ref = self.agents[node].serve.remote(self.queue, group.name, self.weights_version,
                                                     self.settings.min_step_s)
                self.serving[ref] = (node, group.name)
        # Groups on a node lost meanwhile stay in the plan: the next reconfiguration dissolves them.
        self.groups = list(diff.new_groups)
        if diff.changed:
            self.report.reconfigurations += 1
            record = {"at_s": round(started - self._start, 3), "cause": cause,
                      "duration_s": round(self._now() - started, 4), **diff.to_json()}
            with self.log_path.open("a") as log:
                log.write(json.dumps(record) + "\n")
        return diff

    # -- talking to agents ---------------------------------------------------------------------
    def _ask(self, calls: Mapping[str, ray.ObjectRef]) -> dict[str, Any]:
        """The answer of each node's agent to one call (node -> ref); nodes that are gone are lost and left out."""
        answers = {}
        deadline = self._now() + self.settings.agent_call_s
        for node, ref in calls.items():
            try:
                answers[node] = ray.get(ref, timeout=max(0.0, deadline - self._now()))
            except _AGENT_GONE as error:
                self._lose(node, _one_line(error))
        return answers

    def _collect(self, refs: list[ray.ObjectRef], timeout_s: float) -> list[str]:
        """Reap serve calls (waiting up to ``timeout_s`` in all); returns the nodes whose group broke.

        A serve call whose agent died is a node loss; one that does not return in time (its node is
        about to be removed) is dropped, and its request comes back by `_release_requests` or expiry.
        """
        broken = []
        deadline = self._now() + timeout_s
        for ref in refs:
            entry = self.serving.pop(ref, None)
            if entry is None:  # dropped meanwhile with the rest of its lost node's calls
                continue
            node = entry[0]
            try:
                report = ray.get(ref, timeout=max(0.0, deadline - self._now()))
            except ray.exceptions.RayActorError as error:
                self._lose(node, _one_line(error))
                continue
            except ray.exceptions.GetTimeoutError:
                continue
            self.report.serve_reports.append(report)
            if report.stopped_by == "broken":
                broken.append(node)
        return broken

    def _lose(self, node_id: str, why: str) -> None:
        """Count ``node_id`` as gone: out of the plan's agents, its requests back to the queue now."""
        if (node_id in self.leaving and node_id not in self.agents) or any(n == node_id for n, _, _ in self.lost):
            return  # preempted (already out of the plan), or its loss is already queued
        self.agents.pop(node_id, None)
        for ref, (node, _, _) in list(self.starting.items()):
            if node == node_id:
                del self.starting[ref]
                self._loaded.pop(ref, None)
        for ref, (node, _) in list(self.serving.items()):
            if node == node_id:
                del self.serving[ref]
        self._release_requests(node_id)
        self.report.lost_nodes += 1
        self.lost.append((node_id, why, self._now()))

    def _release_requests(self, node_id: str) -> None:
        """Send the requests leased to ``node_id``'s groups back to the queue from their last committed step."""
        for group in self.groups:
            if group.nodes[0] == node_id:
                self.report.requeued += len(ray.get(self.queue.release.remote(f"{node_id}:{group.name}")))

    def _now(self) -> float:
        return self._clock()

    def shutdown(self) -> None:
        """Stop every agent's device processes (agents that are gone already are skipped)."""
        self._ask({node: agent.shutdown.remote() for node, agent in self.agents.items()})


def _one_line(error: BaseException) -> str:
    return f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"[:160]


def serve_until_drained(controller: ElasticSP, replay: TraceReplay | None, timeout_s: float = 600.0) -> None:
    """Drive ``controller`` until its queue is empty: ``replay``'s node events, removals, agents, groups.

    ``replay=None`` when the caller forwards node events itself (``node_joined`` / ``node_noticed``).
    Raises TimeoutError if the queue is not drained in ``timeout_s``.
    """
    started = time.monotonic()
    while ray.get(controller.queue.remaining.remote()) > 0:
        if time.monotonic() - started > timeout_s:
            raise TimeoutError(f"elastic SP run did not drain the queue in {timeout_s} s: raise timeout_s")
        for joined in replay.returns() if replay is not None else ():
            controller.node_joined(joined.node_id)
        for notice in replay.poll() if replay is not None else ():
            controller.node_noticed(notice.node_id, notice.deadline_s)
        controller.remove_due_nodes()
        controller.poll_agents()
        controller.serve()
        time.sleep(controller.settings.poll_s)
    controller._collect(list(controller.serving), timeout_s=controller.settings.agent_call_s)


def run_elastic_sp(
    queue: Any,
    model_config: ModelConfig,
    weights: Any,
    replay: TraceReplay,
    nodes: NodeProvider,
    settings: ElasticSPSettings,
    log_path: str | Path,
    timeout_s: float = 600.0,
    *,
    weights_version: int,
) -> ElasticSPReport:
    """Serve ``queue`` until it is empty while ``replay`` adds, notices and removes spot nodes.

    ``weights``: a Ray ObjectRef of the policy's broadcast state (numpy arrays) for θ_weights_version (the
    version the queue's requests name), loaded once per node into its agent's shared memory. Returns the
    `ElasticSPReport`; the JSONL log at ``log_path`` has one
    line per reconfiguration. Raises TimeoutError if the queue is not drained in ``timeout_s``.
    A training loop keeps one `ElasticSP` for the whole run instead and, per batch, calls
    ``set_weights``, submits, ``serve`` and `serve_until_drained`.
    """
    controller = ElasticSP(queue, model_config, weights, nodes, settings, log_path, weights_version=weights_version)
    started = time.monotonic()
    try:
        serve_until_drained(controller, replay, timeout_s)
    finally:
        controller.report.wall_s = time.monotonic() - started
        controller.report.queue_stats = ray.get(queue.stats.remote())
        try:
            controller.shutdown()
        except ray.exceptions.RayError:
            pass
    return controller.report
