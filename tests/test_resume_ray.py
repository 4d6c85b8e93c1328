"""A spotlight run on the Ray runtime stopped mid-run, by SIGKILL or by SIGTERM, resumes to the uninterrupted result.

A 3-iteration spotlight run (one spot device, no preemptions, one planner arm, rounds run whole) is stopped
and finished with ``spotlight train --resume`` (run in the test process: the stopped driver is the real process
under test); both tests compare the result with one uninterrupted run of the same settings (`uninterrupted`,
shared: checkpoints are writes, not decisions, so how often a run writes them does not change it):

- SIGKILL, of the driver and every process it started, once a checkpoint is on disk and before the last one.
  The checkpoint carries the backend's state (the seeds the closed round chose for the next iteration, the
  staleness monitor's pending re-score), so the resumed run explores nothing twice and, with the arm fixed
  and the budget restored, makes the same decisions: its final weights and its per-iteration rewards and
  losses equal those of an uninterrupted run bit for bit.
- SIGTERM while iteration 2 runs (tests/test_stop_signals.py's promise in mode spotlight): the run saves
  it, stops Ray, prints one line with the ``--resume`` command, and that command ends equal as well.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from resume_helpers import (
    assert_resumed_to_the_uninterrupted_result,
    kill_after_first_checkpoint_and_resume,
    stop_mid_iteration_and_resume,
)

from spotlight.config import TrainConfig, parse_config
from spotlight.trainer import train

ITERATIONS = 3
DETERMINISTIC = ("rollout/", "train/", "explore/", "staleness/", "planner/num_")  # the rest are timings and bills
PACE_S = 0.3  # each reward call's pause in the run that gets SIGTERM: iteration 2 is still running


def settings(run_dir: Path, checkpoint_every: int = 100) -> dict[str, Any]:
    """The one spotlight run both tests stop; the shipped base model (shapes-base): its rewards vary, so
    training moves the weights. ``paced_reward:paced`` is the mean brightness, paused only where PACE_S is set."""
    return {
        "mode": "spotlight", "base_checkpoint": "shapes-base", "run_dir": str(run_dir), "iterations": ITERATIONS,
        "num_threads": 1, "checkpoint_every": checkpoint_every, "reward": {"name": "paced_reward:paced"},
        "rollout": {"prompts_per_iteration": 2, "group_size": 2, "num_steps": 3},
        "train": {"num_minibatches": 1},
        "explore": {"monitor_prompts": 1},
        "eval": {"every": 100, "seeds_per_prompt": 1, "num_steps": 1, "grid_prompts": 1},
        # complete_rounds: a round runs whole whenever the spot device comes up, so a stopped, paced or resumed
        # run explores the candidates of the uninterrupted one (without it, a device that came up after a
        # round's training left that round unexplored in one run and not the other: two discrete outcomes
        # under load)
        "runtime": {"trace": None, "max_wall_s": None, "explore_wait_s": 300.0, "node_timeout_s": 240.0,
                    "complete_rounds": True, "planner": {"num_candidates": [4], "num_steps": [2]}},
    }


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run dir of the settings run without a stop (in this process), for both tests to compare with."""
    clean_dir = tmp_path_factory.mktemp("uninterrupted") / "run"
    train(parse_config(TrainConfig, settings(clean_dir)))
    return clean_dir


@pytest.mark.slow
def test_a_spotlight_run_killed_after_a_checkpoint_resumes_to_the_uninterrupted_result(
    tmp_path: Path, uninterrupted: Path,
) -> None:
    killed_dir = tmp_path / "killed"
    config_file = tmp_path / "config.yaml"
    config_file.write_text(yaml.safe_dump(settings(killed_dir, checkpoint_every=1)))  # a checkpoint mid-run
    state = kill_after_first_checkpoint_and_resume(config_file, killed_dir, ITERATIONS, resume_here=True)
    assert state.extra["backend"]["explored"]["target"] == state.iteration  # the next seeds, kept

    assert_resumed_to_the_uninterrupted_result(killed_dir, uninterrupted, DETERMINISTIC)
    logs = sorted(path.name for path in killed_dir.glob("queue-log-*.jsonl"))
    assert logs == ["queue-log-0.jsonl", "queue-log-1.jsonl"]  # each driver's queue had a log of its own


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["spotlight"])  # [vanilla]: tests/test_stop_signals.py
def test_sigterm_mid_iteration_saves_it_stops_ray_and_the_printed_resume_ends_equal(
    tmp_path: Path, mode: str, uninterrupted: Path,
) -> None:
    run_dir = tmp_path / "stopped"
    config_file = tmp_path / "config.yaml"
    config_file.write_text(yaml.safe_dump({**settings(run_dir), "mode": mode}))  # checkpointed by the stop only
    stop_mid_iteration_and_resume(config_file, run_dir, PACE_S)
    assert_resumed_to_the_uninterrupted_result(run_dir, uninterrupted, DETERMINISTIC)
