"""A LoRA policy on the Ray runtime: spotlight mode with configs/sd3-tiny-lora.yaml, and what a spot device is sent.

One test (a local Ray cluster costs seconds to start): a 2-iteration spotlight run whose spot device
explores with the stale LoRA weights, then a spot device handed that run's checkpoint: it receives
only the LoRA matrices, rebuilds the base from the config's init_seed, and samples exactly what the
trainer samples.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import ray
import torch
from safetensors.torch import load_file

from spotlight.components.checkpoint import load_model
from spotlight.config import TrainConfig, load_config
from spotlight.diffusion.sampler import SamplingPlan
from spotlight.models.generation import generate
from spotlight.runtime.queue.remote import start_queue_actor
from spotlight.runtime.spot.device import SpotDevice
from spotlight.runtime.spot.pools import LocalCluster
from spotlight.runtime.spot.worker import WorkerSettings, model_weights
from spotlight.trainer import train

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "sd3-tiny-lora.yaml"


def spotlight_config(run_dir: Path) -> TrainConfig:
    return load_config(TrainConfig, CONFIG, [
        "mode=spotlight", "iterations=2", f"run_dir={run_dir}", "pin_devices=false", "checkpoint_every=1",
        "eval.every=2", "eval.prompts=4", "runtime.trace=null", "runtime.max_wall_s=null",
        "runtime.explore_wait_s=120.0", "runtime.node_timeout_s=240.0", "runtime.planner.num_candidates=[4]",
        "runtime.planner.num_steps=[3]"])


@pytest.mark.slow
def test_spotlight_mode_trains_a_lora_policy_and_spot_devices_get_only_lora_weights(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    summary = train(spotlight_config(run_dir))
    assert [record["iteration"] for record in summary.history] == [0, 1, 2]
    second = summary.history[2]
    assert second["explore/selected_reward_std"] >= 0 and "planner/num_candidates" in second  # explored on spot
    checkpoint = run_dir / "checkpoints" / "iter-000002"
    assert all(".lora_" in name for name in load_file(str(checkpoint / "model.safetensors")))
    assert json.loads((checkpoint / "model.json").read_text())["base"] == {"tiny": True, "init_seed": 0}

    policy = load_model(checkpoint)
    weights = model_weights(policy)
    assert weights and all(".lora_A." in name or ".lora_B." in name for name in weights)
    cluster = LocalCluster(node_timeout_s=240.0)
    try:
        cluster.add_spot_node("node0")
        queue = start_queue_actor(resource="on_demand")
        device = SpotDevice.options(resources={"spot": 1}, num_cpus=1).remote(
            "spot-0", queue, policy.config, WorkerSettings())
        ray.get(device.load_weights.remote(0, ray.put(weights)), timeout=240.0)
        held = ray.get(device.weights.remote(), timeout=60.0)
        assert sorted(held) == sorted(weights)
        plan = SamplingPlan(num_steps=2, shift=3.0, sampler="sde", noise_level=0.7)
        prompts, seeds = ["a red circle", "two blue squares"], [3, 4]
        remote = ray.get(device.sample.remote(prompts, seeds, plan, 0), timeout=120.0).result
        with torch.no_grad():
            local = generate(policy.eval(), prompts, seeds, plan)
        assert torch.equal(remote[0], local.latents)  # the base rebuilt from init_seed is the trainer's, bit for bit
        assert torch.equal(remote[1], local.log_probs)
    finally:
        cluster.shutdown()
    assert not ray.is_initialized(), "the run or the cluster left Ray running"

