"""The command line: bad input ends in one line naming the cause, with exit code 2."""

from __future__ import annotations

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
