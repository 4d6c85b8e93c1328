"""Tests for spotlight.sim.simulator: phase times and costs by hand, preemption overheads, the runtime
planner's inputs, the modes against each other, configuration errors and speed."""

from __future__ import annotations

import math
import time

import pytest
from small_sims import STEADY, small, trace_of

from spotlight.config import ConfigError, parse_config
from spotlight.explore.planner import Decision, ExplorationPlanner
from spotlight.market.traces import poisson_trace
from spotlight.modes import Mode
from spotlight.sim.sim_config import SimConfig
from spotlight.sim.simulator import simulate
from spotlight.sim.spot_timeline import SpotTimeline
from spotlight.sim.workload import IterationTimes

# Independent of the workload module: Qwen-Image at 1280², one guided step = 2 forwards of
# 24·60·3072²·6528 + 4·60·6528²·3072 FLOPs at 40% of 989 TFLOP/s (test_workload checks the sum).
FLOPS = 88_712_549_498_880 + 31_419_027_947_520
STEP_S = 2 * FLOPS / (0.40 * 989e12)  # 0.607 s, one device, one sample
TRAIN_SAMPLE_S = 10 * 4 * 2 * FLOPS / (0.40 * 989e12)  # 10 steps · (fwd+bwd + reference) · CFG
ON_DEMAND, SPOT = 55.04 / 8, 14.24 / 8  # p5.48xlarge $/GPU-hour


# --- phase times and costs by hand ----------------------------------------------------------------


def test_vanilla_time_and_cost_to_target_by_hand() -> None:
    result = simulate(small("vanilla", iterations=5), trace=STEADY)
    rollout = 16 * 10 * STEP_S / 4  # 16 samples of 10 steps on 4 devices, 4 whole rounds
    train = 16 * TRAIN_SAMPLE_S / 4 + 2 * 3 / 4 * 40e9 / 40e9  # + ring all-reduce of 40 GB
    assert result.iterations_to_target == 5
    assert result.time_to_target_s == pytest.approx(5 * (rollout + train), rel=1e-9)
    assert result.dollars_to_target == pytest.approx(4 * ON_DEMAND * result.time_to_target_s / 3600, rel=1e-9)
    assert result.usage["spot"].rented_device_s == 0.0  # vanilla rents no spot device
    assert result.usage["on_demand"].utilisation == pytest.approx(1.0)


def test_spot_devices_share_the_rollout_and_idle_through_training() -> None:
    result = simulate(small("spot-rollout", spot=4, iterations=3), trace=STEADY)
    first = result.timeline[0]
    assert first.rollout_s == pytest.approx(16 * 10 * STEP_S / 8, rel=1e-9)  # 8 devices, 2 whole rounds
    assert first.broadcast_s == pytest.approx(1.0)  # 40 GB over 40 GB/s
    assert first.end_s == pytest.approx(first.rollout_s + first.train_s + 1.0, rel=1e-12)
    spot = result.usage["spot"]
    assert spot.rented_device_s == pytest.approx(4 * result.simulated_s, rel=1e-9)
    assert spot.device_seconds["idle"] == pytest.approx(4 * 3 * first.train_s, rel=1e-9)
    assert spot.dollars == pytest.approx(4 * SPOT * result.simulated_s / 3600, rel=1e-9)
    for pool in ("on_demand", "spot"):
        assert sum(result.usage[pool].shares().values()) == pytest.approx(1.0)


def test_a_rollout_is_padded_to_whole_rounds_of_the_groups() -> None:
    # 16 requests on 4 + 2 = 6 groups take 3 rounds: 18 requests' worth of time.
    result = simulate(small("spot-rollout", spot=2, iterations=1), trace=STEADY)
    assert result.timeline[0].rollout_s == pytest.approx(18 * 10 * STEP_S / 6, rel=1e-9)


# --- preemptions --------------------------------------------------------------------------------

PREEMPTED_AT_5S = trace_of([(0, "add", "a"), (0, "add", "b"), (5, "remove", "b")], 1e6)


