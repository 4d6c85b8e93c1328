"""An attached cluster for real: a multi-node Ray cluster of separate node processes, each spot node's
watcher polling its own IMDSv2 on 127.0.0.1, run through the Spotlight runtime with ``runtime.address``."""

from __future__ import annotations

import json
import math
import threading
import time
from pathlib import Path

import pytest
import ray
from local_ray_node import LEAN_HEAD  # nothing autoscales this cluster: no monitor processes
from metadata_services import AwsImdsPerNode, FakeMetadata, iso

from spotlight.config import TrainConfig, parse_config
from spotlight.runtime.spot.ray_auth import LocalTokenAuth
from spotlight.runtime.spot.ray_nodes import start_node
from spotlight.trainer import Trainer

NOTICE_S = 120.0  # what AWS gives a spot instance
TIME_SCALE = 1 / 40  # the test plays those 120 s in 3 s
NODE_START_S = 240.0  # a bound for failing, not a wait: a node is used as soon as it is alive
# Ray declares a node dead after `health_check_failure_threshold` (5) failed checks in a row, one every
# `health_check_period_ms` (3 s by default: B's loss took ~15 s to be seen). A check of a killed node fails at
# once; one of a live node that is slow fails only at `health_check_timeout_ms` (10 s, kept), so checking
# every 0.2 s finds B dead in ~1 s and still needs a live node to stall for 50 s to be taken for dead.
HEALTH_CHECKS = {"health_check_period_ms": 200}


def attach_config(base: Path, run_dir: Path, address: str, metadata_url: str) -> TrainConfig:
    return parse_config(TrainConfig, {
        "mode": "spotlight", "base_checkpoint": str(base), "run_dir": str(run_dir), "iterations": 4,
        "checkpoint_every": 10,
        "rollout": {"prompts_per_iteration": 3, "group_size": 3, "num_steps": 7},
        "train": {"num_minibatches": 1},
        "explore": {"monitor_prompts": 0},
        "eval": {"every": 10, "seeds_per_prompt": 1, "num_steps": 2, "grid_prompts": 2},
        "runtime": {"address": address, "cloud": "aws", "metadata_url": metadata_url, "watch_interval_s": 0.1,
                    "max_wall_s": None, "explore_wait_s": 120.0, "node_timeout_s": 240.0, "min_step_s": 0.5,
                    "worker_capacity": 4, "planner": {"num_candidates": [4], "num_steps": [6]}},
    })


