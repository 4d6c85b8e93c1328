"""The SIGKILL-and-resume check that every model kind and mode repeats (issue 45: "resumes after SIGKILL to
the same result"), written once.

`kill_after_first_checkpoint_and_resume` starts ``spotlight train`` in a process of its own, SIGKILLs it
and everything it started (Ray nodes, workers, ranks) once its first checkpoint is on disk, as a lost machine
would, and finishes the run with ``--resume`` (in a process of its own; with ``resume_here``, in the test process:
`resume_in_this_process`). `assert_resumed_to_the_uninterrupted_result` then compares it
with an uninterrupted run of the same config: the metrics that do not measure time, and the final weights,
bit for bit. The drivers' stderr goes to files beside the config (a pipe nobody reads fills and blocks a
talkative driver), and every failure shows its tail.

`stop_mid_iteration_and_resume` is the SIGTERM counterpart (the stop tests of every mode): the run gets SIGTERM
while its second iteration runs, must save it, stop every process it started and print one line with the
``--resume`` command, and that command's arguments, given to the same CLI in the test process, must finish the run.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import psutil
import torch
import yaml

from spotlight.components.checkpoint import TrainingState, latest_checkpoint, load_model, load_training_state

TESTS = Path(__file__).parent
FIRST_CHECKPOINT_S = 300.0
RESUME_S = 400.0
TAIL = 3000  # characters of a driver's stderr shown with a failure
STARTED_S = 300.0  # for a run to reach the point a test stops it at
ENDED_S = 2.0  # for the processes of a stopped driver to end after it did


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


def kill_after_first_checkpoint_and_resume(config_file: Path, run_dir: Path, iterations: int,
                                           resume_here: bool = False) -> TrainingState:
    """Run ``config_file`` (whose ``run_dir`` is ``run_dir``) until its first checkpoint, SIGKILL its process
    tree, then ``--resume`` it to exit 0; returns the training state of the checkpoint it was killed after.

    That checkpoint must be mid-run (before ``iterations``): one at the end would resume nothing.
    ``resume_here``: the resume runs in this process (`resume_in_this_process`), not in one of its own.
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

    if resume_here:
        resume_in_this_process(["train", "-c", str(config_file), "--resume"])
        return state
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


def resume_in_this_process(args: list[str]) -> None:
    """``spotlight <args>`` (a ``train ... --resume``) in this process, through the CLI's own entry point, to exit 0.

    The resumed run is not the one signalled or killed, so it need not pay a fresh interpreter's imports
    (torch, Ray, the trackers' libraries); the test process has them already. ``paced_reward`` pauses only
    where PACE_S is set, which the test process never is.
    """
    from typer.testing import CliRunner

    from spotlight.cli import app

    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, (f"spotlight {' '.join(args)} exited {result.exit_code}:\n{result.output[-TAIL:]}"
                                   f"{'' if result.exception is None else repr(result.exception)}")


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


def spotlight(args: list[str], pace_s: float = 0.0, mark: Path | None = None) -> subprocess.Popen:
    """``spotlight <args>`` in a process of its own, stdout and stderr piped, with the tests' modules importable
    and ``paced_reward``'s pause (``PACE_S`` seconds a call) and mark file (``PACE_MARK``) set."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS.parent), str(TESTS)]), "PACE_S": str(pace_s),
           "PACE_MARK": str(mark or "")}
    return subprocess.Popen([sys.executable, "-m", "spotlight", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def wait_for(driver: subprocess.Popen, done: Callable[[], bool]) -> None:
    """Return once ``done()``; fails with the driver's stderr if it ends first or STARTED_S pass."""
    deadline = time.monotonic() + STARTED_S
    while not done():
        assert driver.poll() is None, driver.stderr.read()[-TAIL:]
        assert time.monotonic() < deadline, f"the run did not get there within {STARTED_S:.0f} s"
        time.sleep(0.02)


def descendants(pid: int) -> list[psutil.Process]:
    return psutil.Process(pid).children(recursive=True)


def _alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def assert_ended(processes: list[psutil.Process]) -> None:
    """Every one of ``processes`` (what a driver that has exited had started) ends within ENDED_S."""
    deadline = time.monotonic() + ENDED_S
    while (left := [p for p in processes if _alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not left, f"{len(left)} processes of the stopped run outlived it by {ENDED_S:.0f} s: {left[:3]}"


def stop_mid_iteration_and_resume(config_file: Path, run_dir: Path, pace_s: float) -> None:
    """SIGTERM ``spotlight train -c config_file`` (``run_dir``; reward ``paced_reward:paced``, three or more
    iterations, no periodic checkpoint before the end) once iteration 1 is logged, so that iteration 2 is running
    (its reward calls pause ``pace_s`` seconds), then run the ``--resume`` command it printed to exit 0 (in this
    process: `resume_in_this_process`).

    The stop must exit 143 with one line naming the checkpoint of the iteration in progress (or, had it started
    late, of the one before), its iteration and the command; the metrics up to it, nothing lost, nothing extra;
    and no process the driver started may outlive it.
    """
    driver = spotlight(["train", "-c", str(config_file)], pace_s=pace_s)
    wait_for(driver, lambda: any(record["iteration"] == 1 for record in records(run_dir)))  # 2 is running
    started = descendants(driver.pid)  # Ray's processes in the Ray modes
    driver.send_signal(signal.SIGTERM)
    _, stderr = driver.communicate(timeout=60)
    assert driver.returncode == 128 + signal.SIGTERM, stderr[-TAIL:]

    lines = [line for line in stderr.splitlines() if line.startswith("stopped by SIGTERM")]
    assert len(lines) == 1, stderr[-TAIL:]
    line = lines[0]
    saved = int(line.split("(iteration ")[1].split(" ")[0])
    assert saved in (1, 2)  # the iteration in progress, finished (or, had it started late, the one before)
    assert f"checkpoints/iter-{saved:06d}" in line and (run_dir / "checkpoints" / f"iter-{saved:06d}").is_dir()
    assert [r["iteration"] for r in records(run_dir)] == list(range(saved + 1))  # nothing lost, nothing extra
    assert_ended(started)  # Ray stopped

    command = shlex.split(line.split("continue with: ")[1])
    assert command[0] == "spotlight" and command[-1] == "--resume"
    resume_in_this_process(command[1:])  # the printed command's arguments, to the same CLI


def records(run_dir: Path) -> list[dict[str, Any]]:
    """The run's metrics.jsonl so far ([] before it exists)."""
    path = run_dir / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.is_file() else []
    return [json.loads(line) for line in lines if line.strip()]


def assert_a_killed_run_resumes_to(config: dict[str, Any], clean_dir: Path, iterations: int,
                                   prefixes: Iterable[str]) -> Path:
    """The whole SIGKILL check of one model kind: ``config`` (whose ``run_dir`` is where the killed run goes) is
    written beside that folder, killed after its first checkpoint, resumed in this process, and must log every
    iteration and end as ``clean_dir``'s uninterrupted run of the same config did; returns the killed run's folder."""
    killed_dir = Path(config["run_dir"])
    config_file = killed_dir.parent / f"{killed_dir.name}.yaml"
    config_file.write_text(yaml.safe_dump(config))
    kill_after_first_checkpoint_and_resume(config_file, killed_dir, iterations, resume_here=True)
    assert [record["iteration"] for record in metrics(killed_dir)] == list(range(iterations + 1))
    assert_resumed_to_the_uninterrupted_result(killed_dir, clean_dir, prefixes)
    return killed_dir
