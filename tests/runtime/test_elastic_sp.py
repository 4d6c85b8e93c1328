"""The elastic SP controller when a node dies without notice: planned around, requests back, never a crash.

The agents are stand-ins (Ray actors that answer like a `NodeAgent` with two healthy devices and hold
one leased request per group until stopped), so the test exercises the controller's handling of a
dead actor handle in seconds; the real agents and their device processes are tested in
test_agent.py and run end to end in benchmarks/reliability/elastic_sp_run.py.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray
import torch
from local_ray_node import local_ray

from spotlight.diffusion.sampler import SamplingPlan
from spotlight.models.tinydit import TinyDiTConfig
from spotlight.runtime.queue.remote import RemoteQueue, start_queue_actor
from spotlight.runtime.queue.request_queue import Request
from spotlight.runtime.sp.agent import ServeReport
from spotlight.runtime.sp.elastic import ElasticSP, ElasticSPSettings, serve_until_drained
from spotlight.runtime.sp.reconfigure import SPGroup

CONFIG = TinyDiTConfig(image_size=16, patch_size=4, dim=32, depth=1, num_heads=4)
COMMITTED_STEP = 3


@ray.remote(num_cpus=0, max_concurrency=4)
class StandInAgent:
    """Answers like a `NodeAgent` with devices 0 and 1; ``serve`` leases one request, checkpoints it, waits."""

    def __init__(self, node_id: str, finish: bool = False) -> None:
        self.node_id, self.finish = node_id, finish
        self.stop: dict[str, threading.Event] = {}
        self.weights: list[Any] = []

    def load_weights(self, config: dict[str, Any], weights: Any) -> float:
        self.weights.append(weights)
        return 0.0

    def loaded(self) -> list[Any]:
        return self.weights

    def alive_devices(self) -> list[int]:
        return [0, 1]

    def dissolve(self, names: list[str]) -> None:
        for name in names:
            self.stop.pop(name, threading.Event()).set()

    def form_groups(self, groups: list[SPGroup]) -> dict[str, float]:
        self.stop.update({group.name: threading.Event() for group in groups})
        return dict.fromkeys((group.name for group in groups), 0.0)

    def serve(self, queue: Any, group_name: str, weights_version: int, min_step_s: float) -> ServeReport:
        worker_id, client = f"{self.node_id}:{group_name}", RemoteQueue(queue)
        while self.finish and client.remaining(weights_version):  # a finishing stand-in "denoises" to its weights
            for lease in client.pull(worker_id, 1, weights_version):
                client.complete(worker_id, lease.request.request_id, torch.full(CONFIG.latent_shape, self.weights[-1]),
                                weights_version)
            time.sleep(0.01)
        if self.finish:
            return ServeReport(group_name, "drained")
        for lease in client.pull(worker_id, 1, weights_version):
            client.commit(worker_id, lease.request.request_id, torch.zeros(CONFIG.latent_shape), COMMITTED_STEP,
                          weights_version, keep_lease=True)
        self.stop[group_name].wait(60)
        return ServeReport(group_name, "stopped")

    def stop_group(self, name: str) -> None:
        self.stop.get(name, threading.Event()).set()

    def notify_preemption(self) -> None:
        for event in self.stop.values():
            event.set()

    def replace_lost_devices(self) -> dict[int, int]:
        return {}

    def shutdown(self) -> None:
        self.notify_preemption()


class StandInNodes:
    """A node provider whose nodes are stand-in agents; remembers every agent it started."""

    def __init__(self, finish: bool = False) -> None:
        self.started: list[tuple[str, Any]] = []
        self.removed: list[str] = []
        self.finish = finish

    def start_agent(self, node_id: str, settings: ElasticSPSettings) -> Any:
        self.started.append((node_id, StandInAgent.remote(node_id, self.finish)))
        return self.started[-1][1]

    def remove(self, node_id: str) -> None:
        self.removed.append(node_id)


@pytest.fixture(scope="module")
def ray_node() -> Iterator[None]:
    with local_ray(num_cpus=2, resources={"on_demand": 1}):
        yield


def poll_until(controller: ElasticSP, done: Any, timeout_s: float = 180.0) -> None:
    """Poll the controller until ``done()``; the bound only ends a broken run (Ray actors start slowly under load)."""
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, "the controller did not get there in time"
        controller.poll_agents()
        time.sleep(0.02)


@pytest.mark.slow
def test_a_dead_agent_is_a_node_loss_its_request_resumes_and_the_node_restarts(ray_node: None, tmp_path: Path) -> None:
    queue = start_queue_actor(lease_timeout_s=600.0)  # expiry never rescues the request: the controller must
    plan = SamplingPlan(num_steps=8)
    ray.get(queue.submit.remote([Request(f"r{i}", "a red circle", i, plan, weights_version=0) for i in range(3)]))
    nodes, log_path = StandInNodes(), tmp_path / "reconfigurations.jsonl"
    controller = ElasticSP(queue, CONFIG, None, nodes, ElasticSPSettings(sp_degrees={16: 2}, agent_call_s=10.0),
                           log_path, weights_version=0)
    controller.node_joined("n0")
    controller.node_joined("n1")
    poll_until(controller, lambda: len(controller.agents) == 2)
    poll_until(controller, lambda: ray.get(queue.stats.remote()).checkpoints == 2)

    (n0_group,) = [group for group in controller.groups if group.nodes == ("n0",)]
    ray.kill(controller.agents["n0"], no_restart=True)
    poll_until(controller, lambda: controller.report.lost_nodes == 1 and len(controller.agents) == 2)

    assert controller.report.requeued == 1  # n0's request went back at once, not after the lease timeout
    assert nodes.removed == ["n0"] and [node for node, _ in nodes.started] == ["n0", "n1", "n0"]
    records = [json.loads(line) for line in log_path.read_text().splitlines()]
    lost = [record for record in records if record["cause"].startswith("lost n0")]
    assert len(lost) == 1 and lost[0]["dissolved"] == [n0_group.name] and lost[0]["duration_s"] >= 0
    assert "ActorDiedError" in lost[0]["cause"] or "ActorUnavailableError" in lost[0]["cause"]
    assert records[-1]["cause"].startswith("join n0") and records[-1]["formed"] == ["sp-gen2"]  # a new generation
    poll_until(controller, lambda: ray.get(queue.stats.remote()).resumed == 1)  # from its committed step
    controller.shutdown()


def test_one_controller_serves_batch_after_batch_each_with_the_weights_set_before_it(
    ray_node: None, tmp_path: Path
) -> None:
    queue = start_queue_actor(lease_timeout_s=600.0)
    plan, nodes = SamplingPlan(num_steps=8), StandInNodes(finish=True)
    controller = ElasticSP(queue, CONFIG, 1.0, nodes, ElasticSPSettings(sp_degrees={16: 2}, agent_call_s=10.0),
                           tmp_path / "reconfigurations.jsonl", weights_version=0)
    controller.node_joined("n0")
    poll_until(controller, lambda: len(controller.agents) == 1)
    for batch, weights in enumerate([1.0, 2.0]):
        if batch:
            controller.set_weights(weights, batch)
            controller.node_joined("n1")  # joins with the weights of this batch
        ids = [f"b{batch}-{i}" for i in range(4)]
        ray.get(queue.submit.remote([Request(rid, "a red circle", i, plan, weights_version=batch)
                                     for i, rid in enumerate(ids)]))
        controller.serve()
        serve_until_drained(controller, replay=None, timeout_s=180.0)
        results = ray.get(queue.take_results.remote(ids))
        assert sorted(results) == ids and all(torch.all(latent == weights) for latent in results.values())
    poll_until(controller, lambda: len(controller.agents) == 2)
    assert [ray.get(agent.loaded.remote()) for _, agent in nodes.started] == [[1.0, 2.0], [2.0]]
    with pytest.raises(RuntimeError, match="groups are serving"):
        ray.get(queue.submit.remote([Request("b2-0", "a red circle", 0, plan, weights_version=1)]))
        controller.serve()
        controller.set_weights(3.0, 2)
    serve_until_drained(controller, replay=None, timeout_s=180.0)
    controller.shutdown()
