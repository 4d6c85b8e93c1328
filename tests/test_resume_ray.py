"""--resume in mode spotlight on the Ray runtime after the driver is SIGKILLed.

A 3-iteration spotlight run (one spot device, no preemptions, one planner arm) is killed with SIGKILL,
driver and every process it started, once a checkpoint is on disk and before the last one; ``spotlight
train --resume`` finishes it. The checkpoint carries the backend's state (the seeds the closed round
chose for the next iteration, the staleness monitor's pending re-score), so the resumed run explores
nothing twice and, with the arm fixed and the budget restored, makes the same decisions: its final
weights and its per-iteration rewards and losses equal those of an uninterrupted run bit for bit.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch
import yaml

from spotlight.components.checkpoint import latest_checkpoint, load_model, load_training_state
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


def kill_tree(pid: int) -> None:
    """SIGKILL a process and everything it started (its Ray nodes and workers), as a lost machine would."""
    root = psutil.Process(pid)
    family = [root, *root.children(recursive=True)]
    for process in family:
        try:
            process.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(family, timeout=30)


def spotlight_train(config_file: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "spotlight", "train", "-c", str(config_file), *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])})


def deterministic(record: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in record.items() if key.startswith(DETERMINISTIC)}


def metrics(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


@pytest.mark.slow
def test_a_spotlight_run_killed_after_a_checkpoint_resumes_to_the_uninterrupted_result(
    tmp_path: Path,
) -> None:
    killed_dir = tmp_path / "killed"
    config_file = tmp_path / "config.yaml"
    config_file.write_text(yaml.safe_dump(settings(BASE, killed_dir)))
    driver = spotlight_train(config_file)
    deadline = time.monotonic() + 300
    while (checkpoint := latest_checkpoint(killed_dir)) is None:
        assert driver.poll() is None, f"the run ended before its first checkpoint: {driver.stderr.read()[-2000:]}"
        assert time.monotonic() < deadline, "no checkpoint within 300 s"
        time.sleep(0.05)
    kill_tree(driver.pid)
    assert load_training_state(checkpoint).iteration < ITERATIONS  # killed mid-run
    state = load_training_state(checkpoint).extra["backend"]
    assert state["explored"]["target"] == load_training_state(checkpoint).iteration  # the next seeds, kept

    resumed = spotlight_train(config_file, "--resume")
    assert resumed.wait(timeout=400) == 0, resumed.stderr.read()[-3000:]

    clean_dir = tmp_path / "clean"
    train(parse_config(TrainConfig, settings(BASE, clean_dir)))

    clean, again = metrics(clean_dir), metrics(killed_dir)
    assert [r["iteration"] for r in again] == [r["iteration"] for r in clean]
    assert [deterministic(r) for r in again] == [deterministic(r) for r in clean]
    assert any(r.get("train/grad_norm", 0.0) > 0 for r in clean)  # the weights moved: their equality says something
    final_clean = load_model(latest_checkpoint(clean_dir)).state_dict()
    final_again = load_model(latest_checkpoint(killed_dir)).state_dict()
    assert all(torch.equal(final_again[name], tensor) for name, tensor in final_clean.items())
    logs = sorted(path.name for path in killed_dir.glob("queue-log-*.jsonl"))
    assert logs == ["queue-log-0.jsonl", "queue-log-1.jsonl"]  # each driver's queue had a log of its own
