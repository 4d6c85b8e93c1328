"""benchmarks/learning/exploration_report.py: the planner's picks, τ and std of runs at 1 + N, and the report's text."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `benchmarks.*`

from benchmarks.learning.exploration_report import (  # noqa: E402
    exploration_stats,
    format_report,
    summarise_exploration,
    summarise_predictions,
)


def records(plans: list[tuple[int, int]], taus: dict[int, float]) -> list[dict]:
    """iteration 0 (validation only), then one record per explored iteration with its plan and any τ."""
    rows = [{"iteration": 0, "val/strict_accuracy": 0.2}]
    for iteration, (n, s) in enumerate(plans, start=1):
        row = {"iteration": iteration, "planner/num_candidates": n, "planner/num_steps": s,
               "planner/spot_devices": 8.0, "explore/selected_reward_std": 0.4}
        if iteration in taus:
            row["staleness/kendall_tau"] = taus[iteration]
        rows.append(row)
    return rows


def run(seed: int, plans: list[tuple[int, int]], taus: dict[int, float], std: float, last: int | None) -> dict:
    return {"mode": "spotlight", "seed": seed, "spot_devices": 8, "group_reward_std": std,
            "exploration": exploration_stats(records(plans, taus), last)}


def test_stats_stop_at_the_target_iteration() -> None:
    stats = exploration_stats(records([(128, 4), (128, 4), (64, 7), (8, 4)], {2: 0.6, 4: 0.1}), last_iteration=3)
    assert stats["explored_iterations"] == 3 and stats["plans"] == [[128, 4, 2], [64, 7, 1]]
    assert stats["kendall_tau"] == [0.6] and stats["candidate_steps_median"] == 512.0


def test_a_run_that_explored_nothing_has_no_stats() -> None:
    assert exploration_stats([{"iteration": 0}, {"iteration": 1, "rollout/group_reward_std": 0.3}], None) is None


def test_runs_pool_their_picks_and_taus_and_compare_with_sync_explore() -> None:
    runs = [run(0, [(128, 4), (128, 4)], {1: 0.5}, 0.40, None), run(1, [(128, 4), (96, 4)], {2: 0.7}, 0.38, None),
            {"mode": "vanilla", "seed": 0, "group_reward_std": 0.29, "exploration": None}]
    summary = summarise_exploration(runs, "spotlight", reference_std=0.376, staleness_floor=0.3, largest_n=128)
    assert summary["most_picked"] == {"num_candidates": 128, "num_steps": 4, "share": 0.75, "largest_n_of_grid": True}
    assert summary["kendall_tau"]["mean"] == 0.6 and summary["kendall_tau"]["checks"] == 2
    assert abs(summary["group_reward_std"] - 0.39) < 1e-12 and summary["above_sync_explore"] is True
    text = format_report(summary, None, {})
    assert "128 x 4 most picked (75%" in text and "the grid's largest N" in text and "0.376: above" in text
    below = summarise_exploration(runs[:1], "spotlight", 0.45, 0.3, 256)
    assert below["above_sync_explore"] is False and "largest" not in format_report(below, None, {})


def test_predictions_are_medians_of_the_runs_and_an_unusable_run_says_why() -> None:
    def prediction(ratio: float, spotlight_s: float) -> dict:
        return {"alpha": 1.19, "alpha_source": "fitted", "vanilla_iterations": 35.0, "stale_kendall_tau": 0.8,
                "stale_kendall_tau_measured": True, "wall_vs_vanilla": ratio,
                "modes": {"vanilla": {"iterations_to_target": 35, "wall_s_to_target": 150.0},
                          "spotlight": {"iterations_to_target": 24, "wall_s_to_target": spotlight_s}}}

    runs = [{"mode": "spotlight", "prediction": prediction(r, s)} for r, s in ((0.5, 75.0), (0.7, 105.0), (0.6, 90.0))]
    summary = summarise_predictions(runs + [{"mode": "spotlight", "prediction": {"error": "too short"}}])
    assert summary["runs"] == 3 and summary["wall_vs_vanilla"] == 0.6
    assert summary["modes"]["spotlight"]["wall_s_to_target"] == 90.0
    unusable = [{"mode": "spotlight", "prediction": {"error": "too short"}}]
    assert summarise_predictions(unusable) == {"error": "too short"}
    assert summarise_predictions([{"mode": "vanilla"}]) is None
