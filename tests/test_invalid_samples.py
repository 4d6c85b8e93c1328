"""Samples the reward cannot score are left out of training, and the run says how many and where the reasons are."""

from __future__ import annotations

from typer.testing import CliRunner

from spotlight.cli import app


def test_the_summary_counts_invalid_samples_and_the_log_keeps_their_reasons(tiny_base_model, tmp_path) -> None:
    result = CliRunner().invoke(app, [
        "train", "-s", f"base_checkpoint={tiny_base_model}", "-s", f"run_dir={tmp_path / 'run'}",
        "-s", "mode=vanilla", "-s", "iterations=2", "-s", "num_threads=1", "-s", "rollout.prompts_per_iteration=1",
        "-s", "rollout.group_size=3", "-s", "rollout.num_steps=2", "-s", "eval.seeds_per_prompt=1",
        "-s", "eval.num_steps=1", "-s", "eval.every=100", "-s", "reward.name=paced_reward:nan_first"])
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("invalid samples:")]
    assert lines == [f"invalid samples: 2 over the run (the reward could not score them; left out of training); "
                     f"the reasons are in {tmp_path / 'run' / 'spotlight.log'}"]
    assert "samples invalid: sample 0 ('" in (tmp_path / "run" / "spotlight.log").read_text()
    assert "reward is nan" in (tmp_path / "run" / "spotlight.log").read_text()
