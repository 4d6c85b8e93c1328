"""Bad input on the command line ends in one line naming the cause and the fix, exit code 2, no traceback."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from spotlight.cli import app

runner = CliRunner()


def one_line_error(result) -> str:
    lines = [line for line in result.output.strip().splitlines() if line.strip()]
    assert result.exit_code == 2, result.output
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    return lines[0]


@pytest.fixture
def truncated_model(tiny_base_model: Path, tmp_path: Path) -> Path:
    """The tiny base model with its weights cut in half (a copy interrupted mid-way)."""
    model = tmp_path / "truncated"
    shutil.copytree(tiny_base_model, model)
    os.truncate(model / "model.safetensors", (model / "model.safetensors").stat().st_size // 2)
    return model


def test_train_from_a_truncated_base_model_is_one_line(truncated_model: Path, tmp_path: Path) -> None:
    line = one_line_error(runner.invoke(app, ["train", "-s", f"base_checkpoint={truncated_model}", "-s",
                                              "mode=vanilla", "-s", f"run_dir={tmp_path / 'run'}"]))
    assert str(truncated_model) in line and "unreadable" in line and "copy it again" in line


def test_eval_of_a_truncated_model_is_one_line(truncated_model: Path) -> None:
    line = one_line_error(runner.invoke(app, ["eval", str(truncated_model)]))
    assert str(truncated_model) in line and "unreadable" in line


@pytest.mark.parametrize("args,named", [
    (["-s", "train.learning_rate=[1,"], "quote it"),
    (["-c", "."], "is a directory"),
])
def test_config_input_errors_are_one_line(args: list[str], named: str) -> None:
    assert named in one_line_error(runner.invoke(app, ["train", *args]))


def test_a_duplicate_key_in_the_config_file_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "dup.yaml").write_text("seed: 1\nseed: 2\n")
    assert "duplicate key 'seed'" in one_line_error(runner.invoke(app, ["train", "-c", str(tmp_path / "dup.yaml")]))


def test_a_run_dir_that_is_a_file_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    line = one_line_error(runner.invoke(app, ["train", "-s", f"run_dir={tmp_path / 'file'}"]))
    assert "is a file" in line