@pytest.mark.parametrize(("notice_s", "lost_s"), [(120.0, STEP_S), (0.0, 0.5 * 10 * STEP_S)])
def test_a_notice_saves_all_but_one_step_of_the_preempted_request(notice_s: float, lost_s: float) -> None:
    config = small("spot-rollout", spot=2, iterations=1, notice_s=notice_s)
    result = simulate(config, trace=PREEMPTED_AT_5S)
    spot = result.usage["spot"]
    assert spot.device_seconds["lost"] == pytest.approx(lost_s, rel=1e-9)
    assert spot.device_seconds["reconfiguring"] == pytest.approx(0.5)  # one group re-forms elastically
    # 6 devices for 5 s, then 5 devices carry the 180 padded sample-steps plus the overheads.
    expected = 5 + (180 * STEP_S + lost_s + 0.5 - 6 * 5) / 5
    assert result.timeline[0].rollout_s == pytest.approx(expected, rel=1e-9)


def test_cold_recovery_stalls_the_whole_pool_for_the_restart() -> None:
    config = small("spot-rollout", spot=2, iterations=1, recovery="cold", cold_restart_s=120.0)
    result = simulate(config, trace=PREEMPTED_AT_5S)
    assert result.usage["on_demand"].device_seconds["reconfiguring"] == pytest.approx(4 * 120.0)
    assert result.usage["spot"].device_seconds["reconfiguring"] == pytest.approx(1 * 120.0)
    expected = 5 + (180 * STEP_S + STEP_S + 5 * 120.0 - 6 * 5) / 5
    assert result.timeline[0].rollout_s == pytest.approx(expected, rel=1e-9)


def test_cold_restarts_longer_than_the_gaps_between_preemptions_never_reach_the_target() -> None:
    churn = poisson_trace(8, mean_lifetime_s=10.0, mean_restart_s=10.0, duration_s=3600.0, seed=0)
    result = simulate(small("spot-rollout", spot=8, recovery="cold", cold_restart_s=600.0), trace=churn)
    assert not result.reached and result.time_to_target_s == math.inf


# --- exploration and the runtime planner ----------------------------------------------------------------


def record_planner_choices(monkeypatch: pytest.MonkeyPatch) -> list[tuple[float, int, int]]:
    """(budget_s, num_devices, num_prompts) of every planner choice the simulator makes from now on."""
    calls: list[tuple[float, int, int]] = []
    original = ExplorationPlanner.choose

    def recording(self: ExplorationPlanner, budget_s: float, num_devices: int, num_prompts: int) -> Decision:
        calls.append((budget_s, num_devices, num_prompts))
        return original(self, budget_s, num_devices, num_prompts)

    monkeypatch.setattr(ExplorationPlanner, "choose", recording)
    return calls


