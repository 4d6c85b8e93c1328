"""--resume in mode disaggregated after the driver is SIGKILLed (issue 43): the same weights and metrics as an
uninterrupted run.

A 3-iteration disaggregated run (one generator, GAP, no async or exploration: the deterministic set-up) is
killed with SIGKILL, driver and every process it started, once a checkpoint is on disk and before the last
iteration; ``spotlight train --resume`` finishes it. Its per-iteration rewards and losses and its final
weights equal an uninterrupted run's bit for bit, and disagg_samples.jsonl holds every step once.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from test_resume_ray import deterministic, kill_tree, metrics, spotlight_train

from spotlight.components.checkpoint import latest_checkpoint, load_model, load_training_state
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
    driver = spotlight_train(config_file)
    deadline = time.monotonic() + 300
    while (checkpoint := latest_checkpoint(killed_dir)) is None:
        assert driver.poll() is None, f"the run ended before its first checkpoint: {driver.stderr.read()[-2000:]}"
        assert time.monotonic() < deadline, "no checkpoint within 300 s"
        time.sleep(0.05)
    kill_tree(driver.pid)
    done = load_training_state(checkpoint).iteration
    assert done < ITERATIONS  # killed mid-run
    assert load_training_state(checkpoint).extra["backend"]["steps_done"] == done

    resumed = spotlight_train(config_file, "--resume")
    assert resumed.wait(timeout=400) == 0, resumed.stderr.read()[-3000:]

    clean_dir = tmp_path / "clean"
    train(parse_config(TrainConfig, settings(clean_dir)))
    clean, again = metrics(clean_dir), metrics(killed_dir)
    assert [r["iteration"] for r in again] == [r["iteration"] for r in clean] == list(range(ITERATIONS + 1))
    assert [deterministic(r) for r in again] == [deterministic(r) for r in clean]
    assert any(r.get("train/grad_norm", 0.0) > 0 for r in clean)  # the weights moved: their equality says something
    final_clean = load_model(latest_checkpoint(clean_dir)).state_dict()
    final_again = load_model(latest_checkpoint(killed_dir)).state_dict()
    assert all(torch.equal(final_again[name], tensor) for name, tensor in final_clean.items())
    samples = [json.loads(line) for line in (killed_dir / "disagg_samples.jsonl").read_text().splitlines()]
    per_step = Counter(sample["step"] for sample in samples)
    assert per_step == Counter({step: 3 * 4 for step in range(ITERATIONS)})  # every sample of every step, once
