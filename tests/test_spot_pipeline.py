"""The Spotlight loop on a real local Ray cluster: pools, weights, preemption, exactly-once exploration.

One run, shared by the tests of this module (a Ray cluster costs seconds to start on this machine):
a 2-iteration spotlight-mode run with one on-demand and one spot device, on a trace that preempts
the spot node in the middle (notice, removal, return) and brings it back.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import ray

from spotlight.components.checkpoint import load_model
from spotlight.config import TrainConfig, parse_config
from spotlight.diffusion.sampler import SamplingPlan
from spotlight.runtime.queue.remote import start_queue_actor
from spotlight.runtime.spot.device import SpotDevice
from spotlight.runtime.spot.pools import LocalCluster
from spotlight.runtime.spot.worker import WorkerSettings, model_weights
from spotlight.trainer import train


def runtime_config(base: Path, run_dir: Path, trace: Path, **runtime) -> TrainConfig:
    return parse_config(TrainConfig, {
        "mode": "spotlight", "base_checkpoint": str(base), "run_dir": str(run_dir), "iterations": 2,
        "checkpoint_every": 1,
        "rollout": {"prompts_per_iteration": 2, "group_size": 3, "num_steps": 7},
        "train": {"kl_beta": 0.01, "num_minibatches": 1, "ema_decay": 0.5},
        "explore": {"monitor_prompts": 1},
        "eval": {"every": 10, "seeds_per_prompt": 1, "num_steps": 2, "grid_prompts": 2},
        "runtime": {"trace": str(trace), "time_scale": 1.0, "grace_s": 0.5, "max_wall_s": None,
                    "explore_wait_s": 120.0, "node_timeout_s": 240.0, "min_step_s": 0.75,
                    "planner": {"num_candidates": [4], "num_steps": [6]}, **runtime},
    })


@pytest.fixture(scope="module")
def spotlight_run(tiny_base_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished 2-iteration spotlight run whose spot node gets a notice 3 s in, goes at 3.5 s, is back at 3.6 s.

    The exploration round for iteration 2 (opened after iteration 1's rollout, well before 3 s) takes
    at least 4.5 s: 6 denoising passes of at least 0.75 s each (runtime.min_step_s; a 6-step arm of a 7-step
    rollout is its first 5 steps and one jump to the data), so the notice lands in the middle of it, however
    fast or loaded the machine is: at most 4 of its passes are done at 3 s, and the rest wait for the return.
    """
    folder = tmp_path_factory.mktemp("loop")
    trace = folder / "trace.csv"
    trace.write_text("0,add,node0\n3500,remove,node0\n3600,add,node0\n")
    run_dir = folder / "run"
    train(runtime_config(tiny_base_model, run_dir, trace))
    return run_dir


@pytest.mark.slow
def test_spotlight_run_logs_the_report_contract_every_iteration(spotlight_run: Path) -> None:
    records = [json.loads(line) for line in (spotlight_run / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in records] == [0, 1, 2]
    for record in records[1:]:
        for name in ("time/wall_s", "cost/usd", "cost/usd_on_demand", "cost/usd_spot", "rollout/group_reward_var",
                     "rollout/group_reward_std", "util/spot_train_phase", "util/spot", "util/on_demand",
                     "time/train_s", "time/rollout_s"):
            assert name in record, name
        assert record["cost/usd"] == pytest.approx(record["cost/usd_on_demand"] + record["cost/usd_spot"])
    assert records[2]["cost/usd"] > records[1]["cost/usd"] > 0
    # iteration 2's seeds came from the exploration that ran during iteration 1's training
    assert "planner/num_candidates" in records[2] and "explore/selected_reward_std" in records[2]
    assert "val/strict_accuracy" in records[2]


@pytest.mark.slow
def test_the_preemption_happened_and_every_exploration_request_completed_once(spotlight_run: Path) -> None:
    events = [json.loads(line) for line in (spotlight_run / "events.jsonl").read_text().splitlines()]
    kinds = [event["kind"] for event in events]
    removed = kinds.index("node_removed")
    assert kinds.index("preemption_notice") < removed < kinds.index("node_added", removed)  # and it came back
    assert any(event["kind"] == "busy" and event["phase"] == "explore" for event in events)
    queue = json.loads((spotlight_run / "summary.json").read_text())["queue"]
    assert queue["submitted"] > 0
    assert queue["done"] == queue["submitted"] and queue["pending"] == queue["leased"] == 0
    assert queue["cancelled"] == 0 and queue["duplicate_completions"] == 0
    # the notice came mid-round: in-flight requests were committed and resumed on the returned node
    assert queue["commits"] >= 1 and queue["resumed"] >= 1


@pytest.mark.slow
def test_weights_reach_a_spot_device_through_the_object_store_unchanged(tiny_base_model: Path) -> None:
    model = load_model(tiny_base_model)
    cluster = LocalCluster(node_timeout_s=240.0)
    try:
        node_id = cluster.add_spot_node("node0")
        queue = start_queue_actor(resource="on_demand")
        device = SpotDevice.options(resources={"spot": 1}, num_cpus=1).remote(
            "spot-0", queue, model.config, WorkerSettings())
        weights = model_weights(model)
        ray.get(device.load_weights.remote(0, ray.put(weights)), timeout=240.0)
        held = ray.get(device.weights.remote(), timeout=60.0)
        assert node_id
        assert sorted(held) == sorted(weights)
        for name, array in weights.items():
            np.testing.assert_array_equal(held[name], array, err_msg=name)
        plan = SamplingPlan(num_steps=2)  # a rollout part for θ_1 on a device holding θ_0: refused, nothing sampled
        assert ray.get(device.sample.remote(["a red circle"], [3], plan, 1), timeout=60.0).result is None
        assert ray.get(device.sample.remote(["a red circle"], [3], plan, 0), timeout=60.0).result is not None
    finally:
        cluster.shutdown()


@pytest.fixture(autouse=True, scope="module")
def _no_ray_left() -> Iterator[None]:
    yield
    assert not ray.is_initialized(), "a test left Ray running: every runtime must shut its cluster down"
