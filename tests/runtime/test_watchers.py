"""Spot nodes of an attached cluster: cloud detection, a watcher against a real metadata server, and a
multi-node Ray cluster of separate node processes run through ``spotlight train --address``."""

from __future__ import annotations

import json
import math
import os
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest
import ray
from metadata_services import AwsImdsPerNode, FakeMetadata

from spotlight.config import TrainConfig, parse_config
from spotlight.runtime.watchers import NodeWatcher, WatchSettings, detect_cloud
from spotlight.spot_pipeline import RayRuntime

NOTICE_S = 120.0  # what AWS gives a spot instance
TIME_SCALE = 1 / 40  # the test plays those 120 s in 3 s


def iso(epoch: float) -> str:
    """AWS's instance-action time format (whole seconds, rounded up so that no grace is lost)."""
    return datetime.fromtimestamp(math.ceil(epoch), tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def test_the_cloud_is_detected_from_the_dmi_vendor(tmp_path: Path) -> None:
    files = []
    for name, vendor in (("aws", "Amazon EC2\n"), ("gcp", "Google\n"), ("azure", "Microsoft Corporation\n"),
                         ("laptop", "LENOVO\n")):
        files.append(tmp_path / name)
        files[-1].write_text(vendor)
    assert [detect_cloud((str(path),)) for path in files] == ["aws", "gcp", "azure", None]
    assert detect_cloud((str(tmp_path / "missing"), str(files[1]))) == "gcp"  # the first file that exists


def test_a_watcher_hands_over_an_aws_notice_once_with_its_wall_clock_deadline() -> None:
    imds = AwsImdsPerNode()
    server = FakeMetadata(imds.respond)
    try:
        watcher = NodeWatcher("spot-a", "abc123", WatchSettings("aws", server.url + "/{node_id}", interval_s=0.05))
        deadline = time.time() + 120
        time.sleep(0.2)
        assert watcher.take() == []
        imds.service("abc123").action = {"action": "terminate", "time": iso(deadline)}
        time.sleep(0.3)
        notices = watcher.take()
        time.sleep(0.2)
        assert watcher.take() == []  # the service keeps answering with it; it is handed over once
        watcher.stop()
    finally:
        server.close()
    assert [(node, source) for node, _, source in notices] == [("spot-a", "aws")]
    assert 0 <= notices[0][1] - deadline <= 1.0  # ISO time has whole seconds
    assert imds.requests["abc123"] >= 4 and imds.actions_served["abc123"] >= 2


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
        tiny_base_model: Path, tmp_path: Path) -> None:
    """Head (on_demand) + spot nodes A and B as separate Ray node processes; each spot node's watcher polls
    its IMDSv2 on 127.0.0.1. While A and B both hold exploration leases, A's service starts answering
    "terminate in 120 s" (scaled to 3 s); after the deadline A's processes are stopped and a third spot
    node C joins. Every exploration request ends once, A's work is committed and resumed, C works."""
    from ray.cluster_utils import Cluster

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    imds = AwsImdsPerNode()
    server = FakeMetadata(imds.respond)
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "resources": {"on_demand": 1}, "include_dashboard": False, "object_store_memory": 200 << 20})
    spot = {"num_cpus": 1, "resources": {"spot": 1}, "object_store_memory": 200 << 20}
    node_a = cluster.add_node(**spot)
    cluster.add_node(**spot)  # B
    cluster.wait_for_nodes()
    run_dir = tmp_path / "run"
    runtime = RayRuntime(attach_config(tiny_base_model, run_dir, cluster.address, server.url + "/{node_id}"))
    flipped: dict[str, float] = {}

    def flip_a_when_both_nodes_explore() -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not flipped:
            if runtime.round is not None and len(ray.get(runtime.queue.leases_by_worker.remote())) == 2:
                flipped["at"] = time.time()
                imds.service(node_a.node_id).action = {"action": "terminate",
                                                       "time": iso(time.time() + NOTICE_S * TIME_SCALE)}
            time.sleep(0.05)

    node_c: list = []

    def on_iteration(iteration: int, record: dict) -> None:
        if iteration == 1:  # main thread: Ray's node start installs signal handlers
            assert flipped, "A and B never held exploration leases at the same time"
            time.sleep(max(0.0, flipped["at"] + NOTICE_S * TIME_SCALE - time.time()))
            cluster.remove_node(node_a, allow_graceful=False)  # the cloud takes the VM
            node_c.append(cluster.add_node(**spot))
            # C's device starts (a process that imports torch) and loads θ_1 while training waits here, so
            # the next iterations' rollouts can use it; B and C idle = C joined and holds the weights.
            ready_by = time.monotonic() + 240
            while time.monotonic() < ready_by:
                with runtime.lock:
                    if len(runtime.pool.devices(state="idle")) == 2:
                        break
                time.sleep(0.1)

    trigger = threading.Thread(target=flip_a_when_both_nodes_explore, daemon=True)
    try:
        trigger.start()
        runtime.run(on_iteration)
    finally:
        runtime.close()
        cluster.shutdown()
        server.close()

    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    summary = json.loads((run_dir / "summary.json").read_text())
    queue = summary["queue"]
    names = {event["node"] for event in events if event["kind"] == "node_added"}
    name_a = next(name for name in names if name.endswith(node_a.node_id[:8]))
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
    assert 0 < notices[0]["deadline_s"] <= NOTICE_S * TIME_SCALE
    assert [event["node"] for event in drained] == [name_a] and drained[0]["after_notice_s"] < NOTICE_S * TIME_SCALE
    assert queue["commits"] >= 1 and queue["resumed"] >= 1  # A finished its step, committed; B resumed
    assert queue["duplicate_completions"] == 0 and queue["pending"] == 0 and queue["leased"] == 0
    assert queue["done"] + queue["cancelled"] == queue["submitted"] and queue["cancelled"] == 0
    assert late_share > 0  # the node that joined mid-run got the weights and work
    assert not any(event["kind"] == "node_lost" for event in events)  # A went at its deadline, as announced
