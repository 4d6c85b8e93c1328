"""Reading a run directory (metrics, events, config, sample grids) into plain data for the report.

The training loop writes while a report may be read, and runs are preempted mid-write, so reading is
forgiving about what a crash leaves behind (a torn last line, a repeated iteration after a resume) and
strict only about what makes a report meaningless (no directory, no metrics).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml


class ReportError(ValueError):
    """A run directory that cannot be reported on; the message names the path and the fix."""


@dataclass
class Run:
    """One run directory, read once: metric rows by iteration, event rows, config, the latest sample grid."""

    name: str
    path: Path
    rows: list[dict[str, Any]]
    events: list[dict[str, Any]] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    latest_grid: Path | None = None
    skipped_lines: int = 0
    totals: dict[str, Any] = field(default_factory=dict)  # summary.json of a Ray run: dollars, utilisation

    def total(self, key: str, per_iteration: str) -> float | None:
        """The run's total ``key`` from summary.json, else the last iteration's ``per_iteration`` (a run going on)."""
        value = _number(self.totals.get(key))
        return value if value is not None else self.last(per_iteration)

    @property
    def score_key(self) -> str:
        """The metric of the score that picked the best model: ``val/score``, or for older runs strict accuracy."""
        return "val/score" if self.has("val/score") else "val/strict_accuracy"

    def validation_scores(self) -> tuple[list[float], list[float], str]:
        """(iterations, scores, name) of the score that picked the best model: strict accuracy, or the mean
        reward of a reward without a strict flag (``val/score``; older runs logged strict accuracy only)."""
        strict = all(bool(row.get("val/score_is_strict", 1.0)) for row in self.rows if "val/score" in row)
        iterations, scores = self.series(self.score_key)
        return iterations, scores, "strict accuracy" if strict else "mean reward"

    def series(self, y_key: str, x_key: str = "iteration") -> tuple[list[float], list[float]]:
        """(xs, ys) over the rows that log both keys as finite numbers; empty lists mean "not logged"."""
        xs: list[float] = []
        ys: list[float] = []
        for row in self.rows:
            x, y = _number(row.get(x_key)), _number(row.get(y_key))
            if x is not None and y is not None:
                xs.append(x)
                ys.append(y)
        return xs, ys

    def has(self, key: str) -> bool:
        return any(_number(row.get(key)) is not None for row in self.rows)

    def accuracy_vs_cost(self) -> tuple[list[float], list[float]]:
        """Validation accuracy against cumulative dollars.

        A validation row without ``cost/usd`` takes the last cost logged before it, and the base model's
        validation at wall time 0 costs nothing yet — so iteration 0 is on the curve even when the cost
        meter only starts logging with the first training iteration.
        """
        if not self.has("cost/usd"):
            return [], []
        costs: list[float] = []
        accuracies: list[float] = []
        last_cost: float | None = None
        for row in self.rows:
            cost = _number(row.get("cost/usd"))
            last_cost = cost if cost is not None else last_cost
            accuracy = _number(row.get(self.score_key))
            if accuracy is None:
                continue
            if last_cost is None and _number(row.get("time/wall_s")) == 0.0:
                last_cost = 0.0
            if last_cost is not None:
                costs.append(last_cost)
                accuracies.append(accuracy)
        return costs, accuracies

    def last(self, key: str) -> float | None:
        """The value of ``key`` in the last row that logs it (cumulative metrics: the run's total)."""
        for row in reversed(self.rows):
            value = _number(row.get(key))
            if value is not None:
                return value
        return None

    @property
    def mode(self) -> str:
        mode = self.config.get("mode")
        return str(mode) if mode is not None else "?"

    @property
    def iterations(self) -> int:
        """Training iterations done: iteration 0 is the base model's validation, not a training step."""
        return int(max(row["iteration"] for row in self.rows))


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _read_jsonl(path: Path) -> tuple[list[dict[str, Any]], int]:
    """Rows that parse as JSON objects, and how many lines did not (a torn write from a preempted run)."""
    rows: list[dict[str, Any]] = []
    skipped = 0
    for line in path.read_text(errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            skipped += 1
            continue
        if isinstance(row, dict):
            rows.append(row)
        else:
            skipped += 1
    return rows, skipped


def load_run(run_dir: Path, name: str | None = None) -> Run:
    """Read ``run_dir``; raises ReportError naming the path and the fix when there is nothing to report."""
    metrics_path = run_dir / "metrics.jsonl"
    if not run_dir.is_dir():
        raise ReportError(f"run directory {run_dir} does not exist: pass the run_dir of a `spotlight train` run")
    if not metrics_path.is_file() and any(run_dir.glob("*/metrics.jsonl")):
        raise ReportError(f"{run_dir} has no metrics.jsonl but holds run directories: pass {run_dir}/* instead")
    if not metrics_path.is_file():
        raise ReportError(f"{run_dir} has no metrics.jsonl: pass the run_dir of a `spotlight train` run "
                          "(the directory that holds config.yaml and metrics.jsonl)")
    raw_rows, skipped = _read_jsonl(metrics_path)
    by_iteration: dict[int, dict[str, Any]] = {}
    for row in raw_rows:
        iteration = _number(row.get("iteration"))
        if iteration is None:
            skipped += 1
            continue
        by_iteration[int(iteration)] = row  # a resumed run may repeat an iteration: the last write wins
    if not by_iteration:
        raise ReportError(f"{metrics_path} has no metric rows yet: wait for the base model's validation "
                          "(iteration 0), or leave this run out")
    events: list[dict[str, Any]] = []
    if (run_dir / "events.jsonl").is_file():
        events, skipped_events = _read_jsonl(run_dir / "events.jsonl")
        skipped += skipped_events
    grids = sorted((run_dir / "samples").glob("iter-*.png"))
    return Run(name=name or run_dir.name, path=run_dir, rows=[by_iteration[i] for i in sorted(by_iteration)],
               events=events, config=_read_config(run_dir / "config.yaml"),
               latest_grid=grids[-1] if grids else None, skipped_lines=skipped,
               totals=_read_totals(run_dir / "summary.json"))


def _read_config(path: Path) -> dict[str, Any]:
    """The run's config as a mapping; a missing or unreadable config only costs the report its mode column."""
    try:
        config = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return {}
    return config if isinstance(config, dict) else {}


def _read_totals(path: Path) -> dict[str, Any]:
    """summary.json's totals; a run without one (one process, or still running) reports from its metrics."""
    try:
        totals = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return totals if isinstance(totals, dict) else {}


def load_runs(run_dirs: list[Path]) -> list[Run]:
    """Every run, named by its directory — or by parent/directory where two runs share a directory name."""
    names = [path.name for path in run_dirs]
    return [load_run(path, path.name if names.count(path.name) == 1 else f"{path.parent.name}/{path.name}")
            for path in run_dirs]
