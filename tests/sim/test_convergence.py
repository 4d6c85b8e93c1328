"""Tests for spotlight.sim.convergence: the power-law fit, the measured-file reader and the signal model."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest

from spotlight.explore.planner import ExplorePlan
from spotlight.sim.convergence import (
    ConvergenceModel,
    ConvergenceSection,
    SignalModel,
    SignalSection,
    fit_convergence,
    load_measured_points,
    resolve_convergence,
)


def law(std: float, alpha: float = 1.7, reference_std: float = 0.2, reference_iterations: float = 50.0) -> float:
    return reference_iterations * (std / reference_std) ** (-alpha)


def test_fit_recovers_a_noise_free_power_law_exactly() -> None:
    model = fit_convergence([(std, law(std)) for std in (0.1, 0.15, 0.2, 0.3)])
    assert model.alpha == pytest.approx(1.7, rel=1e-12)
    assert model.iterations_to_target(0.2) == pytest.approx(50.0, rel=1e-12)
    assert model.iterations_to_target(0.4) == pytest.approx(50.0 * 2**-1.7, rel=1e-12)
    assert model.r_squared == pytest.approx(1.0)
    assert not model.alpha_assumed


def test_fit_recovers_the_exponent_through_multiplicative_noise() -> None:
    rng = np.random.default_rng(0)
    stds = rng.uniform(0.05, 0.4, size=60)
    points = [(s, law(s) * math.exp(rng.normal(0.0, 0.1))) for s in stds]
    model = fit_convergence(points)
    assert model.alpha == pytest.approx(1.7, abs=0.1)
    assert 0.8 < model.r_squared < 1.0


def test_one_point_falls_back_to_alpha_one_through_that_point() -> None:
    model = fit_convergence([(0.25, 40.0)])
    assert model.alpha_assumed and model.alpha == 1.0
    assert model.iterations_to_target(0.25) == pytest.approx(40.0)
    assert model.iterations_to_target(0.5) == pytest.approx(20.0)


def test_points_at_one_std_cannot_identify_the_exponent() -> None:
    model = fit_convergence([(0.2, 30.0), (0.2, 50.0)])
    assert model.alpha_assumed and model.alpha == 1.0
    assert model.reference_iterations == pytest.approx(math.sqrt(30.0 * 50.0))


def test_runs_that_never_reached_the_target_are_dropped_and_counted() -> None:
    model = fit_convergence([(0.1, law(0.1)), (0.3, law(0.3)), (0.05, math.inf), (0.0, 10.0)])
    assert model.dropped == 2 and model.num_points == 2
    assert model.alpha == pytest.approx(1.7, rel=1e-12)


def test_no_usable_point_is_an_error_naming_the_cause() -> None:
    with pytest.raises(ValueError, match="no usable point"):
        fit_convergence([(0.1, math.inf)])


def test_speedup_is_the_std_ratio_to_the_power_alpha() -> None:
    model = ConvergenceModel(alpha=2.0, reference_std=0.1, reference_iterations=100.0)
    assert model.speedup(0.3, 0.15) == pytest.approx(4.0)
    assert model.speedup(0.0, 0.0) == 1.0
    assert model.iterations_to_target(0.0) == math.inf


def write_benchmark(path: Path, modes: dict[str, tuple[list[float], list[float]]]) -> Path:
    payload = {"benchmark": "exploration_convergence", "modes": {
        mode: {"group_reward_std": {"values": stds}, "iterations_to_target": {"values": iterations}}
        for mode, (stds, iterations) in modes.items()
    }}
    path.write_text(json.dumps(payload))  # inf is written as Infinity, as the benchmark does
    return path


def test_measured_points_pair_each_runs_std_with_its_iterations(tmp_path: Path) -> None:
    path = write_benchmark(tmp_path / "r.json", {
        "vanilla": ([0.10, 0.12], [40.0, math.inf]),
        "sync-explore": ([0.20, 0.21], [20.0, 18.0]),
    })
    points = load_measured_points(path)
    assert [(p.mode, p.group_reward_std, p.iterations_to_target) for p in points] == [
        ("vanilla", 0.10, 40.0), ("vanilla", 0.12, math.inf),
        ("sync-explore", 0.20, 20.0), ("sync-explore", 0.21, 18.0),
    ]
    assert fit_convergence(points).dropped == 1


def test_measured_lists_of_different_lengths_are_refused(tmp_path: Path) -> None:
    path = write_benchmark(tmp_path / "r.json", {"vanilla": ([0.1, 0.2], [40.0])})
    with pytest.raises(ValueError, match=r"modes.vanilla: 2 group_reward_std values but 1"):
        load_measured_points(path)


def test_a_missing_measured_file_points_at_the_benchmark(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="time_to_target.py"):
        load_measured_points(tmp_path / "absent.json")


def test_alpha_comes_from_the_config_then_the_measured_file_then_the_assumption(tmp_path: Path) -> None:
    path = write_benchmark(tmp_path / "r.json", {"a": ([0.1, 0.2, 0.4], [law(0.1), law(0.2), law(0.4)])})
    assert resolve_convergence(ConvergenceSection(alpha=0.5, measured=str(path))) == (0.5, "given")
    alpha, source = resolve_convergence(ConvergenceSection(measured=str(path)))
    assert alpha == pytest.approx(1.7) and "fitted to 3 runs" in source
    assert resolve_convergence(ConvergenceSection())[0] == 1.0


# --- the signal model -------------------------------------------------------------------------


def test_random_seeds_give_the_random_std() -> None:
    signal = SignalModel(SignalSection(), rollout_steps=10, seed=0).draw(0.0, 16, 8, None, 0, stale=False)
    assert signal.group_std == signal.random_std
    assert math.isnan(signal.explored_variance)


def test_exploring_exactly_group_size_candidates_keeps_all_of_them() -> None:
    model = SignalModel(SignalSection(), rollout_steps=10, seed=0)
    signal = model.draw(0.0, 16, 8, ExplorePlan(8, 2), 16, stale=True)
    assert signal.group_std == pytest.approx(signal.random_std, rel=1e-12)


def test_a_faithful_preview_finds_the_max_variance_subset() -> None:
    # τ = 1 and S = T: the preview is the rollout, so the chosen group is the best of all C(6, 3).
    config = SignalSection(one_step_kendall_tau=1.0, stale_kendall_tau=1.0)
    signal = SignalModel(config, rollout_steps=4, seed=3).draw(0.0, 5, 3, ExplorePlan(6, 4), 5, stale=False)
    replay = np.random.default_rng(3)  # the model's draws: prompt logits, then seed logits
    prompt = replay.normal(0.0, 1.5, size=(5, 1))
    rewards = 1.0 / (1.0 + np.exp(-(prompt + replay.normal(0.0, 1.0, size=(5, 6)))))
    best = [max(np.var(row[list(c)]) for c in itertools.combinations(range(6), 3)) for row in rewards]
    assert signal.group_variance == pytest.approx(float(np.mean(best)), rel=1e-9)


def test_preview_error_vanishes_at_full_steps_and_matches_kendall_tau_at_one_step() -> None:
    model = SignalModel(SignalSection(one_step_kendall_tau=0.3, stale_kendall_tau=0.8), rollout_steps=10, seed=0)
    assert model.preview_error_std(10, stale=False) == 0.0
    rho = math.sin(math.pi * 0.3 / 2)  # 0.45399
    assert model.preview_error_std(1, stale=False) == pytest.approx(math.sqrt(1 / rho**2 - 1), rel=1e-12)
    stale_rho = math.sin(math.pi * 0.8 / 2)
    assert model.preview_error_std(10, stale=True) == pytest.approx(math.sqrt(1 / stale_rho**2 - 1), rel=1e-12)


def kendall_tau(a: np.ndarray, b: np.ndarray) -> float:
    i, j = np.triu_indices(len(a), k=1)
    return float(np.mean(np.sign(a[i] - a[j]) * np.sign(b[i] - b[j])))


def test_preview_error_reproduces_the_configured_kendall_tau() -> None:
    # Second path: draw seed logits and previews with the model's error and measure τ directly.
    model = SignalModel(SignalSection(one_step_kendall_tau=0.3), rollout_steps=10, seed=0)
    rng = np.random.default_rng(1)
    truth = rng.normal(size=1500)
    preview = truth + rng.normal(size=1500) * model.preview_error_std(1, stale=False)
    assert kendall_tau(truth, preview) == pytest.approx(0.3, abs=0.03)


def test_more_candidates_and_more_steps_give_more_signal() -> None:
    def mean_stds(plan: ExplorePlan) -> tuple[float, float]:
        model = SignalModel(SignalSection(), rollout_steps=10, seed=0)
        draws = [model.draw(0.0, 32, 8, plan, 32, stale=True) for _ in range(20)]
        return float(np.mean([d.group_std for d in draws])), float(np.mean([d.random_std for d in draws]))

    small, random = mean_stds(ExplorePlan(16, 2))
    assert small > 1.1 * random
    assert mean_stds(ExplorePlan(64, 2))[0] > small
    assert mean_stds(ExplorePlan(64, 8))[0] > mean_stds(ExplorePlan(64, 2))[0]


def test_a_plan_smaller_than_the_group_is_refused() -> None:
    with pytest.raises(ValueError, match="fewer candidates than the group size"):
        SignalModel(SignalSection(), 10, 0).draw(0.0, 4, 8, ExplorePlan(4, 2), 4, stale=False)
