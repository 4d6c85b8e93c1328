"""runtime.complete_rounds: a spotlight run's numbers do not depend on how many spot devices are up.

Two 3-iteration spotlight runs of one config, one with a spot device and one with none: with
``complete_rounds`` every round runs its one planner arm whole, the on-demand device serving what the
spot devices leave (all of it, with none), so the rollouts, losses, explored seeds and final weights
are the same bits (one prompt per iteration, so the rollout itself stays on the on-demand device
whatever is up; a rollout split over devices differs in the last bits). Without it, a run with no
spot device explores nothing (random seeds).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from spotlight.components.checkpoint import latest_checkpoint, load_model
from spotlight.config import TrainConfig, parse_config
from spotlight.run_error import RunError
from spotlight.trainer import train

DETERMINISTIC = ("rollout/", "train/", "explore/", "staleness/", "planner/num_")  # the rest are timings and bills


def settings(run_dir: Path, spot_devices: int, complete: bool = True, arms: tuple[int, ...] = (4,)) -> dict[str, Any]:
    return {
        "mode": "spotlight", "base_checkpoint": "shapes-base", "run_dir": str(run_dir), "iterations": 3,
        "rollout": {"prompts_per_iteration": 1, "group_size": 3, "num_steps": 5},  # one group: on the on-demand device
        "train": {"num_minibatches": 1},
        "explore": {"monitor_prompts": 1},
        "eval": {"every": 10, "seeds_per_prompt": 1, "num_steps": 2, "grid_prompts": 1},
        "runtime": {"trace": None, "max_wall_s": None, "num_spot_devices": spot_devices, "complete_rounds": complete,
                    "planner": {"num_candidates": list(arms), "num_steps": [3]}},
    }


def deterministic_rows(run_dir: Path) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [{key: value for key, value in row.items() if key.startswith(DETERMINISTIC)} for row in rows]


@pytest.mark.slow
def test_complete_rounds_give_the_same_run_with_and_without_spot_devices(tmp_path: Path) -> None:
    with_spot, without = tmp_path / "spot", tmp_path / "none"
    train(parse_config(TrainConfig, settings(with_spot, spot_devices=1)))
    train(parse_config(TrainConfig, settings(without, spot_devices=0)))
    rows = deterministic_rows(with_spot)
    assert rows == deterministic_rows(without)
    assert all(row.get("planner/num_candidates") == 4.0 for row in rows[2:])  # every later iteration was explored
    assert all(row["explore/missed_fraction"] == 0.0 for row in rows[2:])  # and no candidate was left out
    final = load_model(latest_checkpoint(with_spot)).state_dict()
    final_without = load_model(latest_checkpoint(without)).state_dict()
    assert all(torch.equal(final_without[name], tensor) for name, tensor in final.items())


def test_complete_rounds_refuse_a_planner_with_several_arms(tmp_path: Path) -> None:
    config = parse_config(TrainConfig, settings(tmp_path / "run", spot_devices=0, arms=(4, 8)))
    with pytest.raises(RunError, match="complete_rounds needs one planner arm"):
        train(config)
