import json
import math

import pytest
from pydantic import ValidationError

from spotlight.config import ConfigError, parse_config
from spotlight.explore.planner import ExplorationPlanner, ExplorePlan, PlannerSection, plan_grid


def make_planner(**overrides: object) -> ExplorationPlanner:
    settings: dict[str, object] = {"num_candidates": (8, 16, 32), "num_steps": (2, 4, 8)}
    settings.update(overrides)
    return ExplorationPlanner(PlannerSection(**settings))


def play(planner: ExplorationPlanner, values: dict[ExplorePlan, float], rounds: int) -> list[ExplorePlan]:
    """Run `rounds` rounds with a generous budget and fixed arm values; return the choices."""
    chosen = []
    for _ in range(rounds):
        plan = planner.choose(budget_s=1e9, num_devices=1, num_prompts=1).plan
        assert plan is not None
        planner.observe_reward(plan, values[plan])
        chosen.append(plan)
    return chosen


def test_plan_grid_is_every_pair_n_major() -> None:
    grid = plan_grid([8, 16], [2, 4, 8])
    assert [(p.num_candidates, p.num_steps) for p in grid] == [
        (8, 2),
        (8, 4),
        (8, 8),
        (16, 2),
        (16, 4),
        (16, 8),
    ]
    assert all(p.sampler == "sde" for p in grid)
    assert grid[4].candidate_steps == 64


def test_bad_plan_values_are_rejected_with_the_field_name() -> None:
    with pytest.raises(ValueError, match="num_steps must be >= 1"):
        ExplorePlan(8, 0)
    with pytest.raises(ValueError, match="sampler"):
        ExplorePlan(8, 2, "euler")  # type: ignore[arg-type]


def test_bad_config_values_name_the_field() -> None:
    with pytest.raises(ValidationError, match="discount"):
        PlannerSection(discount=1.5)
    with pytest.raises(ConfigError, match=r"planner: cost_weight: .*less than or equal to 1"):
        parse_config(PlannerSection, {"cost_weight": 2.0}, source="planner")
    with pytest.raises(ConfigError, match="num_candidates: .*distinct"):
        parse_config(PlannerSection, {"num_candidates": [8, 8]}, source="planner")
    with pytest.raises(ConfigError, match="num_steps: .*at least one"):
        parse_config(PlannerSection, {"num_steps": []}, source="planner")


def test_feasible_arms_are_exactly_those_within_budget() -> None:
    # prior 0.01 s per candidate·step, 10 prompts on 2 devices -> 0.05 s per unit of N·S
    planner = make_planner(prior_cost_per_candidate_step_s=0.01, budget_fraction=1.0)
    decision = planner.choose(budget_s=10.0, num_devices=2, num_prompts=10)
    assert {(p.num_candidates, p.num_steps) for p in decision.feasible_arms} == {
        (n, s) for n in (8, 16, 32) for s in (2, 4, 8) if n * s <= 200
    }
    assert decision.plan in decision.feasible_arms
    assert decision.predicted_time_s == pytest.approx(0.05 * decision.plan.candidate_steps)


def test_budget_fraction_leaves_slack() -> None:
    planner = make_planner(prior_cost_per_candidate_step_s=0.01, budget_fraction=0.5)
    decision = planner.choose(budget_s=10.0, num_devices=2, num_prompts=10)
    assert max(p.candidate_steps for p in decision.feasible_arms) <= 100


def test_unmeasured_arm_cost_comes_from_measured_timings() -> None:
    planner = make_planner(prior_cost_per_candidate_step_s=1.0)
    small = ExplorePlan(8, 2)
    planner.observe_cost(small, seconds=3.2, num_candidates_run=80, num_steps=2)  # 0.02 s per unit
    assert planner.predicted_time(ExplorePlan(32, 8), num_devices=4, num_prompts=10) == pytest.approx(
        0.02 * 256 * 10 / 4
    )


def test_measured_arm_cost_is_an_ema_of_its_own_timings() -> None:
    planner = make_planner(cost_smoothing=0.5)
    arm = ExplorePlan(16, 4)
    planner.observe_cost(arm, seconds=64.0, num_candidates_run=16, num_steps=4)  # 1.0 s per unit
    planner.observe_cost(arm, seconds=192.0, num_candidates_run=16, num_steps=4)  # 3.0 s per unit
    planner.observe_cost(ExplorePlan(8, 2), seconds=160.0, num_candidates_run=8, num_steps=2)  # 10 s
    assert planner.cost_per_candidate_step(arm) == pytest.approx(2.0)
    assert planner.cost_per_candidate_step(ExplorePlan(8, 2)) == pytest.approx(10.0)
    # pooled over all timings in order: 1 -> 2 -> 6
    assert planner.cost_per_candidate_step(ExplorePlan(32, 8)) == pytest.approx(6.0)


