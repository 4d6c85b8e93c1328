"""Wan2.2 A14B's two experts resume after SIGKILL to the uninterrupted result (issue 45).

A vanilla run of a tiny two-expert ``WanPipeline`` folder, with sampling steps and NFT noise levels on both
sides of the folder's boundary (as in ``tests/test_wan22_train.py``) so that both experts' LoRA train, and each
expert's steps guided at a scale of its own (``rollout.guidance_scale_2``), is SIGKILLed once its first
checkpoint is on disk and finished with ``spotlight train --resume``: every iteration's rewards and losses
and both experts' final LoRA equal those of an uninterrupted run bit for bit.
Two iterations, a checkpoint after each, validation at the start and the end only: the cheapest run that
is killed mid-way and still compares a validation after resuming.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from resume_helpers import assert_a_killed_run_resumes_to, metrics
from test_wan_train import DETERMINISTIC, settings

from spotlight.components.checkpoint import latest_checkpoint, load_model
from spotlight.config import TrainConfig, parse_config
from spotlight.trainer import train

ITERATIONS = 2


def two_expert_settings(folder: Path, run_dir: Path) -> dict[str, Any]:
    config = settings(folder, run_dir)
    config.update(iterations=ITERATIONS)
    config["rollout"]["num_steps"] = config["eval"]["num_steps"] = 4  # timesteps 1000 | 858, 602, 9: both experts
    config["train"]["nft_timesteps"] = 4  # an eighth of the noise levels (sigma >= 0.875) reach the high-noise expert
    config["rollout"]["guidance_scale_2"] = 3.0  # the low-noise expert's steps guided at a scale of their own
    config["eval"]["every"] = ITERATIONS  # validated at 0 and at the end, after the resume
    return config


@pytest.mark.slow
def test_a_wan22_run_killed_after_a_checkpoint_resumes_to_the_uninterrupted_result(tiny_pipeline,
                                                                                    tmp_path: Path) -> None:
    folder = tiny_pipeline("wan22")
    clean_dir = tmp_path / "clean"
    train(parse_config(TrainConfig, two_expert_settings(folder, clean_dir)))
    killed_dir = assert_a_killed_run_resumes_to(two_expert_settings(folder, tmp_path / "killed"), clean_dir,
                                                ITERATIONS, DETERMINISTIC)
    assert "val/reward" in metrics(killed_dir)[-1]  # a validation after the resume, compared too
    trained = load_model(latest_checkpoint(clean_dir)).lora_state_dict()
    for index in (0, 1):  # each expert's LoRA B moved off its zero start: the equality covers both experts' training
        assert any(tensor.abs().max() > 0 for name, tensor in trained.items()
                   if name.startswith(f"experts.{index}.") and "lora_B" in name), index
