"""SIGTERM in the middle of an iteration: the run saves it, stops its processes, says how to go on, and goes on
exactly.

A real ``spotlight train`` process (mode vanilla here; mode spotlight on a local Ray cluster in
tests/test_resume_ray.py, beside the SIGKILL test it shares its uninterrupted run with) gets SIGTERM while
iteration 2 of 3 runs (its reward pauses, so the iteration is still running). It must exit 143 with one line
naming the checkpoint, its iteration and the ``--resume`` command; the command on that line (its arguments to
the same CLI, in the test process: the signalled driver is the real process under test) must end with the
weights and per-iteration metrics of an uninterrupted run; no process the driver started may outlive it
(`resume_helpers.stop_mid_iteration_and_resume`). Mode disaggregated stops the same way, and a stop whose
iteration outlasts the grace abandons it.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from resume_helpers import (
    assert_ended,
    assert_resumed_to_the_uninterrupted_result,
    descendants,
    records,
    spotlight,
    stop_mid_iteration_and_resume,
    wait_for,
)

from spotlight.config import TrainConfig, parse_config
from spotlight.trainer import train

ITERATIONS = 3
DETERMINISTIC = ("rollout/", "train/", "explore/", "staleness/", "planner/num_")  # the rest are timings and bills
PACE_S = 0.3  # each reward call's pause in the run that gets the signal: iteration 2 is still running


def settings(run_dir: Path) -> dict[str, Any]:
    """A 3-iteration vanilla run, checkpointed only at the end (the stop writes the one in between)."""
    return {
        "mode": "vanilla", "run_dir": str(run_dir), "iterations": ITERATIONS, "num_threads": 1,
        "checkpoint_every": 100, "reward": {"name": "paced_reward:paced"},
        "rollout": {"prompts_per_iteration": 2, "group_size": 2, "num_steps": 3},
        "train": {"num_minibatches": 1},
        "eval": {"every": 100, "seeds_per_prompt": 1, "num_steps": 1, "grid_prompts": 1},
    }


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["vanilla"])  # [spotlight]: tests/test_resume_ray.py
def test_sigterm_mid_iteration_saves_it_stops_ray_and_the_printed_resume_ends_equal(tmp_path: Path,
                                                                                   mode: str) -> None:
    run_dir = tmp_path / "stopped"
    config_file = tmp_path / "config.yaml"
    config_file.write_text(yaml.safe_dump({**settings(run_dir), "mode": mode}))
    stop_mid_iteration_and_resume(config_file, run_dir, PACE_S)

    clean_dir = tmp_path / "clean"
    train(parse_config(TrainConfig, {**settings(clean_dir), "mode": mode}))
    assert_resumed_to_the_uninterrupted_result(run_dir, clean_dir, DETERMINISTIC)


@pytest.mark.slow
def test_an_iteration_past_the_grace_is_abandoned_and_a_second_signal_exits_at_once(tmp_path: Path) -> None:
    # SIGINT (Ctrl-C) while a reward call takes 30 s and the grace is 3 s: the iteration is cut, the line names
    # the last checkpoint (iteration 1), exit 130, within the grace
    run_dir = tmp_path / "run"
    config_file = tmp_path / "config.yaml"
    config = {**settings(run_dir), "checkpoint_every": 1, "runtime": {"stop_grace_s": 3.0}}
    config_file.write_text(yaml.safe_dump(config))
    train(parse_config(TrainConfig, {**config, "iterations": 1}))  # iteration 1 checkpointed (here: no signal yet)
    mark = tmp_path / "reward-called"
    slow = spotlight(["train", "-c", str(config_file), "--resume"], pace_s=30.0, mark=mark)
    wait_for(slow, mark.exists)  # iteration 2's reward call sleeps 30 s
    signalled = time.monotonic()
    slow.send_signal(signal.SIGINT)
    _, stderr = slow.communicate(timeout=60)
    assert slow.returncode == 128 + signal.SIGINT and time.monotonic() - signalled < 3.0 + 10.0, stderr[-3000:]
    lines = [line for line in stderr.splitlines() if line.startswith("stopped by SIGINT")]
    assert len(lines) == 1 and "abandoned" in lines[0] and "iter-000001 (iteration 1;" in lines[0], stderr[-3000:]
    assert float(lines[0].split("all stopped ")[1].split(" s")[0]) < 3.0  # closed within the grace (then the exit)

    mark.unlink()
    again = spotlight(["train", "-c", str(config_file), "-s", "runtime.stop_grace_s=20", "--resume"], pace_s=30.0,
                      mark=mark)
    wait_for(again, mark.exists)
    again.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    signalled = time.monotonic()
    again.send_signal(signal.SIGTERM)
    _, stderr = again.communicate(timeout=30)
    assert again.returncode == 128 + signal.SIGTERM and time.monotonic() - signalled < 5.0, stderr[-3000:]
    assert "second SIGTERM: exited at once; the last checkpoint is" in stderr, stderr[-3000:]


@pytest.mark.slow
def test_sigterm_in_mode_disaggregated_saves_the_iteration_and_stops_its_generators(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    config_file = tmp_path / "config.yaml"
    config_file.write_text(yaml.safe_dump({
        **settings(run_dir), "mode": "disaggregated", "eval": {"every": 100, "seeds_per_prompt": 1,
                                                               "num_steps": 1, "prompts": 2},
        "rollout": {"prompts_per_iteration": 3, "group_size": 2, "num_steps": 3},  # 3 groups: 3 paced reward calls
        "train": {"num_minibatches": 1, "num_epochs": 1, "old_policy_decay": 0.0, "nft_kl_beta": 0.0},
        "runtime": {"max_wall_s": None}}))
    driver = spotlight(["train", "-c", str(config_file)], pace_s=PACE_S)
    wait_for(driver, lambda: any(record["iteration"] == 1 for record in records(run_dir)))
    started = descendants(driver.pid)  # the Ray head, the generator actors
    driver.send_signal(signal.SIGTERM)
    _, stderr = driver.communicate(timeout=60)
    assert driver.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    lines = [line for line in stderr.splitlines() if line.startswith("stopped by SIGTERM")]
    assert len(lines) == 1 and lines[0].split("continue with: ")[1].endswith("--resume"), stderr[-3000:]
    saved = int(lines[0].split("(iteration ")[1].split(" ")[0])
    assert (run_dir / "checkpoints" / f"iter-{saved:06d}").is_dir() and saved in (1, 2)
    assert_ended(started)
