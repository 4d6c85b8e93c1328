"""A `pkg.module:function` reward that hangs is cut off at ``reward.deadline_s``, retried, then stops the run."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from spotlight.config import TrainConfig, parse_config
from spotlight.rewards.base import RewardError, guarded_score
from spotlight.rewards.deadline import DeadlineReward, RewardDeadlineError
from spotlight.rewards.function import FunctionReward
from spotlight.rewards.registry import build_reward

IMAGES, PROMPTS = torch.rand(3, 3, 8, 8), ["a red circle", "two squares", "a dog"]


def test_a_hanging_function_stops_after_two_calls_past_the_deadline_not_one_per_sample() -> None:
    reward = build_reward(parse_config(TrainConfig, {"reward": {"name": "hanging_reward:hangs", "deadline_s": 0.4,
                                                                "retries": 2}}).reward)
    assert isinstance(reward, DeadlineReward)
    started = time.monotonic()
    with pytest.raises(RewardDeadlineError, match=r"reward.deadline_s=0.4 s on 3 samples, 2 calls in a row"):
        guarded_score(reward, IMAGES, PROMPTS)
    assert 0.8 <= time.monotonic() - started < 2.0  # two deadlines, not one per sample (guarded_score's fallback)


def test_without_retries_a_timed_out_call_marks_its_samples_invalid_with_the_reason() -> None:
    reward = DeadlineReward(FunctionReward("hanging_reward:hangs"), deadline_s=0.3, retries=0)
    out = reward.score(IMAGES, PROMPTS, None)
    assert not out.valid.any() and len(out.errors) == 3
    assert "did not return within reward.deadline_s=0.3 s" in out.errors[0]
    with pytest.raises(RewardError, match="deadline_s=0.3"):  # the second in a row: the run stops
        guarded_score(reward, IMAGES, PROMPTS)


def test_a_call_in_time_is_the_functions_answer_and_resets_the_count() -> None:
    reward = DeadlineReward(FunctionReward("hanging_reward:prompt_length"), deadline_s=5.0, retries=0)
    reward.timeouts_in_row = 1
    out = guarded_score(reward, IMAGES, PROMPTS)
    assert out.rewards.tolist() == [12.0, 11.0, 5.0] and out.valid.all() and reward.timeouts_in_row == 0


@pytest.mark.slow
def test_spotlight_train_with_a_hanging_reward_stops_in_one_line_at_its_deadline(tmp_path: Path) -> None:
    args = ["-s", f"run_dir={tmp_path / 'run'}", "-s", "mode=vanilla", "-s", "iterations=2", "-s", "num_threads=1",
            "-s", "rollout.prompts_per_iteration=1", "-s", "rollout.group_size=2", "-s", "rollout.num_steps=2",
            "-s", "eval.seeds_per_prompt=1", "-s", "eval.num_steps=1", "-s", "reward.name=hanging_reward:hangs",
            "-s", "reward.deadline_s=0.5", "-s", "reward.retries=1"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2]), str(Path(__file__).parent)])}
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "spotlight", "train", *args], capture_output=True, text=True,
                            env=env, timeout=120)
    assert result.returncode == 2, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "did not return within reward.deadline_s=0.5 s" in errors[0], result.stderr[-2000:]
    assert time.monotonic() - started < 60  # two 0.5 s deadlines and the start-up, not the hour the function sleeps
