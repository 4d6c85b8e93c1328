"""What the training loop hands the trackers, kept out of the loop itself: the hub it opens, a validation
grid's caption and the run's final summary."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from spotlight.loop.evaluation import validated, validation_score
from spotlight.tracking.hub import TrackerHub

__all__ = ["final_summary", "grid_caption", "open_trackers"]


def open_trackers(config: Any, run_dir: Path, resume: bool, start_iteration: int) -> TrackerHub | None:
    """The run's experiment trackers (`log.trackers`), fed from a background thread; None without any."""
    if not config.log.trackers:
        return None
    first_step = start_iteration + 1 if resume else 0  # a resumed run logs from its checkpoint on
    return TrackerHub(config.log, run_dir, config.model_dump(mode="json"), (run_dir / "config.yaml").read_text(),
                      first_step, config.device)


def grid_caption(result: Any, shown: list[int], columns: int) -> str:
    """A validation grid's caption: each row's prompt and its samples' rewards, as a tracker shows it."""
    rows = []
    for first in range(0, len(shown), columns):
        row = shown[first:first + columns]
        rewards = "" if result.rewards is None else \
            " (" + ", ".join(f"{float(result.rewards[i]):.3f}" for i in row) + ")"
        rows.append(f"{result.prompts[row[0]]}{rewards}")
    return "; ".join(rows)


def final_summary(run_dir: Path, history: list[dict[str, Any]], stopped: str | None) -> dict[str, Any]:
    """The run's summary for the trackers: summary.json's totals (a Ray run's bill and utilisation), the best
    and final validation, and why it stopped early, if it did."""
    summary: dict[str, Any] = {}
    totals = run_dir / "summary.json"
    if totals.is_file():
        summary.update(json.loads(totals.read_text()))
    runs = validated(history)
    if runs:
        best = max(runs, key=validation_score)
        summary.update({"best/iteration": best["iteration"], "best/score": validation_score(best),
                        "final/iteration": runs[-1]["iteration"], "final/score": validation_score(runs[-1])})
    if stopped is not None:
        summary["stopped"] = stopped
    return summary
