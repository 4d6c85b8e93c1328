"""A run forced to collapse (learning rate 20x the default): the guard rolls back, then stops with the best
model, in one line each.

A real `spotlight train` process on the shipped base model, as a person runs it; the best
checkpoint must come out of it intact and loadable.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from spotlight.components.checkpoint import latest_checkpoint, load_model, load_training_state
from spotlight.cores import pinned
from spotlight.loop.evaluation import evaluate, validation_subset
from spotlight.task_presets import get_task

VAL_PROMPTS = 16  # of the 80: each validation a fifth of the time; the guard reads rollout rewards, not these


@pytest.mark.slow
def test_a_collapsing_run_is_rolled_back_at_a_lower_rate_then_stopped_with_one_line(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    overrides = [
        "mode=vanilla", "iterations=40", "runtime.max_wall_s=null", "train.learning_rate=2e-3",
        "rollout.prompts_per_iteration=8", "rollout.group_size=4", "eval.every=2", "eval.seeds_per_prompt=1",
        "eval.raw_model=false", f"eval.prompts={VAL_PROMPTS}", "train.num_epochs=1", "guard.window=3",
        "guard.dead_iterations=3", "guard.max_rollbacks=1", "pin_devices=false", "num_threads=1", f"run_dir={run_dir}",
    ]
    result = subprocess.run([sys.executable, "-m", "spotlight", "train", *(a for o in overrides for a in ("-s", o))],
                            capture_output=True, text=True, timeout=600, cwd=tmp_path,
                            env={**os.environ, "TMPDIR": str(tmp_path)})
    assert result.returncode == 0, result.stderr[-2000:]

    stopped = [line for line in result.stdout.splitlines() if line.startswith("guard: stopped")]
    assert len(stopped) == 1, result.stdout
    assert str(run_dir / "checkpoints" / "best") in stopped[0]
    rollbacks = [line for line in result.stderr.splitlines() if "rolled back to" in line]
    assert len(rollbacks) == 1, result.stderr
    assert "learning rate 0.001" in rollbacks[0]

    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    actions = [r["guard/action"] for r in records if "guard/action" in r]
    assert actions == ["rollback", "stop"]
    assert records[-1]["iteration"] < 40  # it stopped instead of spinning to the end

    validated = [r for r in records if "val/strict_accuracy" in r]
    peak = max(validated, key=lambda r: r["val/strict_accuracy"])
    assert f"val strict accuracy {peak['val/strict_accuracy']:.3f} at iteration {peak['iteration']}" in stopped[0]
    # the run ends with its best model, not the dying one: the final validation is the peak's, exactly
    assert stopped[0].endswith(", and it is also the final model.")  # one whole sentence (issue 36)
    assert records[-1]["guard/action"] == "stop" and records[-1]["val/strict_accuracy"] == peak["val/strict_accuracy"]
    task = get_task("shapes")  # intact: the best model validates exactly as it did when it was kept
    with pinned(None, 1):
        again = evaluate(load_model(run_dir / "checkpoints" / "best"), validation_subset(task.split()[1], VAL_PROMPTS),
                         task.make_reward(0.5),
                         seeds_per_prompt=1, num_steps=10, shift=3.0)
    assert again.strict_accuracy == peak["val/strict_accuracy"]

    state = load_training_state(latest_checkpoint(run_dir))
    assert [group["lr"] for group in state.optimizer["param_groups"]] == [pytest.approx(1e-3)]
