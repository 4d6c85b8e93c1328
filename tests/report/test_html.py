"""The HTML report: a panel per plot, a table row per run with its own numbers, "not logged" for absent metrics,
and a one-line error for a run directory that is not one."""

from __future__ import annotations

import base64
import io
import json
import re
from pathlib import Path

import yaml
from PIL import Image
from typer.testing import CliRunner

from spotlight.cli import app
from spotlight.report.html import write_report

PANELS = ("accuracy-wall", "accuracy-cost", "reward-variance", "utilisation", "planner", "kendall-tau")
runner = CliRunner()


def make_run(root: Path, name: str, accuracies: list[float], spotlight: bool) -> Path:
    """A run dir with validation every 2 iterations; ``spotlight`` runs also log cost, planner, τ and events."""
    run_dir = root / name
    (run_dir / "samples").mkdir(parents=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump({"mode": "spotlight" if spotlight else "vanilla",
                                                        "explore": {"staleness_floor": 0.3}}))
    rows = []
    for iteration in range(2 * len(accuracies) - 1):
        row: dict[str, float] = {"iteration": iteration, "time/wall_s": 10.0 * iteration}
        if iteration % 2 == 0:
            row.update({"val/strict_accuracy": accuracies[iteration // 2], "val/reward": 0.5})
        if iteration > 0:
            row.update({"rollout/group_reward_var": 0.04, "rollout/group_reward_std": 0.2})
        if spotlight and iteration > 0:
            row.update({"cost/usd": 0.5 * iteration, "planner/num_candidates": 16 + iteration,
                        "planner/num_steps": 4, "staleness/kendall_tau": 0.8, "util/spot": 0.85,
                        "util/spot_train_phase": 0.9})
        rows.append(row)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    if spotlight:
        events = [{"t": 0.0, "kind": "busy", "node": "spot-0", "device": "spot-0/cpu0", "start": 1.0, "end": 9.0,
                   "phase": "explore"},
                  {"t": 12.0, "kind": "preemption_notice", "node": "spot-0"},
                  {"t": 14.0, "kind": "node_removed", "node": "spot-0"},
                  {"t": 30.0, "kind": "node_added", "node": "spot-0"}]
        (run_dir / "events.jsonl").write_text("".join(json.dumps(event) + "\n" for event in events))
    for iteration, colour in ((0, (255, 0, 0)), (2 * len(accuracies) - 2, (0, 0, 255))):
        Image.new("RGB", (8, 8), colour).save(run_dir / "samples" / f"iter-{iteration:05d}.png")
    return run_dir


def panel(page: str, key: str) -> str:
    match = re.search(rf'<section class="panel" id="panel-{key}">(.*?)</section>', page, re.S)
    assert match is not None, f"no panel {key}"
    return match.group(1)


def table_row(page: str, run: str) -> str:
    match = re.search(rf'<tr class="run" data-run="{run}">(.*?)</tr>', page, re.S)
    assert match is not None, f"no table row for {run}"
    return match.group(1)


def test_every_plot_is_a_panel_and_every_run_a_row_with_its_own_final_accuracy(tmp_path):
    fast = make_run(tmp_path, "fast", [0.1, 0.4, 0.7], spotlight=True)
    slow = make_run(tmp_path, "slow", [0.1, 0.6, 0.2], spotlight=False)
    page = write_report([fast, slow], tmp_path / "report.html").read_text()
    for key in PANELS:
        assert "<img" in panel(page, key), f"panel {key} has no plot"
    assert "0.700 (iter 4)" in table_row(page, "fast")
    assert "$2.00" in table_row(page, "fast")  # the cost at the last row: 0.5 $/iteration × 4
    slow_row = table_row(page, "slow")
    assert "0.200 (iter 4)" in slow_row and "0.600 (iter 2)" in slow_row  # final vs best
    assert "not logged" in slow_row  # a vanilla run has no cost


def test_the_latest_sample_grid_of_each_run_is_embedded(tmp_path):
    run = make_run(tmp_path, "run", [0.1, 0.4], spotlight=False)
    page = write_report([run], tmp_path / "report.html").read_text()
    grid = re.search(r'<figure class="grid" data-run="run">.*?base64,([^"]+)"', page, re.S)
    assert grid is not None and "iter-00002.png" in page
    pixel = Image.open(io.BytesIO(base64.b64decode(grid.group(1)))).getpixel((0, 0))
    assert pixel == (0, 0, 255)  # the latest grid (blue), not the base model's (red)


def test_metrics_no_run_logs_leave_their_panel_not_logged(tmp_path):
    vanilla = make_run(tmp_path, "vanilla", [0.1, 0.3], spotlight=False)
    page = write_report([vanilla], tmp_path / "report.html").read_text()
    for key in ("accuracy-cost", "utilisation", "planner", "kendall-tau"):
        assert "not logged" in panel(page, key) and "<img" not in panel(page, key)
    assert "<img" in panel(page, "accuracy-wall")


def test_a_run_lacking_a_metric_others_log_is_named_as_not_logged(tmp_path):
    runs = [make_run(tmp_path, "spot", [0.1, 0.3], spotlight=True), make_run(tmp_path, "plain", [0.1, 0.2], False)]
    page = write_report(runs, tmp_path / "report.html").read_text()
    planner = panel(page, "planner")
    assert "<img" in planner and "not logged for plain" in planner


def test_a_torn_last_line_and_a_repeated_iteration_do_not_break_the_report(tmp_path):
    run = make_run(tmp_path, "run", [0.1, 0.3], spotlight=False)
    with (run / "metrics.jsonl").open("a") as metrics:
        metrics.write(json.dumps({"iteration": 2, "time/wall_s": 25.0, "val/strict_accuracy": 0.5}) + "\n")
        metrics.write('{"iteration": 3, "time/wa')  # a preempted writer
    page = write_report([run], tmp_path / "report.html").read_text()
    assert "0.500 (iter 2)" in table_row(page, "run")  # the resumed run's write wins
    assert "1 unreadable lines skipped" in page


def test_report_cli_writes_run_dir_report_html_for_one_run(tmp_path):
    run = make_run(tmp_path, "run", [0.1, 0.3], spotlight=True)
    result = runner.invoke(app, ["report", str(run)])
    assert result.exit_code == 0, result.output
    assert (run / "report.html").is_file()


def test_report_cli_of_a_missing_run_dir_is_one_line_naming_it(tmp_path):
    good = make_run(tmp_path, "good", [0.1, 0.3], spotlight=False)
    for bad in (tmp_path / "no-such-run", tmp_path / "empty"):
        if bad.name == "empty":
            bad.mkdir()
        result = runner.invoke(app, ["report", str(good), str(bad), "--out", str(tmp_path / "r.html")])
        lines = [line for line in result.output.strip().splitlines() if line.strip()]
        assert result.exit_code == 2, result.output
        assert len(lines) == 1 and str(bad) in lines[0] and "spotlight train" in lines[0], result.output
    assert not (tmp_path / "r.html").exists()


def test_report_cli_of_a_directory_of_runs_says_to_pass_the_runs(tmp_path):
    make_run(tmp_path / "sweep", "seed0", [0.1, 0.3], spotlight=False)
    result = runner.invoke(app, ["report", str(tmp_path / "sweep")])
    assert result.exit_code == 2 and f"pass {tmp_path / 'sweep'}/* instead" in result.output, result.output


def test_a_reward_without_a_strict_flag_is_reported_by_its_mean_reward_with_spot_use_over_held_time(tmp_path):
    """The score that picked the best model, named; spot busy / held and the held fraction from summary.json."""
    run = make_run(tmp_path, "brightness", [0.0, 0.0], spotlight=True)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    for row, score in zip([r for r in rows if "val/strict_accuracy" in r], (0.31, 0.47), strict=True):
        row.update({"val/score": score, "val/score_is_strict": 0.0})
    (run / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (run / "summary.json").write_text(json.dumps({"mode": "spotlight", "util/spot": 0.92,
                                                  "util/spot_held_fraction": 0.5}))
    page = write_report([run], tmp_path / "report.html").read_text()
    row = table_row(page, "brightness")
    assert "mean reward" in row and "0.470 (iter 2)" in row and "0.000" not in row
    assert '<td class="spot-util">0.92</td>' in row and '<td class="spot-held">0.50</td>' in row
    assert "Validation score (mean reward)" in page
