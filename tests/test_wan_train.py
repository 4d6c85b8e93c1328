"""Wan2.1 text-to-video end to end (issue 45): a tiny random ``WanPipeline`` folder trained on videos.

A sample is a video of ``rollout.num_frames`` frames (5 here: 3 latent frames); the function reward
receives the decoded videos (N, F, 3, H, W) themselves. Modes ``vanilla`` and ``spotlight`` train (the
validation reward moves), a vanilla run SIGKILLed after a checkpoint resumes to the uninterrupted
run's weights and rewards bit for bit, and every checkpoint's LoRA loads with ``WanPipeline``'s own
``load_lora_weights`` and changes its video.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from PIL import Image
from resume_helpers import assert_a_killed_run_resumes_to, metrics

from spotlight.components.checkpoint import latest_checkpoint
from spotlight.config import TrainConfig, parse_config
from spotlight.report.html import write_report
from spotlight.trainer import train

ITERATIONS = 3
DETERMINISTIC = ("rollout/", "train/", "val/reward")


def settings(folder: Path, run_dir: Path, mode: str = "vanilla") -> dict[str, Any]:
    config: dict[str, Any] = {
        "mode": mode, "iterations": ITERATIONS, "run_dir": str(run_dir), "pin_devices": False, "num_threads": 1,
        "checkpoint_every": 1,
        "model": {"pretrained": str(folder), "lora_rank": 2, "max_sequence_length": 32},
        "rollout": {"resolution": 32, "num_frames": 5, "prompts_per_iteration": 2, "group_size": 2, "num_steps": 2,
                    "sde_steps": None, "guidance_scale": 2.0, "negative_prompt": "blurry"},
        "train": {"num_minibatches": 1, "num_epochs": 1, "learning_rate": 0.02},
        "reward": {"name": "video_reward:brightness"},
        "eval": {"every": 1, "seeds_per_prompt": 1, "num_steps": 2, "grid_prompts": 2, "raw_model": False,
                 "prompts": 2},
    }
    if mode == "spotlight":
        config["eval"]["every"] = ITERATIONS  # the first and the last validation: what the reward is read from
        config["explore"] = {"monitor_prompts": 1}
        config["runtime"] = {"trace": None, "max_wall_s": None, "explore_wait_s": 120.0, "node_timeout_s": 240.0,
                             "planner": {"num_candidates": [4], "num_steps": [2]}}
    return config


def assert_the_reward_moved(records: list[dict[str, Any]]) -> None:
    assert [record["iteration"] for record in records] == list(range(ITERATIONS + 1))
    assert all(record["rollout/invalid_samples"] == 0 for record in records[1:])
    # the tiny VAE's videos differ in brightness by ~1e-3 within a group: that is the scale the reward moves on
    rewards = [record["rollout/reward_mean"] for record in records[1:]]
    assert rewards[-1] > rewards[0], rewards
    assert abs(records[-1]["val/reward"] - records[0]["val/reward"]) > 1e-4, [r["val/reward"] for r in records]


@pytest.fixture(scope="module")
def vanilla_run(tiny_pipeline, tmp_path_factory: pytest.TempPathFactory) -> Path:
    import video_reward

    run_dir = tmp_path_factory.mktemp("wan") / "clean"
    video_reward.SEEN.clear()
    train(parse_config(TrainConfig, settings(tiny_pipeline("wan"), run_dir)))
    assert video_reward.SEEN and all(shape[1:] == (5, 3, 32, 32) for shape in video_reward.SEEN)  # videos, whole
    return run_dir


@pytest.mark.slow
def test_vanilla_mode_trains_a_wan_folder_and_its_lora_loads_into_wan_pipeline(vanilla_run: Path,
                                                                                tiny_pipeline) -> None:
    import diffusers

    assert_the_reward_moved(metrics(vanilla_run))
    assert (vanilla_run / "samples" / "iter-00003.png").is_file()  # filmstrips of the validation videos
    with Image.open(vanilla_run / "samples" / "iter-00003.gif") as played:  # ... and the grid played, frame by frame
        assert played.n_frames == 5
    page = write_report([vanilla_run], vanilla_run / "report.html").read_text()
    assert "data:image/gif;base64," in page
    pipe = diffusers.WanPipeline.from_pretrained(str(tiny_pipeline("wan")))
    pipe.set_progress_bar_config(disable=True)

    def video() -> torch.Tensor:
        return pipe("a red ball", num_frames=5, height=32, width=32, num_inference_steps=2, guidance_scale=1.0,
                    max_sequence_length=32, output_type="latent", generator=torch.Generator().manual_seed(0)).frames

    before = video()
    pipe.load_lora_weights(str(latest_checkpoint(vanilla_run)))
    assert (video() - before).abs().max() > 1e-3


@pytest.mark.slow
def test_spotlight_mode_trains_a_wan_folder(tiny_pipeline, tmp_path: Path) -> None:
    import ray

    run_dir = tmp_path / "run"
    summary = train(parse_config(TrainConfig, settings(tiny_pipeline("wan"), run_dir, "spotlight")))
    # a later iteration's seeds were explored (videos sampled and scored) on a spot device
    assert any("planner/num_candidates" in record for record in summary.history[2:])
    assert_the_reward_moved(metrics(run_dir))
    assert not ray.is_initialized()


@pytest.mark.slow
def test_a_wan_run_killed_after_a_checkpoint_resumes_to_the_uninterrupted_result(vanilla_run: Path, tiny_pipeline,
                                                                                  tmp_path: Path) -> None:
    assert_a_killed_run_resumes_to(settings(tiny_pipeline("wan"), tmp_path / "killed"), vanilla_run, ITERATIONS,
                                   DETERMINISTIC)


@pytest.mark.slow
def test_flow_grpo_fully_fine_tunes_a_wan_folder_on_videos(tiny_pipeline, tmp_path: Path) -> None:
    """Flow-GRPO's SDE log-probs of guided video steps, every transformer weight trained; the checkpoint's
    transformer/ folder is what WanPipeline.from_pretrained(base, transformer=...) loads."""
    from diffusers import WanTransformer3DModel

    run_dir = tmp_path / "run"
    config = settings(tiny_pipeline("wan"), run_dir)
    config.update(iterations=2)
    config["model"]["finetune"] = "full"
    config["train"].update(algorithm="flow-grpo", learning_rate=1e-3)
    train(parse_config(TrainConfig, config))
    records = metrics(run_dir)
    assert [record["iteration"] for record in records] == [0, 1, 2]
    assert all(record["train/grad_norm"] > 0 for record in records[1:])
    trained = WanTransformer3DModel.from_pretrained(str(latest_checkpoint(run_dir) / "transformer"))
    base = WanTransformer3DModel.from_pretrained(str(tiny_pipeline("wan") / "transformer"))
    assert any(not torch.equal(a, b) for a, b in zip(trained.parameters(), base.parameters(), strict=True))
