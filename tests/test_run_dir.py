"""The run directory as a trustworthy record: one writer, a resume that cannot change what ran, torn writes."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from spotlight.cli import app
from spotlight.components.checkpoint import save_training_checkpoint
from spotlight.components.manifest import write_manifest
from spotlight.components.run_dir import RunDirError, RunDirLock, check_resume_config, read_metrics
from spotlight.config import TrainConfig, dump_config, parse_config
from spotlight.trainer import Trainer, train

runner = CliRunner()


def tiny_config(base: Path, run_dir: Path, **fields) -> TrainConfig:
    data = {
        "mode": "vanilla", "base_checkpoint": str(base), "run_dir": str(run_dir), "iterations": 2, "num_threads": 1,
        "checkpoint_every": 1,
        "rollout": {"prompts_per_iteration": 1, "group_size": 2, "num_steps": 2},
        "train": {"num_minibatches": 1, "num_epochs": 1},
        "eval": {"every": 1, "seeds_per_prompt": 1, "num_steps": 1, "grid_prompts": 1, "raw_model": False},
    }
    data.update(fields)
    return parse_config(TrainConfig, data)


def config_file(config: TrainConfig, path: Path) -> list[str]:
    """``-c FILE`` arguments for ``spotlight train`` that give ``config``."""
    dump_config(config, path)
    return ["-c", str(path)]


def one_line_error(result) -> str:
    lines = [line for line in result.output.strip().splitlines() if line.strip()]
    assert result.exit_code == 2, result.output
    assert len(lines) == 1, result.output
    return lines[0]


def test_a_second_lock_on_a_run_dir_is_refused_in_one_line(tmp_path: Path) -> None:
    first = RunDirLock(tmp_path / "run")
    with pytest.raises(RunDirError, match="in use by another spotlight run") as error:
        RunDirLock(tmp_path / "run")
    assert f"pid {os.getpid()}" in str(error.value) and "\n" not in str(error.value)
    first.release()
    RunDirLock(tmp_path / "run").release()  # free again once released


def test_a_killed_holder_frees_the_lock(tmp_path: Path) -> None:
    # Another process holds the lock the way RunDirLock takes it; SIGKILL must free it (no stale lock files).
    (tmp_path / "run").mkdir()
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, sys, time\n"
        f"fd = os.open({str(tmp_path / 'run' / '.lock')!r}, os.O_RDWR | os.O_CREAT)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\nprint('locked', flush=True)\ntime.sleep(60)\n")],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(RunDirError, match="in use"):
            RunDirLock(tmp_path / "run")
    finally:
        holder.kill()
        holder.wait(timeout=10)
    RunDirLock(tmp_path / "run").release()


def test_a_run_dir_that_is_a_file_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "run").write_text("not a directory")
    with pytest.raises(RunDirError, match="is a file"):
        RunDirLock(tmp_path / "run")


def test_two_trainers_cannot_write_one_run_dir(tiny_base_model, tmp_path: Path) -> None:
    config = tiny_config(tiny_base_model, tmp_path / "run")
    first = Trainer(config)
    with pytest.raises(RunDirError, match="in use"):
        Trainer(config)
    first._lock.release()


@pytest.mark.parametrize("changes", [{"seed": 1}, {"mode": "sync-explore"}, {"train": {"learning_rate": 3e-4}}])
def test_resume_with_a_changed_config_is_refused_and_config_yaml_kept(tiny_base_model, tmp_path: Path,
                                                                       changes) -> None:
    run_dir = tmp_path / "run"
    original = tiny_config(tiny_base_model, run_dir)
    (run_dir / "checkpoints").mkdir(parents=True)
    dump_config(original, run_dir / "config.yaml")
    before = (run_dir / "config.yaml").read_text()
    data = original.model_dump(mode="json")
    for key, value in changes.items():
        data[key] = {**data[key], **value} if isinstance(value, dict) else value
    changed = parse_config(TrainConfig, data)
    field = next(iter(changes)) + ("." + next(iter(changes["train"])) if "train" in changes else "")
    with pytest.raises(RunDirError, match=f"differs from the run's .* in {field} ") as error:
        Trainer(changed, resume=True)
    assert "\n" not in str(error.value)
    assert (run_dir / "config.yaml").read_text() == before
    RunDirLock(run_dir).release()  # the refused run let go of the directory


def test_resume_may_change_iterations_wall_time_and_validation(tiny_base_model, tmp_path: Path) -> None:
    original = tiny_config(tiny_base_model, tmp_path / "run")
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    dump_config(original, tmp_path / "run" / "config.yaml")
    data = original.model_dump(mode="json")
    data.update(iterations=50, checkpoint_every=5)
    data["runtime"]["max_wall_s"] = 60.0
    data["eval"]["every"] = 7
    check_resume_config(tmp_path / "run" / "config.yaml", parse_config(TrainConfig, data))


def test_a_torn_last_metrics_line_is_dropped_with_a_warning(tmp_path: Path, caplog) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"iteration": 0, "val/reward": 0.5}\n{"iteration": 1, "train/lo')
    with caplog.at_level(logging.WARNING, logger="spotlight.components.run_dir"):
        assert read_metrics(path) == [{"iteration": 0, "val/reward": 0.5}]
    assert "torn last line" in caplog.text
    path.write_text('{"iteration": 0}\n{"iter\n{"iteration": 2}\n')  # damage before the end is not a torn write
    with pytest.raises(RunDirError, match="line 2"):
        read_metrics(path)


def test_resume_after_a_torn_checkpoint_and_metrics_line_continues_from_the_previous_checkpoint(
        tiny_base_model, tmp_path: Path, caplog) -> None:
    run_dir = tmp_path / "run"
    config = tiny_config(tiny_base_model, run_dir)
    straight = train(tiny_config(tiny_base_model, tmp_path / "straight")).history
    train(config)
    state = run_dir / "checkpoints" / "iter-000002" / "training_state.pt"
    os.truncate(state, state.stat().st_size // 2)  # killed while the disk was writing it
    with (run_dir / "metrics.jsonl").open("a") as metrics:
        metrics.write('{"iteration": 3, "rollout/rew')  # and mid-way through a metrics line
    with caplog.at_level(logging.WARNING):
        resumed = train(config, resume=True).history
    assert "iter-000002 is not usable" in caplog.text and "torn last line" in caplog.text
    assert [r["iteration"] for r in resumed] == [0, 1, 2]
    assert resumed[-1]["val/reward"] == straight[-1]["val/reward"]
    assert [r["iteration"] for r in read_metrics(run_dir / "metrics.jsonl")] == [0, 1, 2]


def test_cli_resume_of_a_crafted_checkpoint_runs_nothing_and_prints_one_line(tiny_base_model, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    config = tiny_config(tiny_base_model, run_dir)
    Trainer(config)._lock.release()  # config.yaml written, as a started run leaves it
    model = torch.nn.Linear(1, 1)
    from spotlight.components.checkpoint import load_model

    base = load_model(tiny_base_model)
    path = save_training_checkpoint(run_dir, 1, base, torch.optim.SGD(model.parameters(), lr=0.1), None, {})
    marker = tmp_path / "payload-ran"
    payload = ("cos\nsystem\n(S'mkdir " + str(marker) + "'\ntR.").encode()  # protocol-0 pickle: os.system(...)
    with (path / "training_state.pt").open("wb") as handle:
        handle.write(payload)
    write_manifest(path)
    (run_dir / "metrics.jsonl").write_text('{"iteration": 0}\n{"iteration": 1}\n')
    line = one_line_error(runner.invoke(app, ["train", "--resume", *config_file(config, tmp_path / "given.yaml")]))
    assert not marker.exists()
    assert "training_state.pt" in line and ("refuses to unpickle" in line or "unreadable" in line)


def test_cli_resume_with_another_seed_names_the_field(tiny_base_model, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    config = tiny_config(tiny_base_model, run_dir)
    (run_dir / "checkpoints").mkdir(parents=True)
    dump_config(config, run_dir / "config.yaml")
    given = config_file(config, tmp_path / "given.yaml")
    line = one_line_error(runner.invoke(app, ["train", "--resume", *given, "-s", "seed=7"]))
    assert "seed 0 -> 7" in line
