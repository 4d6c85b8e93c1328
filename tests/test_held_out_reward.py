"""eval.held_out_reward (issue 46): validation scores the same images with a reward the run does not train on,
logs it beside the trained one, and with eval.select_by held_out picks checkpoints/best by it. A run built to
make the two disagree (trained on brightness, held out on darkness) picks a different best checkpoint."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from spotlight.config import ConfigError, TrainConfig, parse_config
from spotlight.trainer import train

TESTS = Path(__file__).parent


def settings(run_dir: Path, select_by: str) -> dict[str, Any]:
    return {"mode": "vanilla", "run_dir": str(run_dir), "iterations": 3, "num_threads": 1, "pin_devices": False,
            "checkpoint_every": 100, "reward": {"name": "paced_reward:paced"},  # brightness, unpaced
            "rollout": {"prompts_per_iteration": 2, "group_size": 4, "num_steps": 3},
            "train": {"num_minibatches": 1, "learning_rate": 3e-3},
            "eval": {"every": 1, "seeds_per_prompt": 1, "num_steps": 2, "grid_prompts": 1, "prompts": 4,
                     "raw_model": False, "held_out_reward": {"name": "held_out_reward:darkness"},
                     "select_by": select_by}}


def best_iteration(run_dir: Path) -> int:
    return json.loads((run_dir / "checkpoints" / "best" / "model.json").read_text())["metadata"]["iteration"]


@pytest.fixture(autouse=True)
def tests_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(TESTS))
    monkeypatch.setenv("PACE_S", "0")
    assert os.fspath(TESTS) in sys.path


def test_the_held_out_reward_picks_a_different_best_checkpoint(tmp_path: Path) -> None:
    by_score, by_held_out = tmp_path / "score", tmp_path / "held_out"
    train(parse_config(TrainConfig, settings(by_score, "score")))
    train(parse_config(TrainConfig, settings(by_held_out, "held_out")))
    records = [json.loads(line) for line in (by_score / "metrics.jsonl").read_text().splitlines()]
    trained = {r["iteration"]: r["val/reward"] for r in records}
    held_out = {r["iteration"]: r["val/held_out_reward"] for r in records}
    assert all(held_out[i] == pytest.approx(1.0 - trained[i], abs=1e-6) for i in trained)  # the same images
    assert len(set(trained.values())) > 1  # validation moved, so the two rewards disagree on the best
    assert best_iteration(by_score) == max(trained, key=trained.get)
    assert best_iteration(by_held_out) == max(held_out, key=held_out.get)
    assert best_iteration(by_score) != best_iteration(by_held_out)
    chosen = [json.loads(line) for line in (by_held_out / "metrics.jsonl").read_text().splitlines()]
    assert all(r["val/score"] == r["val/held_out_reward"] and r["val/score_is_strict"] == 0.0 for r in chosen)


def test_select_by_held_out_without_a_held_out_reward_is_one_line(tmp_path: Path) -> None:
    config = settings(tmp_path, "held_out")
    del config["eval"]["held_out_reward"]
    with pytest.raises(ConfigError, match="eval.select_by held_out picks the best model by eval.held_out_reward"):
        parse_config(TrainConfig, config)
