"""The SIGKILL-and-resume check that every model kind and mode repeats (issue 45: "resumes after SIGKILL to
the same result"), written once.

`kill_after_first_checkpoint_and_resume` starts ``spotlight train`` in a process of its own, SIGKILLs it
and everything it started (Ray nodes, workers, ranks) once its first checkpoint is on disk, as a lost machine
would, and finishes the run with ``--resume``. `assert_resumed_to_the_uninterrupted_result` then compares it
with an uninterrupted run of the same config: the metrics that do not measure time, and the final weights,
bit for bit. The drivers' stderr goes to files beside the config (a pipe nobody reads fills and blocks a
talkative driver), and every failure shows its tail.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import psutil
import torch

from spotlight.components.checkpoint import TrainingState, latest_checkpoint, load_model, load_training_state

TESTS = Path(__file__).parent
FIRST_CHECKPOINT_S = 300.0
RESUME_S = 400.0
TAIL = 3000  # characters of a driver's stderr shown with a failure


def kill_tree(pid: int) -> None:
    """SIGKILL a process and everything it started (its Ray nodes and workers), as a lost machine would."""
    try:
        root = psutil.Process(pid)
        family = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:  # it ended by itself
        return
    for process in family:
        try:
            process.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(family, timeout=30)


def spotlight_train(config_file: Path, *args: str, stderr: Any = subprocess.PIPE) -> subprocess.Popen:
    """``spotlight train -c config_file`` in a process of its own, with the tests' modules (reward functions
    such as ``video_reward:brightness``) importable."""
    return subprocess.Popen([sys.executable, "-m", "spotlight", "train", "-c", str(config_file), *args],
                            stdout=subprocess.DEVNULL, stderr=stderr, text=True,
                            env={**os.environ, "PYTHONPATH": f"{TESTS.parent}{os.pathsep}{TESTS}"})


def _tail(log: Path) -> str:
    return log.read_text(errors="replace")[-TAIL:] if log.is_file() else "(no stderr)"


def kill_after_first_checkpoint_and_resume(config_file: Path, run_dir: Path, iterations: int) -> TrainingState:
    """Run ``config_file`` (whose ``run_dir`` is ``run_dir``) until its first checkpoint, SIGKILL its process
    tree, then ``--resume`` it to exit 0; returns the training state of the checkpoint it was killed after.

    That checkpoint must be mid-run (before ``iterations``): one at the end would resume nothing.
    """
    killed_log, resumed_log = (config_file.with_name(f"{config_file.stem}.{name}.stderr")
                               for name in ("killed", "resumed"))
    with killed_log.open("w") as stderr:
        driver = spotlight_train(config_file, stderr=stderr)
    try:
        deadline = time.monotonic() + FIRST_CHECKPOINT_S
        while (checkpoint := latest_checkpoint(run_dir)) is None:
            assert driver.poll() is None, (f"the run ended (exit {driver.returncode}) before its first checkpoint:\n"
                                           f"{_tail(killed_log)}")
            assert time.monotonic() < deadline, (f"no checkpoint in {run_dir} within {FIRST_CHECKPOINT_S:.0f} s:\n"
                                                 f"{_tail(killed_log)}")
            time.sleep(0.05)
    finally:
        kill_tree(driver.pid)
    state = load_training_state(checkpoint)
    assert state.iteration < iterations, (f"the first checkpoint, {checkpoint.name}, is the run's last: nothing "
                                          f"was left to resume (make iterations > checkpoint_every)")

    with resumed_log.open("w") as stderr:
        resumed = spotlight_train(config_file, "--resume", stderr=stderr)
    try:
        code = resumed.wait(timeout=RESUME_S)
    except subprocess.TimeoutExpired:
        code = None
    finally:
        kill_tree(resumed.pid)
    outcome = f"ran past {RESUME_S:.0f} s" if code is None else f"exited {code}"
    assert code == 0, f"--resume from {checkpoint.name} {outcome}:\n{_tail(resumed_log)}"
    return state


def metrics(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def deterministic(record: dict[str, Any], prefixes: Iterable[str]) -> dict[str, Any]:
    """The record's metrics named with one of ``prefixes`` (those that measure no time or money)."""
    prefixes = tuple(prefixes)
    return {key: value for key, value in record.items() if key.startswith(prefixes)}


def assert_resumed_to_the_uninterrupted_result(resumed_dir: Path, clean_dir: Path, prefixes: Iterable[str]) -> None:
    """The resumed run logged the same iterations with the same ``prefixes`` metrics as the clean run, and its
    final checkpoint holds the same tensors, bit for bit; the clean run's weights moved (a gradient flowed),
    so their equality says something."""
    prefixes = tuple(prefixes)
    clean, again = metrics(clean_dir), metrics(resumed_dir)
    assert [r["iteration"] for r in again] == [r["iteration"] for r in clean]
    for clean_record, resumed_record in zip(clean, again, strict=True):
        expected, got = deterministic(clean_record, prefixes), deterministic(resumed_record, prefixes)
        differing = sorted(key for key in expected.keys() | got.keys() if expected.get(key) != got.get(key))
        assert got == expected, (f"iteration {clean_record['iteration']}: resumed != uninterrupted in "
                                 f"{ {key: (got.get(key), expected.get(key)) for key in differing} }")
    assert any(r.get("train/grad_norm", 0.0) > 0 for r in clean), "the weights never moved: their equality is empty"
    final_clean = load_model(latest_checkpoint(clean_dir)).state_dict()
    final_again = load_model(latest_checkpoint(resumed_dir)).state_dict()
    assert final_again.keys() == final_clean.keys()
    differing = [name for name, tensor in final_clean.items() if not torch.equal(final_again[name], tensor)]
    assert not differing, f"{len(differing)} of {len(final_clean)} final tensors differ, e.g. {differing[:3]}"
