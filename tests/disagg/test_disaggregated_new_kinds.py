"""Mode disaggregated on the issue-45 kinds: Wan2.1 text-to-video, Wan2.2's two experts, FLUX.1 Kontext,
Qwen-Image-Edit and Qwen-Image-Edit-2509 edits.

Each kind's tiny random pipeline folder trains two steps with one generator device (a Ray actor that
rebuilds the policy from the folder, draws the units and scores them with the run's reward) and the
trainer's update (GAP, timestep packing) on the driver. The smallest run that still crosses every
process boundary: one prompt (an edit row: instruction and source image), a group of 2 (one unit),
2 denoising steps, 16 x 16 (5 frames for Wan). Wan2.2 takes 4 steps and 4 NFT noise levels
(tests/test_wan22_train.py), so that both experts draw and both are trained.

What a broken kind would show: a generator that cannot rebuild or score it stops the run
(`RunError`); one that rebuilds it without its conditioning (the row's source image, the video's
frames, the guidance) draws other samples than the vanilla loop does from the same weights, prompt
and seed, so step 0's rewards differ; an update that does not reach the weights leaves the LoRA's
``lora_B`` at its zero init (ΔW = BA = 0) or a zero gradient norm (Wan2.2: each expert's LoRA file).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import pytest
import ray
from safetensors.torch import load_file

from spotlight.config import TrainConfig, parse_config
from spotlight.models.video.two_experts_policy import LOW_NOISE_LORA_FILE
from spotlight.runtime.spot.pools import LocalCluster
from spotlight.trainer import train

ITERATIONS = 2
PROMPTS, GROUP = 1, 2

KINDS: dict[str, dict[str, Any]] = {  # each kind's settings of its own end-to-end file (tests/test_*_train.py)
    "wan": {"model": {"max_sequence_length": 32}, "rollout": {"num_frames": 5, "guidance_scale": 2.0},
            "reward": {"name": "video_reward:brightness"}},
    "flux-kontext": {"model": {"max_sequence_length": 32}, "data": {"dataset": "shapes-edit"},
                     "rollout": {"guidance_scale": 2.5}, "reward": {"name": "edit-preserve"}},
    "qwen-image-edit": {"data": {"dataset": "shapes-edit"}, "rollout": {"guidance_scale": 1.0},
                        "reward": {"name": "edit-preserve"}},
    # Wan2.2 A14B: timesteps 1000 | 858, 602, 9 and an eighth of the noise levels reach the high-noise expert
    "wan22": {"model": {"max_sequence_length": 32}, "rollout": {"num_frames": 5, "guidance_scale": 2.0, "num_steps": 4},
              "train": {"nft_timesteps": 4}, "reward": {"name": "video_reward:brightness"}},
    "qwen-image-edit-plus": {"data": {"dataset": "shapes-edit"}, "rollout": {"guidance_scale": 1.0},
                             "reward": {"name": "edit-preserve"}},
}


def settings(kind: str, folder: Path, run_dir: Path, mode: str = "disaggregated",
             iterations: int = ITERATIONS) -> dict[str, Any]:
    extra = KINDS[kind]
    config: dict[str, Any] = {
        "mode": mode, "iterations": iterations, "run_dir": str(run_dir), "pin_devices": False, "num_threads": 1,
        "checkpoint_every": ITERATIONS,
        "model": {"pretrained": str(folder), "lora_rank": 2, **extra.get("model", {})},
        "rollout": {"resolution": 16, "prompts_per_iteration": PROMPTS, "group_size": GROUP, "num_steps": 2,
                    "sde_steps": None, **extra["rollout"]},
        "train": {"num_minibatches": 1, "num_epochs": 1, "learning_rate": 0.05, "old_policy_decay": 0.0,
                  "nft_kl_beta": 0.0, **extra.get("train", {})},
        "reward": extra["reward"],
        "eval": {"every": 100, "seeds_per_prompt": 1, "num_steps": 2, "grid_prompts": 1, "raw_model": False,
                 "prompts": 1},
    }
    if "data" in extra:
        config["data"] = extra["data"]
    if mode == "disaggregated":
        config["explore"] = {"planner": None}
    return config


@pytest.fixture(scope="module")
def cluster():
    """One Ray cluster lent to the module's runs (started once), whose workers can import tests/ rewards.

    A generator unpickles the run's reward in its own process: ``video_reward`` (tests/) is importable
    there only through PYTHONPATH, which the cluster's node processes take from this one at start.
    """
    tests = str(Path(__file__).parents[1])
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PYTHONPATH", tests, prepend=os.pathsep)
        lent = LocalCluster()
    yield lent
    lent.shutdown()
    assert not ray.is_initialized()


def records(run_dir: Path, name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / name).read_text().splitlines() if line.strip()]


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(KINDS))
def test_mode_disaggregated_trains_the_kind_on_generator_devices(kind: str, cluster, tiny_pipeline,
                                                                 tmp_path: Path) -> None:
    folder = tiny_pipeline(kind)
    run_dir = tmp_path / "disaggregated"
    history = train(parse_config(TrainConfig, settings(kind, folder, run_dir))).history

    assert [record["iteration"] for record in history] == list(range(ITERATIONS + 1))
    assert records(run_dir, "metrics.jsonl") == json.loads(json.dumps(history))  # logged as returned
    for record in history[1:]:
        assert record["rollout/invalid_samples"] == 0, record
        assert record["train/rows"] > 0 and record["train/grad_norm"] > 0, record
        for key in ("rollout/reward_mean", "rollout/group_reward_std", "train/loss", "train/grad_norm"):
            assert math.isfinite(record[key]), (key, record)
    assert all(math.isfinite(history[i]["val/reward"]) for i in (0, ITERATIONS))

    # every sample of every step was drawn and scored on the generator, with that step's weights
    samples = records(run_dir, "disagg_samples.jsonl")
    assert sorted((s["step"], s["prompt"], s["sample"]) for s in samples) == [
        (step, p, g) for step in range(ITERATIONS) for p in range(PROMPTS) for g in range(GROUP)]
    assert all(s["produced_by"] == "generator" and s["version"] == s["step"] for s in samples), samples

    # ... and they are the samples the vanilla loop draws from the same base weights, prompts and seeds
    vanilla_dir = tmp_path / "vanilla"
    vanilla = train(parse_config(TrainConfig, settings(kind, folder, vanilla_dir, "vanilla", iterations=1))).history
    assert history[1]["rollout/reward_mean"] == pytest.approx(vanilla[1]["rollout/reward_mean"], rel=1e-6, abs=0)

    # the checkpoint's LoRA (the file the kind's diffusers pipeline loads) moved off its zero-init lora_B
    checkpoint = run_dir / "checkpoints" / f"iter-{ITERATIONS:06d}"
    files = ["pytorch_lora_weights.safetensors"] + ([LOW_NOISE_LORA_FILE] if kind == "wan22" else [])
    for file in files:  # Wan2.2: the high-noise expert's file and the low-noise expert's
        lora = load_file(checkpoint / file)
        lora_b = [tensor for name, tensor in lora.items() if ".lora_B." in name]
        assert lora_b and all(".lora_" in name for name in lora), file
        assert any(tensor.abs().max() > 0 for tensor in lora_b), file