def test_the_planner_gets_the_predicted_training_time_and_the_live_spot_devices(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = record_planner_choices(monkeypatch)
    spotlight = simulate(small("spotlight", spot=2, iterations=3), trace=STEADY)
    assert calls == [(spotlight.timeline[0].train_s, 2, 4)] * len(spotlight.timeline)
    calls.clear()
    simulate(small("sync-explore", spot=2, iterations=3), trace=STEADY)
    assert {devices for _, devices, _ in calls} == {4 + 2}  # on every device, on the critical path


def test_spotlight_exploration_hides_inside_training() -> None:
    result = simulate(small("spotlight", spot=4, iterations=8), trace=STEADY)
    assert all(0 < r.explore_s <= r.train_s for r in result.timeline)
    assert result.timeline[0].plan is None  # nothing was explored before the first rollout
    assert all(r.plan is not None and r.explored_prompts == 4 for r in result.timeline[1:])
    assert all(r.sync_explore_s == 0.0 for r in result.timeline)
    assert result.usage["spot"].device_seconds["explore"] > 0


def test_exploration_completes_only_what_fits_before_the_spot_pool_vanishes() -> None:
    vanishing = trace_of([(0, "add", "a"), (0, "add", "b"), (22, "remove", "a"), (22, "remove", "b")], 1e6)
    result = simulate(small("spotlight", spot=2, iterations=50), trace=vanishing)
    first, second = result.timeline[0], result.timeline[1]
    rollout_end = 18 * 10 * STEP_S / 6  # 18.2 s, before the preemption; 3 rounds of 6 groups
    assert first.end_s - first.broadcast_s - first.train_s == pytest.approx(rollout_end, rel=1e-9)
    # The first plan calibrates on the cheapest arm, (4, 2): 4·2·4 = 32 sample-steps; the two spot
    # devices work until 22 s and lose one step each (notice) plus 0.5 s re-forming each group.
    done = (2 * (22 - rollout_end) - 2 * STEP_S - 2 * 0.5) / STEP_S
    assert second.explored_prompts == math.floor(4 * done / 32)
    assert 0 < second.explored_prompts < 4
    assert all(r.plan is None for r in result.timeline[2:])  # no spot device is left


def test_exploration_pays_for_itself_in_iterations() -> None:
    vanilla = simulate(small("vanilla", iterations=20), trace=STEADY)
    spot_rollout = simulate(small("spot-rollout", spot=4, iterations=20), trace=STEADY)
    spotlight = simulate(small("spotlight", spot=4, iterations=20), trace=STEADY)
    assert vanilla.iterations_to_target == spot_rollout.iterations_to_target == 20
    assert spotlight.iterations_to_target is not None and spotlight.iterations_to_target < 20
    assert spot_rollout.time_to_target_s < vanilla.time_to_target_s  # more rollout devices
    assert spotlight.time_to_target_s < spot_rollout.time_to_target_s


def test_running_past_the_target_when_asked() -> None:
    config = small("vanilla", iterations=2).model_copy(
        update={"loop": small("vanilla").loop.model_copy(update={"max_iterations": 5, "stop_at_target": False})}
    )
    result = simulate(config, trace=STEADY)
    assert result.iterations_run == 5 and result.iterations_to_target == 2


# --- configuration errors ----------------------------------------------------------------------------


def test_plans_smaller_than_the_group_are_refused_at_load() -> None:
    with pytest.raises(ConfigError, match=r"planner.num_candidates must all be >= loop.group_size \(8 < 16\)"):
        parse_config(SimConfig, {"planner": {"num_candidates": [8, 16]}})


def test_a_mode_without_a_cluster_is_refused_at_load_and_at_run() -> None:
    with pytest.raises(ConfigError, match=r"mode stale-explore is not simulated .*vanilla, spot-rollout"):
        parse_config(SimConfig, {"mode": "stale-explore"})
    bypassed = small("vanilla").model_copy(update={"mode": Mode.STALE_EXPLORE})  # model_copy skips validators
    with pytest.raises(ConfigError, match=r"mode stale-explore is not simulated"):
        simulate(bypassed, trace=STEADY)


def test_unknown_instance_and_missing_price_name_the_field() -> None:
    with pytest.raises(ConfigError, match=r"cluster.spot_instance: unknown instance 'p9'; known: "):
        simulate(small("spotlight", spot_instance="p9"), trace=STEADY)
    with pytest.raises(ConfigError, match=r"cluster.on_demand_instance: .*no on_demand price"):
        simulate(small("vanilla", on_demand_instance="p5.4xlarge"), trace=STEADY)


def test_an_sp_group_larger_than_the_on_demand_pool_is_refused() -> None:
    config = small("vanilla", on_demand=2)
    config = config.model_copy(update={"workload": config.workload.model_copy(update={"sp_degree": 4})})
    with pytest.raises(ConfigError, match=r"on_demand_devices \(2\) is below workload.sp_degree \(4\)"):
        simulate(config, trace=STEADY)


# --- speed --------------------------------------------------------------------------------------------


def test_a_1024_gpu_cluster_runs_100_iterations_of_a_12_hour_trace_in_seconds() -> None:
    trace = poisson_trace(64, mean_lifetime_s=3 * 3600.0, mean_restart_s=1800.0, duration_s=12 * 3600.0, seed=0)
    config = parse_config(SimConfig, {
        "cluster": {"on_demand_devices": 512, "spot_devices": 512},
        "workload": {"sp_degree": 4},
        "loop": {"prompts_per_iteration": 256, "max_iterations": 100, "stop_at_target": False},
    })
    started = time.perf_counter()
    result = simulate(config, trace=trace)
    elapsed = time.perf_counter() - started
    assert result.iterations_run == 100
    assert elapsed < 15.0  # the target is 5 s (benchmarks/sim/simulate_paper_scale.py measures it); CI is slower


# --- measured step times (the runtime's local run) ----------------------------------------------


def measured(mode: str, spot: int, explore_sample_step_s: float | None = None) -> SimConfig:
    """1 on-demand device, 4 prompts × 4 samples × 10 steps, one prompt's group per request, measured times."""
    return parse_config(SimConfig, {
        "mode": mode,
        "cluster": {"on_demand_devices": 1, "spot_devices": spot, "notice_s": 2.0},
        "workload": {"sp_degree": 1, "batch_size": 4, "rollout_steps": 10, "measured": {
            "on_demand_sample_step_s": 0.01, "spot_sample_step_s": 0.02, "explore_sample_step_s": explore_sample_step_s,
            "train_s": 2.0, "broadcast_s": 0.5}},
        "loop": {"prompts_per_iteration": 4, "group_size": 4, "max_iterations": 3, "stop_at_target": False},
        "planner": {"num_candidates": [4, 8], "num_steps": [2, 4]},
    })


def test_measured_times_replace_the_derived_ones() -> None:
    # vanilla: 16 samples × 10 steps × 0.01 s on the one device, then the measured 2 s update.
    result = simulate(measured("vanilla", spot=0), trace=STEADY)
    first = result.timeline[0]
    assert first.rollout_s == pytest.approx(1.6) and first.train_s == 2.0 and first.end_s == pytest.approx(3.6)
    # spot-rollout, one spot device at 0.02 s: 4 requests over 2 devices = 2 whole rounds, so the
    # 160 sample-steps run at 1/0.01 + 1/0.02 = 150 a second; then the update and the 0.5 s broadcast.
    result = simulate(measured("spot-rollout", spot=1), trace=STEADY)
    first = result.timeline[0]
    assert first.rollout_s == pytest.approx(160 / 150)
    assert first.end_s == pytest.approx(160 / 150 + 2.0 + 0.5)
    # two spot devices: 3 groups, so 4 requests pad to 2 rounds of 3 (240 sample-steps) at 100 + 2·50 a second.
    assert simulate(measured("spot-rollout", spot=2), trace=STEADY).timeline[0].rollout_s == pytest.approx(240 / 200)


def test_a_joining_device_is_unusable_until_ready_and_counts_only_inside_the_phase() -> None:
    # One device joins at 2 (a period of 20) and again at 22: ready 3 s later, each join is
    # 3 device-s of waiting, split between the phases it overlaps.
    spot = SpotTimeline(trace_of([(2.0, "add", "a")], 20.0), spot_devices=1, time_scale=1.0, sp_degree=1)
    assert spot.joining_device_seconds(0.0, 20.0, 3.0) == pytest.approx(3.0)
    assert spot.joining_device_seconds(3.0, 4.0, 3.0) == pytest.approx(1.0)  # [2, 5] ∩ [3, 4]
    assert spot.joining_device_seconds(4.0, 30.0, 3.0) == pytest.approx(1.0 + 3.0)  # [4, 5] and [22, 25]
    assert spot.joining_device_seconds(5.0, 22.0, 3.0) == 0.0


@pytest.mark.parametrize(("weight_copy_s", "rollout_s"), [(10.0, 1.6), (0.5, 1.4)])
def test_a_device_joining_mid_rollout_adds_capacity_only_once_it_holds_the_weights(
    weight_copy_s: float, rollout_s: float
) -> None:
    # spot-rollout, no spot device at the start: 4 requests on the on-demand device alone, 160
    # sample-steps at 100 a second = 1.6 s. A spot device (50 a second) joins at 0.5 and is ready at
    # 0.5 + weight_copy_s. With 10 s it is never ready in the rollout: 1.6 s, not the 160 + 10·50
    # sample-steps of a whole copy charged to it (4.57 s). With 0.5 s it helps from 1.0 on:
    # 100·t + 50·(t − 1.0) = 160 → t = 1.4. Either way it is billed from 0.5.
    config = measured("spot-rollout", spot=1)
    times = config.workload.measured.model_copy(update={"weight_copy_s": weight_copy_s})
    config = config.model_copy(update={
        "workload": config.workload.model_copy(update={"measured": times}),
        "cluster": config.cluster.model_copy(update={"elastic_reconfigure_s": 0.0})})
    result = simulate(config, trace=trace_of([(0.5, "add", "a")], 1e6))
    first = result.timeline[0]
    assert first.rollout_s == pytest.approx(rollout_s)
    assert first.end_s == pytest.approx(rollout_s + 2.0 + 0.5)
    assert result.usage["spot"].rented_device_s == pytest.approx(result.simulated_s - 0.5)


def test_measured_exploration_cost_scales_the_exploration_time() -> None:
    # spotlight's first round calibrates with the cheapest arm, N=4 × S=2 × 4 prompts = 32 candidate-steps
    # on 2 spot devices: 32 · 0.02 / 2 = 0.32 s as a rollout step costs, twice that at 0.04 s a step.
    same = simulate(measured("spotlight", spot=2), trace=STEADY).timeline[0]
    costly = simulate(measured("spotlight", spot=2, explore_sample_step_s=0.04), trace=STEADY).timeline[0]
    assert same.explore_s == pytest.approx(0.32)
    assert costly.explore_s == pytest.approx(0.64)


def overrunning(explore_wait_s: float, iterations: int = 2) -> SimConfig:
    """`measured("spotlight", 2)` with exploration 12.5× a rollout step (0.25 s) and 0.01 s to score a candidate."""
    config = measured("spotlight", spot=2, explore_sample_step_s=0.25)
    workload = config.workload.model_copy(update={
        "measured": config.workload.measured.model_copy(update={"score_candidate_s": 0.01})})
    loop = config.loop.model_copy(update={"explore_wait_s": explore_wait_s, "max_iterations": iterations})
    return config.model_copy(update={"workload": workload, "loop": loop})


def test_the_trainer_waits_for_an_overrunning_round_then_scores_it() -> None:
    # Iteration 0: rollout 240 padded sample-steps at 100 + 2·50 a second = 1.2 s; then the 2 s update,
    # while the first round (the cheapest arm, 4 candidates × 2 steps × 4 prompts = 32 candidate-steps at
    # 0.25 device-s each = 8 device-s) runs on 2 spot devices for 4 s: 2 s past training, within the
    # 5 s wait. The trainer idles those 2 s, then scores 4 · 4 candidates at 0.01 s: 0.16 s; then the
    # 0.5 s broadcast.
    first, second = simulate(overrunning(explore_wait_s=5.0), trace=STEADY).timeline
    assert first.explore_s == pytest.approx(4.0)
    assert first.explore_wait_s == pytest.approx(2.0 + 0.16)
    assert first.spot_explore_train_s == pytest.approx(2 * 2.0)  # both spot devices through the 2 s update
    assert first.end_s == second.start_s == pytest.approx(1.2 + 2.0 + 2.16 + 0.5)
    assert second.explored_prompts == 4
    # The last iteration opens no round (nothing would use it): no exploration, no wait.
    assert second.explore_s == second.explore_wait_s == 0.0
    assert second.end_s == pytest.approx(second.start_s + 1.2 + 2.0 + 0.5)


def test_the_waiting_trainer_is_idle_on_demand_time() -> None:
    # On-demand over both iterations: in each rollout it works 160 of the 240 padded sample-steps' share,
    # 160 · (100 / 200) / 100 = 0.8 s of 1.2 s (0.4 s idle); 2 s idle waiting for the round; 0.16 s scoring.
    result = simulate(overrunning(explore_wait_s=5.0), trace=STEADY)
    on_demand = result.usage["on_demand"].device_seconds
    assert on_demand["idle"] == pytest.approx(0.4 + 2.0 + 0.4)
    assert on_demand["explore"] == pytest.approx(0.16)
    assert on_demand["train"] == pytest.approx(2 * 2.0)


@pytest.mark.parametrize(("explore_wait_s", "explored", "waited_s"), [(1.0, 3, 1.0), (0.0, 2, 0.0)])
def test_a_round_past_the_wait_is_cancelled_and_seeds_what_it_finished(
    explore_wait_s: float, explored: int, waited_s: float
) -> None:
    # The round needs 4 s from the start of the 2 s update; cancelled at 2 s + the wait, it has done
    # (2 + wait) / 4 of its work, so floor(4 prompts × that) prompts get explored seeds.
    first, second = simulate(overrunning(explore_wait_s), trace=STEADY).timeline
    assert first.explore_s == pytest.approx(2.0 + explore_wait_s)
    assert first.explore_wait_s == pytest.approx(waited_s + 0.16)
    assert second.explored_prompts == explored


def test_per_iteration_times_replay_each_iteration_and_the_budget_is_the_previous_update(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = record_planner_choices(monkeypatch)
    config = measured("spotlight", spot=2)
    times = config.workload.measured.model_copy(update={"per_iteration": [
        IterationTimes(train_s=3.0),
        IterationTimes(train_s=6.0, on_demand_sample_step_s=0.02, spot_sample_step_s=0.04)]})
    config = config.model_copy(update={
        "workload": config.workload.model_copy(update={"measured": times}),
        "loop": config.loop.model_copy(update={"initial_budget_s": 5.0})})
    timeline = simulate(config, trace=STEADY).timeline
    # The third iteration repeats the last entry; unset fields keep the means (0.01 s, 0.02 s).
    assert [r.train_s for r in timeline] == [3.0, 6.0, 6.0]
    assert timeline[0].rollout_s == pytest.approx(240 / 200)
    assert timeline[1].rollout_s == pytest.approx(240 / (50 + 2 * 25))  # twice as slow a machine
    # the runtime's initial budget, then the update just timed; none in the last iteration
    assert [budget for budget, _, _ in calls] == [5.0, 3.0]


def test_the_monitor_rides_in_the_round_and_its_predicted_time_leaves_the_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = record_planner_choices(monkeypatch)
    config = measured("spotlight", spot=2)
    config = config.model_copy(update={"loop": config.loop.model_copy(update={
        "initial_budget_s": 5.0, "monitor_prompts": 2})})
    timeline = simulate(config, trace=STEADY).timeline
    # Round 1 (the cheapest arm, 4 candidates × 2 steps × 4 prompts at 0.02 s on 2 devices) costs
    # 0.02 s a candidate-step. Round 2 re-scores 2 of its prompts first: predicted 0.02 · 8 · 2 / 2
    # = 0.16 s, taken off the 2 s update; its work is its own plus those 16 candidate-steps.
    assert [budget for budget, _, _ in calls] == [5.0, pytest.approx(2.0 - 0.16)]
    second_plan = timeline[2].plan
    assert second_plan is not None
    own = second_plan[0] * second_plan[1] * 4
    assert timeline[1].explore_s == pytest.approx((own + 16) * 0.02 / 2)


@pytest.mark.parametrize(("explore_wait_s", "observed"), [(5.0, 1), (0.0, 0)])
def test_the_planner_learns_the_cost_only_of_rounds_that_finished(
    explore_wait_s: float, observed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[float] = []
    original = ExplorationPlanner.observe_cost

    def recording(self: ExplorationPlanner, plan: object, seconds: float, run: int, steps: int) -> None:
        calls.append(seconds)
        original(self, plan, seconds, run, steps)

    monkeypatch.setattr(ExplorationPlanner, "observe_cost", recording)
    simulate(overrunning(explore_wait_s), trace=STEADY)
    # The finished round took 8 device-s (module: 32 candidate-steps at 0.25 s); the cancelled one teaches nothing.
    assert calls == [pytest.approx(8.0)] * observed
