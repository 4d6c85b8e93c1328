"""benchmarks/learning/decomposition.py: wall time to target factors into iterations × seconds per iteration,
per phase."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `benchmarks.*`

from benchmarks.learning.decomposition import affordable_candidates, decompose, format_table, phase_seconds  # noqa: E402


def records(iteration_s: float, rollout: float, update: float, explore: float = 0.0, count: int = 6) -> list[dict]:
    rows = [{"iteration": 0, "time/wall_s": 0.0}]
    for i in range(1, count + 1):
        rows.append({"iteration": i, "time/wall_s": i * iteration_s, "time/rollout_s": rollout,
                     "time/train_s": update, "time/explore_s": explore, "rollout/zero_std_groups": 0.0})
    return rows


def test_phases_are_means_up_to_the_target_and_other_is_the_rest():
    rows = records(iteration_s=5.0, rollout=1.5, update=3.0)
    rows[6]["time/wall_s"] += 10.0  # a slow iteration after the target is not charged
    phases = phase_seconds(rows, last_iteration=4)
    assert phases["iterations"] == 4
    assert phases["iteration_s"] == pytest.approx(5.0)
    assert phases["other"] == pytest.approx(0.5)
    assert phase_seconds(rows, None)["iteration_s"] == pytest.approx(40.0 / 6)


def outcome(mode: str, iterations: int | None, phases: dict, candidates: float | None = None) -> dict:
    return {"mode": mode, "iterations_to_target": iterations, "phases": phases, "zero_std_groups": 0.1,
            "explore_candidates": candidates}


def test_ratios_to_vanilla_multiply_to_the_wall_ratio_and_the_ceiling_uses_vanillas_seconds():
    vanilla = phase_seconds(records(4.0, 1.5, 2.5), None)
    sync = phase_seconds(records(6.0, 1.5, 2.5, explore=2.0), None)
    spot = phase_seconds(records(4.4, 1.5, 2.6), None)
    outcomes = [outcome("vanilla", 40, vanilla), outcome("sync-explore", 20, sync, candidates=16),
                outcome("spotlight", 30, spot)]
    table = decompose(outcomes, ["vanilla", "sync-explore", "spotlight"])
    row = table["spotlight"]
    assert row["iterations_vs_vanilla"] == pytest.approx(0.75)
    assert row["iteration_s_vs_vanilla"] == pytest.approx(1.1)
    assert row["update_vs_vanilla"] == pytest.approx(2.6 / 2.5)
    assert table["free exploration"]["iterations_vs_vanilla"] == pytest.approx(0.5)
    assert table["free exploration"]["iteration_s"] == pytest.approx(4.0)
    bought = affordable_candidates(outcomes, prompts=16)
    assert bought["candidate_s"] == pytest.approx(2.0 / (16 * 16))
    assert bought["candidates_per_prompt"] == pytest.approx(2.6 / (16 * 2.0 / 256))
    assert "free exploration" in format_table(table)


def test_a_mode_whose_median_run_missed_the_target_has_no_median():
    phases = phase_seconds(records(4.0, 1.5, 2.5), None)
    table = decompose([outcome("vanilla", 10, phases), outcome("spotlight", None, phases),
                       outcome("spotlight", None, phases), outcome("spotlight", 8, phases)],
                      ["vanilla", "spotlight"])
    assert table["spotlight"]["iterations"] is None and table["spotlight"]["iterations_vs_vanilla"] is None
