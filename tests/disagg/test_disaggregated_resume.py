"""--resume in mode disaggregated after the driver is SIGKILLed (issue 43): the same weights and metrics as an
uninterrupted run.

A 3-iteration disaggregated run (one generator, GAP, no async or exploration: the deterministic set-up) is
killed with SIGKILL, driver and every process it started, once a checkpoint is on disk and before the last
iteration; ``spotlight train --resume`` finishes it. Its per-iteration rewards and losses and its final
weights equal an uninterrupted run's bit for bit, and disagg_samples.jsonl holds every step once.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from resume_helpers import assert_resumed_to_the_uninterrupted_result, kill_after_first_checkpoint_and_resume, metrics
from test_resume_ray import DETERMINISTIC

from spotlight.config import TrainConfig, parse_config
from spotlight.trainer import train

ITERATIONS = 3


def settings(run_dir: Path) -> dict[str, Any]:
    return {"mode": "disaggregated", "run_dir": str(run_dir), "iterations": ITERATIONS, "checkpoint_every": 1,
            "num_threads": 1, "eval": {"every": 100, "seeds_per_prompt": 1, "num_steps": 2, "prompts": 4},
            "rollout": {"prompts_per_iteration": 3, "group_size": 4, "num_steps": 4},
            "train": {"num_minibatches": 1, "num_epochs": 1, "old_policy_decay": 0.0, "nft_kl_beta": 0.0},
            "runtime": {"max_wall_s": None}}


@pytest.mark.slow
def test_a_disaggregated_run_killed_after_a_checkpoint_resumes_to_the_uninterrupted_result(tmp_path: Path) -> None:
    killed_dir = tmp_path / "killed"
    config_file = tmp_path / "config.yaml"
    config_file.write_text(yaml.safe_dump(settings(killed_dir)))
    state = kill_after_first_checkpoint_and_resume(config_file, killed_dir, ITERATIONS)
    assert state.extra["backend"]["steps_done"] == state.iteration

    clean_dir = tmp_path / "clean"
    train(parse_config(TrainConfig, settings(clean_dir)))
    assert [record["iteration"] for record in metrics(killed_dir)] == list(range(ITERATIONS + 1))
    assert_resumed_to_the_uninterrupted_result(killed_dir, clean_dir, DETERMINISTIC)
    samples = [json.loads(line) for line in (killed_dir / "disagg_samples.jsonl").read_text().splitlines()]
    per_step = Counter(sample["step"] for sample in samples)
    assert per_step == Counter({step: 3 * 4 for step in range(ITERATIONS)})  # every sample of every step, once
