"""The command line: bad input ends in one line naming the cause, with exit code 2."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from spotlight.cli import app

runner = CliRunner()


def one_line_error(result) -> str:
    lines = [line for line in result.output.strip().splitlines() if line.strip()]
    assert result.exit_code == 2, result.output
    assert len(lines) == 1, result.output
    return lines[0]


def test_a_malformed_config_names_the_field(tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text("train:\n  learning_rate: -1\n")
    line = one_line_error(runner.invoke(app, ["train", "-c", str(config)]))
    assert "train.learning_rate" in line and "greater than 0" in line


def test_a_misspelt_field_is_called_unknown(tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text("rollout:\n  group_sise: 8\n")
    line = one_line_error(runner.invoke(app, ["train", "-c", str(config)]))
    assert "rollout.group_sise" in line and "unknown field" in line


def test_a_missing_checkpoint_names_the_path(tmp_path):
    missing = tmp_path / "no-such-model"
    line = one_line_error(runner.invoke(app, ["train", "-s", f"base_checkpoint={missing}",
                                              "-s", f"run_dir={tmp_path / 'run'}"]))
    assert str(missing) in line and "spotlight pretrain" in line


def test_eval_of_a_missing_checkpoint_names_the_path(tmp_path):
    line = one_line_error(runner.invoke(app, ["eval", str(tmp_path / "gone")]))
    assert "gone" in line


def test_train_runs_and_prints_the_summary_table(tiny_base_model, tmp_path):
    result = runner.invoke(app, [
        "train", "-s", f"base_checkpoint={tiny_base_model}", "-s", f"run_dir={tmp_path / 'run'}",
        "-s", "mode=vanilla", "-s", "iterations=1", "-s", "num_threads=1", "-s", "rollout.prompts_per_iteration=1",
        "-s", "rollout.group_size=2", "-s", "rollout.num_steps=2", "-s", "eval.seeds_per_prompt=1",
        "-s", "eval.num_steps=1",
    ])
    assert result.exit_code == 0, result.output
    assert "val strict acc" in result.output
    assert (tmp_path / "run" / "metrics.jsonl").is_file()


# -- the top-level failure handler and `python -m spotlight`, as a person runs them (a real process) -------


def spotlight_process(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """Run ``python -m spotlight ARGS`` in a fresh interpreter: typer's exception hook and all."""
    return subprocess.run([sys.executable, "-m", "spotlight", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "TMPDIR": str(cwd)})


def test_python_m_spotlight_is_the_spotlight_command_and_a_bad_config_is_one_line(tmp_path):
    listing = spotlight_process("--help", cwd=tmp_path)
    assert listing.returncode == 0 and all(name in listing.stdout for name in ("train", "eval", "--debug"))
    (tmp_path / "bad.yaml").write_text("rollout:\n  group_sise: 8\n")
    failed = spotlight_process("train", "-c", "bad.yaml", cwd=tmp_path)
    assert failed.returncode == 2
    assert failed.stdout == "" and failed.stderr.count("\n") == 1, failed.stderr
    assert failed.stderr.startswith("error: ") and "rollout.group_sise" in failed.stderr


# The real command with one more subcommand that fails as a bug would (the package's own commands turn
# every failure they foresee into a known error, so none of them is a reliable way to get a bug).
SPOTLIGHT_WITH_A_BUG = """
import sys
from spotlight.cli import app

@app.command("divide")
def divide(count: int) -> None:
    print(1 / count)

sys.argv[0] = "spotlight"
app()
"""


def test_an_unexpected_error_is_one_line_naming_the_log_that_keeps_its_traceback(tmp_path):
    def spotlight_with_a_bug(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", SPOTLIGHT_WITH_A_BUG, *args], cwd=tmp_path, capture_output=True,
                              text=True, timeout=300, env={**os.environ, "TMPDIR": str(tmp_path)})

    assert spotlight_with_a_bug("divide", "2").stdout == "0.5\n"
    failed = spotlight_with_a_bug("divide", "0")
    assert failed.returncode == 1 and failed.stdout == ""
    lines = failed.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: unexpected ZeroDivisionError: division by zero;"), lines
    log = Path(re.search(r"the traceback is in (\S+) ", lines[0]).group(1))
    assert log.parent == tmp_path and log.is_file()
    assert "Traceback (most recent call last)" in log.read_text() and "divide 0" in log.read_text()
    debug = spotlight_with_a_bug("--debug", "divide", "0")
    assert debug.returncode == 1 and "Traceback (most recent call last)" in debug.stderr
    assert debug.stderr.splitlines()[-1].startswith("error: unexpected ZeroDivisionError")


def test_the_command_and_its_help_import_no_model_library() -> None:
    """``spotlight --help`` (and loading any config) imports neither torch nor diffusers, peft or transformers:
    they cost seconds a command that trains nothing should not pay."""
    probe = ("import sys\nfrom typer.testing import CliRunner\nfrom spotlight.cli import app\n"
             "assert CliRunner().invoke(app, ['--help']).exit_code == 0\n"
             "print(sorted(m for m in ('torch', 'diffusers', 'peft', 'transformers') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                            cwd=Path(__file__).parents[1])
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