def test_nothing_fits_means_no_exploration() -> None:
    planner = make_planner(prior_cost_per_candidate_step_s=1.0)
    decision = planner.choose(budget_s=10.0, num_devices=1, num_prompts=10)  # cheapest needs 160 s
    assert decision.plan is None and decision.feasible_arms == ()
    assert planner.choose(budget_s=1e9, num_devices=0, num_prompts=10).plan is None


def test_without_any_cost_knowledge_the_cheapest_arm_calibrates() -> None:
    planner = make_planner()
    decision = planner.choose(budget_s=100.0, num_devices=2, num_prompts=4)
    assert decision.calibrating and decision.plan == ExplorePlan(8, 2)
    planner.observe_cost(decision.plan, seconds=1.0, num_candidates_run=32, num_steps=2)
    assert not planner.choose(budget_s=100.0, num_devices=2, num_prompts=4).calibrating


def test_monotone_rule_scores_only_the_budget_frontier() -> None:
    # 0.05 s per unit of N·S and a 6.4 s budget: N·S <= 128 fits, frontier = (32, 4) and (16, 8)
    planner = make_planner(prior_cost_per_candidate_step_s=0.01, budget_fraction=1.0)
    decision = planner.choose(budget_s=6.4, num_devices=2, num_prompts=10)
    assert set(decision.scores) == {ExplorePlan(32, 4), ExplorePlan(16, 8)}
    assert len(decision.feasible_arms) == 8  # (32, 8) is the only one that does not fit
    everything = make_planner(prior_cost_per_candidate_step_s=0.01, budget_fraction=1.0, monotone=False)
    assert len(everything.choose(budget_s=6.4, num_devices=2, num_prompts=10).scores) == 8


def test_planner_finds_the_best_arm_of_a_stationary_problem() -> None:
    # no forgetting: a stationary problem is plain UCB's home ground
    planner = make_planner(prior_cost_per_candidate_step_s=1e-9, monotone=False, discount=1.0)
    values = {arm: 1.0 for arm in planner.arms}
    values[ExplorePlan(16, 4)] = 1.5
    late = play(planner, values, 80)[-30:]
    assert late.count(ExplorePlan(16, 4)) >= 24


def test_discounting_follows_a_change_of_the_best_arm() -> None:
    def switches(discount: float) -> int:
        planner = make_planner(
            num_candidates=(16, 32),
            num_steps=(4,),
            monotone=False,
            discount=discount,
            prior_cost_per_candidate_step_s=1e-9,
        )
        first, second = ExplorePlan(16, 4), ExplorePlan(32, 4)
        play(planner, {first: 1.5, second: 1.0}, 100)
        return play(planner, {first: 1.0, second: 1.5}, 40).count(second)

    assert switches(0.9) >= 30  # forgets the old evidence and moves to the new best arm
    assert switches(1.0) < switches(0.9)  # without forgetting it lags behind


def test_cost_weight_prefers_cheaper_arms_of_equal_value() -> None:
    planner = make_planner(prior_cost_per_candidate_step_s=0.01, cost_weight=1.0, exploration=0.05)
    values = {arm: 1.0 for arm in planner.arms}
    late = []
    for _ in range(60):
        decision = planner.choose(budget_s=12.8, num_devices=1, num_prompts=10)  # N·S <= 128 fits
        planner.observe_reward(decision.plan, values[decision.plan])
        late.append(decision.plan)
    assert sum(p.candidate_steps <= 32 for p in late[-20:]) >= 15


def test_rescaling_all_rewards_does_not_change_decisions() -> None:
    def run(scale: float) -> list[ExplorePlan]:
        planner = make_planner(prior_cost_per_candidate_step_s=1e-9, monotone=False, seed=3)
        values = {arm: scale * (1.0 + 0.1 * i) for i, arm in enumerate(planner.arms)}
        return play(planner, values, 40)

    assert run(1.0) == run(0.001)


def test_same_seed_gives_the_same_decisions_and_state_round_trips() -> None:
    values = {arm: 1.0 + 0.05 * (i % 4) for i, arm in enumerate(make_planner().arms)}
    first = make_planner(prior_cost_per_candidate_step_s=1e-9, seed=7)
    second = make_planner(prior_cost_per_candidate_step_s=1e-9, seed=7)
    assert play(first, values, 15) == play(second, values, 15)
    restored = make_planner(prior_cost_per_candidate_step_s=1e-9, seed=99)
    restored.load_state_dict(json.loads(json.dumps(first.state_dict())))
    assert play(restored, values, 15) == play(first, values, 15)


