"""--resume in mode spotlight on the Ray runtime after the driver is SIGKILLed.

A 3-iteration spotlight run (one spot device, no preemptions, one planner arm) is killed with SIGKILL,
driver and every process it started, once a checkpoint is on disk and before the last one; ``spotlight
train --resume`` finishes it. The checkpoint carries the backend's state (the seeds the closed round
chose for the next iteration, the staleness monitor's pending re-score), so the resumed run explores
nothing twice and, with the arm fixed and the budget restored, makes the same decisions: its final
weights and its per-iteration rewards and losses equal those of an uninterrupted run bit for bit.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from resume_helpers import assert_resumed_to_the_uninterrupted_result, kill_after_first_checkpoint_and_resume

from spotlight.config import TrainConfig, parse_config
from spotlight.trainer import train

ITERATIONS = 3
BASE = "shapes-base"  # the shipped base model: its rewards vary, so training moves the weights
DETERMINISTIC = ("rollout/", "train/", "explore/", "staleness/", "planner/num_")  # the rest are timings and bills


def settings(base: str, run_dir: Path) -> dict[str, Any]:
    return {
        "mode": "spotlight", "base_checkpoint": base, "run_dir": str(run_dir), "iterations": ITERATIONS,
        "checkpoint_every": 1,
        "rollout": {"prompts_per_iteration": 2, "group_size": 3, "num_steps": 5},
        "train": {"num_minibatches": 1},
        "explore": {"monitor_prompts": 1},
        "eval": {"every": 10, "seeds_per_prompt": 1, "num_steps": 2, "grid_prompts": 2},
        "runtime": {"trace": None, "max_wall_s": None, "explore_wait_s": 300.0, "node_timeout_s": 240.0,
                    "min_step_s": 0.2, "complete_rounds": True,  # rounds whole whenever the device comes up
                    "planner": {"num_candidates": [4], "num_steps": [3]}},
    }


@pytest.mark.slow
def test_a_spotlight_run_killed_after_a_checkpoint_resumes_to_the_uninterrupted_result(
    tmp_path: Path,
) -> None:
    killed_dir = tmp_path / "killed"
    config_file = tmp_path / "config.yaml"
    config_file.write_text(yaml.safe_dump(settings(BASE, killed_dir)))
    state = kill_after_first_checkpoint_and_resume(config_file, killed_dir, ITERATIONS)
    assert state.extra["backend"]["explored"]["target"] == state.iteration  # the next seeds, kept

    clean_dir = tmp_path / "clean"
    train(parse_config(TrainConfig, settings(BASE, clean_dir)))

    assert_resumed_to_the_uninterrupted_result(killed_dir, clean_dir, DETERMINISTIC)
    logs = sorted(path.name for path in killed_dir.glob("queue-log-*.jsonl"))
    assert logs == ["queue-log-0.jsonl", "queue-log-1.jsonl"]  # each driver's queue had a log of its own
