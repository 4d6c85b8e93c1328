"""SIGTERM in the middle of an iteration: the run saves it, stops Ray, says how to go on, and goes on exactly.

A real ``spotlight train`` process (mode vanilla, and mode spotlight on a local Ray cluster) gets SIGTERM
while iteration 2 of 3 runs (its reward pauses, so the iteration is still running). It must exit 143 with
one line naming the checkpoint, its iteration and the ``--resume`` command; the command on that line, run
as printed, must end with the weights and per-iteration metrics of an uninterrupted run; no process the
driver started may outlive it.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch
import yaml

from spotlight.components.checkpoint import latest_checkpoint, load_model
from spotlight.config import TrainConfig, parse_config
from spotlight.trainer import train

ITERATIONS = 3
TESTS = Path(__file__).parent
DETERMINISTIC = ("rollout/", "train/", "explore/", "staleness/", "planner/num_")  # the rest are timings and bills


def settings(mode: str, run_dir: Path) -> dict[str, Any]:
    common = {
        "mode": mode, "run_dir": str(run_dir), "iterations": ITERATIONS, "num_threads": 1,
        "checkpoint_every": 100, "reward": {"name": "paced_reward:paced"},
        "rollout": {"prompts_per_iteration": 2, "group_size": 2, "num_steps": 3},
        "train": {"num_minibatches": 1},
        "eval": {"every": 100, "seeds_per_prompt": 1, "num_steps": 1, "grid_prompts": 1},
    }
    if mode == "spotlight":
        common["explore"] = {"monitor_prompts": 1}
        # complete_rounds: a round runs whole whenever the spot device comes up, so the paced run and the
        # unpaced clean one explore the same candidates (without it, a device that came up after a round's
        # training left that round unexplored in one run and not the other: two discrete outcomes under load)
        common["runtime"] = {"trace": None, "max_wall_s": None, "explore_wait_s": 300.0, "node_timeout_s": 240.0,
                             "complete_rounds": True, "planner": {"num_candidates": [4], "num_steps": [2]}}
    return common


def start(args: list[str], pace_s: float, mark: Path | None = None) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS.parent), str(TESTS)]), "PACE_S": str(pace_s),
           "PACE_MARK": str(mark or "")}
    return subprocess.Popen([sys.executable, "-m", "spotlight", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def records(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.is_file() else []
    return [json.loads(line) for line in lines if line.strip()]


def descendants(pid: int) -> list[psutil.Process]:
    return psutil.Process(pid).children(recursive=True)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["vanilla", "spotlight"])
def test_sigterm_mid_iteration_saves_it_stops_ray_and_the_printed_resume_ends_equal(tmp_path: Path,
                                                                                   mode: str) -> None:
    run_dir = tmp_path / "stopped"
    config_file = tmp_path / "config.yaml"
    config_file.write_text(yaml.safe_dump(settings(mode, run_dir)))
    driver = start(["train", "-c", str(config_file)], pace_s=0.6)
    deadline = time.monotonic() + 300
    while not any(record["iteration"] == 1 for record in records(run_dir)):  # iteration 1 done: 2 is running
        assert driver.poll() is None, driver.stderr.read()[-3000:]
        assert time.monotonic() < deadline, "iteration 1 did not end within 300 s"
        time.sleep(0.02)
    started = descendants(driver.pid)  # Ray's processes in mode spotlight
    driver.send_signal(signal.SIGTERM)
    _, stderr = driver.communicate(timeout=60)
    assert driver.returncode == 128 + signal.SIGTERM, stderr[-3000:]

    lines = [line for line in stderr.splitlines() if line.startswith("stopped by SIGTERM")]
    assert len(lines) == 1, stderr[-3000:]
    line = lines[0]
    saved = int(line.split("(iteration ")[1].split(" ")[0])
    assert saved in (1, 2)  # the iteration in progress, finished (or, had it started late, the one before)
    assert f"checkpoints/iter-{saved:06d}" in line and (run_dir / "checkpoints" / f"iter-{saved:06d}").is_dir()
    assert [r["iteration"] for r in records(run_dir)] == list(range(saved + 1))  # nothing lost, nothing extra
    time.sleep(2)
    assert not [p for p in started if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]  # Ray stopped

    command = shlex.split(line.split("continue with: ")[1])
    assert command[0] == "spotlight" and command[-1] == "--resume"
    resumed = start(command[1:], pace_s=0.0)
    _, stderr = resumed.communicate(timeout=400)
    assert resumed.returncode == 0, stderr[-3000:]

    clean_dir = tmp_path / "clean"
    train(parse_config(TrainConfig, settings(mode, clean_dir)))
    clean, again = records(clean_dir), records(run_dir)
    assert [r["iteration"] for r in again] == [r["iteration"] for r in clean]
    assert [{k: v for k, v in r.items() if k.startswith(DETERMINISTIC)} for r in again] == \
        [{k: v for k, v in r.items() if k.startswith(DETERMINISTIC)} for r in clean]
    assert any(r.get("train/grad_norm", 0.0) > 0 for r in clean)  # the weights moved: their equality says something
    final_clean = load_model(latest_checkpoint(clean_dir)).state_dict()
    final_again = load_model(latest_checkpoint(run_dir)).state_dict()
    assert all(torch.equal(final_again[name], tensor) for name, tensor in final_clean.items())


def wait_for(driver: subprocess.Popen, done: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 300
    while not done():
        assert driver.poll() is None, driver.stderr.read()[-3000:]
        assert time.monotonic() < deadline, "the run did not get there within 300 s"
        time.sleep(0.02)


@pytest.mark.slow
def test_an_iteration_past_the_grace_is_abandoned_and_a_second_signal_exits_at_once(tmp_path: Path) -> None:
    # SIGINT (Ctrl-C) while a reward call takes 30 s and the grace is 3 s: the iteration is cut, the line names
    # the last checkpoint (iteration 1), exit 130, within the grace
    run_dir = tmp_path / "run"
    config_file = tmp_path / "config.yaml"
    config_file.write_text(yaml.safe_dump({**settings("vanilla", run_dir), "checkpoint_every": 1,
                                           "runtime": {"stop_grace_s": 3.0}}))
    driver = start(["train", "-c", str(config_file), "-s", "iterations=1"], pace_s=0.0)
    assert driver.wait(timeout=300) == 0, driver.stderr.read()[-3000:]  # iteration 1 checkpointed
    mark = tmp_path / "reward-called"
    slow = start(["train", "-c", str(config_file), "--resume"], pace_s=30.0, mark=mark)
    wait_for(slow, mark.exists)  # iteration 2's reward call sleeps 30 s
    signalled = time.monotonic()
    slow.send_signal(signal.SIGINT)
    _, stderr = slow.communicate(timeout=60)
    assert slow.returncode == 128 + signal.SIGINT and time.monotonic() - signalled < 3.0 + 10.0, stderr[-3000:]
    lines = [line for line in stderr.splitlines() if line.startswith("stopped by SIGINT")]
    assert len(lines) == 1 and "abandoned" in lines[0] and "iter-000001 (iteration 1;" in lines[0], stderr[-3000:]
    assert float(lines[0].split("all stopped ")[1].split(" s")[0]) < 3.0  # closed within the grace (then the exit)

    mark.unlink()
    again = start(["train", "-c", str(config_file), "-s", "runtime.stop_grace_s=20", "--resume"], pace_s=30.0,
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
        **settings("vanilla", run_dir), "mode": "disaggregated", "eval": {"every": 100, "seeds_per_prompt": 1,
                                                                         "num_steps": 2, "prompts": 4},
        "rollout": {"prompts_per_iteration": 3, "group_size": 4, "num_steps": 4},
        "train": {"num_minibatches": 1, "num_epochs": 1, "old_policy_decay": 0.0, "nft_kl_beta": 0.0},
        "runtime": {"max_wall_s": None}}))
    driver = start(["train", "-c", str(config_file)], pace_s=0.5)
    wait_for(driver, lambda: any(record["iteration"] == 1 for record in records(run_dir)))
    started = descendants(driver.pid)  # the Ray head, the generator actors
    driver.send_signal(signal.SIGTERM)
    _, stderr = driver.communicate(timeout=60)
    assert driver.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    lines = [line for line in stderr.splitlines() if line.startswith("stopped by SIGTERM")]
    assert len(lines) == 1 and lines[0].split("continue with: ")[1].endswith("--resume"), stderr[-3000:]
    saved = int(lines[0].split("(iteration ")[1].split(" ")[0])
    assert (run_dir / "checkpoints" / f"iter-{saved:06d}").is_dir() and saved in (1, 2)
    time.sleep(2)
    assert not [p for p in started if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