def test_state_from_another_grid_is_rejected() -> None:
    state = make_planner().state_dict()
    with pytest.raises(ValueError, match="different plan grid"):
        make_planner(num_candidates=(8, 64)).load_state_dict(state)


def test_non_finite_reward_is_ignored() -> None:
    planner = make_planner()
    before = planner.state_dict()
    assert planner.observe_reward(ExplorePlan(8, 2), math.nan) is False
    assert planner.state_dict() == before
    assert planner.observe_reward(ExplorePlan(8, 2), 0.3) is True


def test_plans_outside_the_grid_and_bad_rounds_are_rejected() -> None:
    planner = make_planner()
    with pytest.raises(ValueError, match="not in the planner's grid"):
        planner.observe_reward(ExplorePlan(12, 2), 0.1)
    with pytest.raises(ValueError, match="budget_s"):
        planner.choose(budget_s=math.inf, num_devices=1, num_prompts=1)
    with pytest.raises(ValueError, match="num_prompts"):
        planner.choose(budget_s=1.0, num_devices=1, num_prompts=0)
    with pytest.raises(ValueError, match="seconds"):
        planner.observe_cost(ExplorePlan(8, 2), seconds=-1.0, num_candidates_run=8, num_steps=2)


def test_a_measured_prior_sizes_the_first_round_and_gives_way_to_the_first_timing():
    planner = ExplorationPlanner(PlannerSection(num_candidates=(8, 16, 32), num_steps=(4, 7)))
    assert planner.choose(budget_s=10.0, num_devices=1, num_prompts=16).calibrating
    planner.observe_prior(0.004)  # 4 ms per candidate-step: 16 prompts x 32 x 7 take 14.3 s, 16 x 32 x 4 8.2 s
    decision = planner.choose(budget_s=10.0, num_devices=1, num_prompts=16)
    assert not decision.calibrating
    assert ExplorePlan(32, 4) in decision.feasible_arms and ExplorePlan(32, 7) not in decision.feasible_arms
    assert decision.predicted_time_s <= 0.95 * 10.0
    planner.observe_cost(decision.plan, seconds=1.0, num_candidates_run=100, num_steps=1)
    unmeasured = planner.cost_per_candidate_step(ExplorePlan(8, 7))  # the prior blended with the timing
    assert unmeasured == pytest.approx(0.7 * 0.004 + 0.3 * 0.01)
    planner.observe_prior(1.0)  # once an exploration is timed, a prior changes nothing
    assert planner.cost_per_candidate_step(ExplorePlan(8, 7)) == unmeasured


def test_a_preview_depth_that_predicts_badly_is_left_out_until_only_it_fits() -> None:
    planner = make_planner(prior_cost_per_candidate_step_s=1.0, min_fidelity_ratio=0.5)
    assert planner.unfaithful_steps() == ()  # nothing measured: every depth may be tried
    planner.observe_fidelity(ExplorePlan(32, 2), 0.1)  # the shallow preview ranks seeds by noise
    planner.observe_fidelity(ExplorePlan(8, 8), 0.8)
    assert not planner.observe_fidelity(ExplorePlan(8, 4), math.nan)  # no rollout varied: nothing learnt
    assert planner.unfaithful_steps() == (2,)
    decision = planner.choose(budget_s=1e9, num_devices=1, num_prompts=1)
    assert decision.unfaithful_steps == (2,) and all(arm.num_steps != 2 for arm in decision.feasible_arms)
    only_shallow = planner.choose(budget_s=17 / 0.95, num_devices=1, num_prompts=1)  # N=8, S=2 (16 s) fits alone
    assert only_shallow.plan == ExplorePlan(8, 2)  # better a shallow preview than random seeds
    restored = make_planner(prior_cost_per_candidate_step_s=1.0)
    restored.load_state_dict(json.loads(json.dumps(planner.state_dict())))
    assert restored.fidelity() == planner.fidelity() and restored.unfaithful_steps() == (2,)


def test_a_left_out_depth_comes_back_when_the_others_stop_predicting() -> None:
    planner = make_planner(min_fidelity_ratio=0.5, discount=0.8)
    planner.observe_fidelity(ExplorePlan(8, 2), 0.2)
    planner.observe_fidelity(ExplorePlan(8, 8), 0.9)
    assert planner.unfaithful_steps() == (2,)
    for _ in range(5):
        planner.observe_fidelity(ExplorePlan(8, 8), 0.3)  # the deep preview's ranking decays (drift)
    assert planner.unfaithful_steps() == ()
    assert make_planner(min_fidelity_ratio=0.0).unfaithful_steps() == ()
