"""The run guard calls a dying run from its metrics, and only a dying one."""

from __future__ import annotations

import math

from spotlight.components.guard import GuardSection, RunGuard


def record(iteration: int, reward: float = 0.5, spread: float = 0.3, zero: float = 0.0, loss: float = 0.2,
           grad_norm: float = 1.0) -> dict[str, float]:
    return {"iteration": iteration, "rollout/reward_mean": reward, "rollout/group_reward_std": spread,
            "rollout/zero_std_groups": zero, "train/loss": loss, "train/grad_norm": grad_norm}


def feed(guard: RunGuard, records: list[dict[str, float]]):
    """The first verdict of a sequence of records, or None."""
    for one in records:
        verdict = guard.observe(one)
        if verdict is not None:
            return verdict
    return None


def test_a_healthy_noisy_run_is_never_called_dying() -> None:
    guard = RunGuard(GuardSection())
    rising = [record(i, reward=0.35 + 0.002 * i + 0.04 * math.sin(i), loss=0.15 + 0.001 * i) for i in range(300)]
    assert feed(guard, rising) is None


def test_every_group_zero_spread_for_k_iterations_is_a_dead_signal() -> None:
    guard = RunGuard(GuardSection(dead_iterations=5, action="stop"))
    records = [record(i) for i in range(20)] + [record(20 + i, reward=0.0, spread=0.0, zero=1.0) for i in range(5)]
    verdict = feed(guard, records)
    assert verdict is not None and verdict.action == "stop"
    assert "zero reward spread for 5 iterations" in verdict.reason


def test_one_zero_spread_iteration_breaks_the_streak() -> None:
    guard = RunGuard(GuardSection(dead_iterations=3, reward_drop=100.0))
    dead, alive = record(0, zero=1.0, spread=0.0), record(0)
    assert feed(guard, [dead, dead, alive, dead, dead, alive]) is None


def test_a_reward_collapse_in_group_stds_rolls_back() -> None:
    guard = RunGuard(GuardSection(window=5, reward_drop=0.75))
    climbing = [record(i, reward=0.3 + 0.02 * i, spread=0.2) for i in range(20)]  # best window mean 0.64
    falling = [record(20 + i, reward=0.45, spread=0.2) for i in range(5)]  # 0.19 below: 0.95 stds
    verdict = feed(guard, climbing + falling)
    assert verdict is not None and verdict.action == "rollback"
    assert "group stds below its best" in verdict.reason


def test_a_drop_smaller_than_the_threshold_is_not_a_collapse() -> None:
    guard = RunGuard(GuardSection(window=5, reward_drop=0.75))
    climbing = [record(i, reward=0.3 + 0.02 * i, spread=0.2) for i in range(20)]
    dip = [record(20 + i, reward=0.55, spread=0.2) for i in range(5)]  # 0.09 below: 0.45 stds
    assert feed(guard, climbing + dip) is None


def test_non_finite_or_exploding_loss_is_called_at_once() -> None:
    assert "not finite" in feed(RunGuard(GuardSection()), [record(0, loss=float("nan"))]).reason
    guard = RunGuard(GuardSection(window=5, loss_explosion=10.0))
    verdict = feed(guard, [record(i, loss=0.2) for i in range(10)] + [record(10, loss=2.5)])
    assert verdict is not None and "exploded" in verdict.reason


def test_rollbacks_are_capped_then_the_guard_stops_the_run() -> None:
    guard = RunGuard(GuardSection(max_rollbacks=1))
    assert guard.observe(record(0, loss=float("inf"))).action == "rollback"
    guard.rolled_back()
    assert guard.observe(record(1, loss=float("inf"))).action == "stop"


def test_a_disabled_guard_judges_nothing() -> None:
    assert RunGuard(GuardSection(enabled=False)).observe(record(0, loss=float("nan"))) is None


def test_state_round_trips_so_a_resumed_run_judges_the_same() -> None:
    section = GuardSection(window=3, dead_iterations=4)
    records = [record(i, reward=0.4 + 0.01 * i, zero=float(i > 5)) for i in range(8)]
    whole, resumed = RunGuard(section), RunGuard(section)
    for one in records[:5]:
        whole.observe(one)
        resumed.observe(one)
    restored = RunGuard(section)
    restored.load_state_dict(resumed.state_dict())
    assert [whole.observe(r) for r in records[5:]] == [restored.observe(r) for r in records[5:]]
