"""A pipeline-folder policy on the Ray runtime: spotlight mode on a tiny SD3 pipeline with CFG, and a spot
device that rebuilds the same policy from the folder (its text encoders, its VAE) and samples exactly what
the trainer samples from the LoRA weights alone.

The tests after the spotlight run share one local cluster (`spot_cluster`: a cluster costs seconds to start
on this machine), whose spot node offers a logical GPU; the disaggregated run, which starts a cluster of its
own, goes first.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray
import torch

from spotlight.components.checkpoint import load_model
from spotlight.config import TrainConfig, parse_config
from spotlight.loop.rollout import rollout_plan
from spotlight.models.generation import generate
from spotlight.runtime.queue.remote import start_queue_actor
from spotlight.runtime.spot.device import SpotDevice
from spotlight.runtime.spot.pools import LocalCluster
from spotlight.runtime.spot.worker import WorkerSettings, model_weights
from spotlight.trainer import RunSummary, train


def spotlight_config(folder: Path, run_dir: Path) -> TrainConfig:
    return parse_config(TrainConfig, {
        "mode": "spotlight", "iterations": 2, "run_dir": str(run_dir), "pin_devices": False, "checkpoint_every": 1,
        "model": {"pretrained": str(folder), "lora_rank": 2},
        "rollout": {"resolution": 32, "prompts_per_iteration": 2, "group_size": 2, "num_steps": 3, "sde_steps": None,
                    "guidance_scale": 2.0, "negative_prompt": "blurry"},
        "train": {"num_minibatches": 1, "num_epochs": 1},
        "explore": {"monitor_prompts": 1},
        "eval": {"every": 2, "seeds_per_prompt": 1, "num_steps": 2, "grid_prompts": 2, "raw_model": False,
                 "prompts": 4},
        "runtime": {"trace": None, "max_wall_s": None, "explore_wait_s": 120.0, "node_timeout_s": 240.0,
                    "planner": {"num_candidates": [4], "num_steps": [2]}},
    })


@pytest.mark.slow
def test_mode_disaggregated_trains_a_pipeline_folder(tiny_pipeline, tmp_path: Path) -> None:
    """Generators sample and score with their own prompt caches; the trainer's update rows are its own
    (prompt ids it encoded, CFG-free for nft), not the generators'."""
    run_dir = tmp_path / "run"
    config = parse_config(TrainConfig, {
        "mode": "disaggregated", "iterations": 2, "run_dir": str(run_dir), "pin_devices": False,
        "model": {"pretrained": str(tiny_pipeline("sd3")), "lora_rank": 2},
        "rollout": {"resolution": 32, "prompts_per_iteration": 2, "group_size": 2, "num_steps": 2, "sde_steps": None,
                    "guidance_scale": 2.0},
        "train": {"num_minibatches": 1, "num_epochs": 1, "old_policy_decay": 0.0, "nft_kl_beta": 0.0},
        "explore": {"planner": None},
        "eval": {"seeds_per_prompt": 1, "num_steps": 2, "grid_prompts": 2, "raw_model": False, "prompts": 4},
    })
    summary = train(config)
    assert [record["iteration"] for record in summary.history] == [0, 1, 2]
    assert all(record["rollout/invalid_samples"] == 0 for record in summary.history[1:])


@pytest.fixture(scope="module")
def spotlight_run(tiny_pipeline, tmp_path_factory: pytest.TempPathFactory) -> tuple[TrainConfig, Path, RunSummary]:
    """A finished 2-iteration spotlight run of the tiny SD3 folder: (config, folder, summary)."""
    folder = tiny_pipeline("sd3")
    config = spotlight_config(folder, tmp_path_factory.mktemp("folder-ray") / "run")
    summary = train(config)
    assert not ray.is_initialized(), "the run left Ray running"
    return config, folder, summary


@pytest.fixture(scope="module")
def spot_cluster(spotlight_run) -> Iterator[tuple[LocalCluster, str]]:
    """(cluster, node id): a local cluster with one spot node, ``node0``, offering one logical GPU.

    Started after the spotlight run (a run starts a cluster of its own, and a process holds one at a time).
    The rebuild test frees node0's CPU for the GPU test, whose device then holds node0's GPU.
    """
    cluster = LocalCluster(node_timeout_s=240.0, spot_gpus=1)
    try:
        yield cluster, cluster.add_spot_node("node0")
    finally:
        cluster.shutdown()
    assert not ray.is_initialized(), "the cluster left Ray running"


@pytest.mark.slow
def test_spotlight_mode_trains_a_pipeline_folder_and_a_spot_device_rebuilds_it(spotlight_run, spot_cluster) -> None:
    config, folder, summary = spotlight_run
    run_dir = Path(config.run_dir)
    assert [record["iteration"] for record in summary.history] == [0, 1, 2]
    assert "planner/num_candidates" in summary.history[2]  # iteration 2's seeds were explored on the spot device
    checkpoint = run_dir / "checkpoints" / "iter-000002"
    assert json.loads((checkpoint / "model.json").read_text())["base"] == {"pretrained": str(folder.resolve())}

    policy = load_model(checkpoint)
    weights = model_weights(policy)
    assert weights and all(".lora_" in name for name in weights)
    queue = start_queue_actor(resource="on_demand")
    device = SpotDevice.options(resources={"spot": 1}, num_cpus=1).remote(
        "spot-0", queue, policy.config, WorkerSettings())
    try:
        ray.get(device.load_weights.remote(0, ray.put(weights)), timeout=240.0)
        plan = rollout_plan(config)
        prompts, seeds = ["a red circle", "two blue squares"], [3, 4]
        remote = ray.get(device.sample.remote(prompts, seeds, plan, 0), timeout=120.0).result
        with torch.no_grad():
            local = generate(policy.eval(), prompts, seeds, plan)
        assert torch.equal(remote[0], local.latents)  # same folder, same prompt ids, same LoRA: the same bits
    finally:
        ray.kill(device)  # node0's CPU, free for the next test's device
        ray.kill(queue)


@pytest.mark.slow
def test_spot_nodes_offer_a_gpu_and_spot_devices_take_it_when_the_policy_is_on_cuda(spot_cluster) -> None:
    """device: cuda reaches Ray as resources (logical GPUs: this test needs no GPU); the device then moves its
    policy there (model_from_weights(..., settings.device)) when its first weights arrive."""
    import time

    from spotlight.market.billing import DeviceLedger
    from spotlight.market.prices import default_prices
    from spotlight.runtime.section import RuntimeSection
    from spotlight.runtime.spot.events import EventLog
    from spotlight.runtime.spot.pools import SpotPool

    prices = RuntimeSection().prices
    _, node_id = spot_cluster  # LocalCluster(spot_gpus=1): its spot node offers one
    assert next(n for n in ray.nodes() if n["NodeID"] == node_id)["Resources"].get("GPU") == 1.0
    pool = SpotPool(start_queue_actor(resource="on_demand"), {"image_size": 8}, WorkerSettings(device="cuda"),
                    DeviceLedger(default_prices(prices.instance, prices.on_demand_per_gpu_hour,
                                                prices.spot_per_gpu_hour)),
                    EventLog(None), lambda: 0.0, time.time())
    pool.node_added("node0", node_id)
    device = next(iter(pool._devices.values()))
    assert ray.get(device.ref, timeout=240.0) == device.device_id  # scheduled: the node had the GPU it asked for
    assert ray.available_resources().get("GPU", 0.0) == 0.0  # and it holds it
