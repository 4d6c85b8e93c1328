"""A run directory that cannot be written ends in one line, exit code 2, and keeps what it had committed.

The failures are real: a run_dir the kernel refuses (a file, a path under /sys), run in a subprocess
through the installed CLI; a file-size limit (RLIMIT_FSIZE) that makes the kernel fail the run's own
writes with EFBIG part-way through a run, the same ``OSError`` path as a full disk.
"""

from __future__ import annotations

import contextlib
import json
import resource
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from spotlight.components.run_dir import RunDirError, read_metrics
from spotlight.config import TrainConfig, parse_config
from spotlight.trainer import Trainer


def tiny_config(base: Path, run_dir: Path, **fields: Any) -> TrainConfig:
    data = {
        "mode": "vanilla", "base_checkpoint": str(base), "run_dir": str(run_dir), "iterations": 3, "num_threads": 1,
        "rollout": {"prompts_per_iteration": 1, "group_size": 2, "num_steps": 2},
        "train": {"num_minibatches": 1, "num_epochs": 1},
        "eval": {"every": 100, "seeds_per_prompt": 1, "num_steps": 1, "grid_prompts": 1},
        **fields,
    }
    return parse_config(TrainConfig, data)


def cli_train(run_dir: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "spotlight", "train", "-s", f"run_dir={run_dir}"],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("run_dir,named", [
    ("TMP/file", "is a file"),
    ("TMP/file/run", "cannot use run_dir"),  # a directory inside a file
    ("/sys/spotlight-run-dir", "cannot use run_dir"),  # sysfs refuses a new directory, even to root
])
def test_an_unusable_run_dir_is_one_line_and_exit_2_from_the_cli(tmp_path: Path, run_dir: str, named: str) -> None:
    (tmp_path / "file").write_text("")
    run_dir = run_dir.replace("TMP", str(tmp_path))
    result = cli_train(str(run_dir))
    lines = [line for line in result.stderr.splitlines() + result.stdout.splitlines() if line.strip()]
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1 and "Traceback" not in result.stderr, lines
    assert named in lines[0] and str(run_dir) in lines[0]


@contextlib.contextmanager
def writes_fail_past(size: int) -> Iterator[None]:
    """Every write of this process that would grow a file past ``size`` bytes fails with EFBIG."""
    limits = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # an OSError instead of the signal's kill
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, limits[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
        signal.signal(signal.SIGXFSZ, handler)


def run_until_writes_fail(trainer: Trainer, after_iteration: int, size: int | None) -> RunDirError:
    """Run ``trainer``; once the record of ``after_iteration`` is logged, writes past ``size`` bytes fail
    (None: past the size metrics.jsonl has then, so its next line cannot be appended)."""
    limit = contextlib.ExitStack()

    def on_iteration(iteration: int, record: dict[str, Any]) -> None:
        if iteration == after_iteration:
            limit.enter_context(writes_fail_past(size or (trainer.run_dir / "metrics.jsonl").stat().st_size))

    with limit, pytest.raises(RunDirError) as raised:
        trainer.run(on_iteration)
    return raised.value


def test_a_failed_metrics_append_is_one_line_and_the_lines_before_it_stay(tiny_base_model: Path, tmp_path: Path):
    run_dir = tmp_path / "run"
    trainer = Trainer(tiny_config(tiny_base_model, run_dir, checkpoint_every=100))
    metrics = run_dir / "metrics.jsonl"
    error = run_until_writes_fail(trainer, after_iteration=1, size=None)
    message = str(error)
    assert "\n" not in message and str(metrics) in message and "File too large" in message
    assert "--resume" in message and "none yet" in message
    assert [record["iteration"] for record in read_metrics(metrics)] == [0, 1]
    assert [json.loads(line)["iteration"] for line in metrics.read_text().splitlines()] == [0, 1]


def test_a_failed_checkpoint_is_one_line_and_the_checkpoint_before_it_stays(tiny_base_model: Path, tmp_path: Path):
    run_dir = tmp_path / "run"
    trainer = Trainer(tiny_config(tiny_base_model, run_dir, checkpoint_every=1))
    error = run_until_writes_fail(trainer, after_iteration=2, size=1 << 16)  # metrics lines fit, weights do not
    message = str(error)
    assert "\n" not in message and str(run_dir / "checkpoints") in message and "File too large" in message
    assert "last complete checkpoint: iter-000001" in message
    checkpoints = run_dir / "checkpoints"
    assert sorted(path.name for path in checkpoints.glob("iter-*")) == ["iter-000001"]
    assert not list(checkpoints.glob(".staging-*"))  # the failed write left nothing behind
    assert [record["iteration"] for record in read_metrics(run_dir / "metrics.jsonl")] == [0, 1, 2]
    resumed = Trainer(tiny_config(tiny_base_model, run_dir, checkpoint_every=1), resume=True)
    assert resumed.start_iteration == 1  # the committed checkpoint still loads
    resumed._lock.release()