@pytest.mark.slow
def test_an_attached_cluster_hears_a_notice_over_http_drains_the_node_and_uses_a_late_node(
        tiny_base_model: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Head (on_demand) + spot nodes A and B as separate Ray node processes; each spot node's watcher polls
    its IMDSv2 on 127.0.0.1. While A and B both hold exploration leases, A's service starts answering
    "terminate in 120 s" (scaled to 3 s); after the deadline A's processes are stopped and a third spot
    node C joins. Every exploration request ends once, A's work is committed and resumed, C works. Then B
    dies without a notice: one warning line, and the run goes on with C."""
    from ray.cluster_utils import Cluster

    auth = LocalTokenAuth()  # the nodes and the driver share a token, as the shipped cluster files set them up
    imds = AwsImdsPerNode()
    server = FakeMetadata(imds.respond)
    cluster = Cluster()  # every node is awaited on its readiness, not on Ray's fixed 30 s (ray_nodes.py)
    start_node(cluster, NODE_START_S, "head", num_cpus=1, resources={"on_demand": 1}, include_dashboard=False,
               object_store_memory=200 << 20, _system_config=HEALTH_CHECKS, **LEAN_HEAD)
    spot = {"num_cpus": 1, "resources": {"spot": 1}, "object_store_memory": 200 << 20}
    node_a, node_b = (start_node(cluster, NODE_START_S, name, **spot) for name in ("spot node A", "spot node B"))
    run_dir = tmp_path / "run"
    trainer = Trainer(attach_config(tiny_base_model, run_dir, cluster.address, server.url + "/{node_id}"))
    runtime = trainer.backend.cluster  # the pools, the queue and the open exploration round
    flipped: dict[str, float] = {}

    def flip_a_when_both_nodes_explore() -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not flipped:
            if runtime.round is not None and len(ray.get(runtime.queue.leases_by_worker.remote())) == 2:
                flipped["at"] = time.time()
                flipped["deadline"] = math.ceil(flipped["at"] + NOTICE_S * TIME_SCALE)  # what iso() announces
                imds.service(node_a.node_id).action = {"action": "terminate", "time": iso(flipped["deadline"])}
            time.sleep(0.05)

    node_c: list = []

    def on_iteration(iteration: int, record: dict) -> None:
        if iteration == 1:  # main thread: Ray's node start installs signal handlers
            assert flipped, "A and B never held exploration leases at the same time"
            time.sleep(max(0.0, flipped["deadline"] + 0.5 - time.time()))
            cluster.remove_node(node_a, allow_graceful=False)  # the cloud takes the VM
            node_c.append(start_node(cluster, NODE_START_S, "spot node C", **spot))
            # C's device starts (a process that imports torch) and loads θ_1 while training waits here, so
            # the next iterations' rollouts can use it; B and C idle = C joined and holds the weights.
            ready_by = time.monotonic() + 240
            while time.monotonic() < ready_by:
                with runtime.lock:
                    if len(runtime.pool.devices(state="idle")) == 2:
                        break
                time.sleep(0.1)
        if iteration == 2:
            cluster.remove_node(node_b, allow_graceful=False)  # B vanishes without any notice
            seen_by = time.monotonic() + 120  # Ray declares a killed node dead after its health checks (HEALTH_CHECKS)
            while time.monotonic() < seen_by:
                with runtime.lock:
                    if any(name.endswith(node_b.node_id[:8]) for name in runtime.pool.lost_nodes):
                        break
                time.sleep(0.2)

    trigger = threading.Thread(target=flip_a_when_both_nodes_explore, daemon=True)
    try:
        trigger.start()
        trainer.run(on_iteration)
    finally:
        trainer.backend.close()
        cluster.shutdown()
        server.close()
        auth.undo()

    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    summary = json.loads((run_dir / "summary.json").read_text())
    queue = summary["queue"]
    names = {event["node"] for event in events if event["kind"] == "node_added"}
    name_a = next(name for name in names if name.endswith(node_a.node_id[:8]))
    name_b = next(name for name in names if name.endswith(node_b.node_id[:8]))
    name_c = next(name for name in names if name.endswith(node_c[0].node_id[:8]))
    notices = [event for event in events if event["kind"] == "preemption_notice"]
    drained = [event for event in events if event["kind"] == "node_drained"]
    busy = [event for event in events if event["kind"] == "busy" and event["phase"] in ("rollout", "explore")]
    busy_s = {name: sum(e["end"] - e["start"] for e in busy if e["node"] == name) for name in names}
    late_share = busy_s[name_c] / sum(busy_s.values())
    print(f"\nnotices over HTTP: {imds.actions_served.get(node_a.node_id, 0)} answers, {len(notices)} notice(s) "
          f"(deadline {notices[0]['deadline_s'] if notices else '-'} s); drained {drained}; queue {queue}; "
          f"busy s per node {busy_s}; late node share {late_share:.2f}")
    assert [event["node"] for event in notices] == [name_a]
    assert 0 < notices[0]["deadline_s"] <= NOTICE_S * TIME_SCALE + 1  # AWS's time has whole seconds
    assert [event["node"] for event in drained] == [name_a] and drained[0]["after_notice_s"] < NOTICE_S * TIME_SCALE
    assert queue["commits"] >= 1 and queue["resumed"] >= 1  # A finished its step, committed; B resumed
    assert queue["duplicate_completions"] == 0 and queue["pending"] == 0 and queue["leased"] == 0
    assert queue["done"] + queue["cancelled"] == queue["submitted"] and queue["cancelled"] == 0
    assert late_share > 0  # the node that joined mid-run got the weights and work
    assert [event["node"] for event in events if event["kind"] == "node_lost"] == [name_b]  # A went as announced
    warnings = [record.getMessage() for record in caplog.records if record.levelname == "WARNING"
                and record.name.startswith("spotlight")]
    assert len(warnings) == 1 and name_b in warnings[0] and "without a preemption notice" in warnings[0]
    assert json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])["iteration"] == 4  # and went on
