"""Tests for spotlight.sim.cost: dollars from device-seconds, idle as the remainder, utilisation shares."""

from __future__ import annotations

import math

import pytest

from spotlight.sim.cost import PHASES, CostMeter

# p5.48xlarge from the paper's table: $55.04 / 8 GPUs on demand, $14.24 / 8 on spot.
ON_DEMAND, SPOT = 55.04 / 8, 14.24 / 8


def test_dollars_are_rented_device_hours_times_the_gpu_hour_price() -> None:
    meter = CostMeter(ON_DEMAND, SPOT)
    meter.book("on_demand", "train", 2 * 3600.0)  # two GPU-hours
    meter.book("spot", "idle", 3600.0)  # idle spot time is billed too
    assert meter.usage("on_demand").dollars == pytest.approx(13.76)
    assert meter.usage("spot").dollars == pytest.approx(1.78)
    assert meter.dollars == pytest.approx(15.54)


def test_book_window_books_the_remainder_as_idle() -> None:
    meter = CostMeter(ON_DEMAND, SPOT)
    idle = meter.book_window("spot", 100.0, {"explore": 60.0}, reconfiguring_s=5.0, lost_s=3.0)
    assert idle == pytest.approx(32.0)
    seconds = meter.usage("spot").device_seconds
    assert (seconds["explore"], seconds["reconfiguring"], seconds["lost"], seconds["idle"]) == (60.0, 5.0, 3.0, 32.0)


def test_phase_shares_sum_to_one_and_utilisation_counts_only_work() -> None:
    meter = CostMeter(ON_DEMAND, SPOT)
    meter.book_window("on_demand", 50.0, {"rollout": 20.0})
    meter.book("on_demand", "train", 40.0)
    meter.book("on_demand", "broadcast", 10.0)
    usage = meter.usage("on_demand")
    assert sum(usage.shares().values()) == pytest.approx(1.0)
    assert usage.utilisation == pytest.approx(60.0 / 100.0)  # broadcast and idle are not work
    assert set(usage.shares()) == set(PHASES)


def test_a_pool_that_rented_nothing_has_no_utilisation() -> None:
    usage = CostMeter(ON_DEMAND, SPOT).usage("spot")
    assert usage.dollars == 0.0
    assert math.isnan(usage.utilisation)


def test_work_beyond_the_rented_time_is_a_bookkeeping_error() -> None:
    meter = CostMeter(ON_DEMAND, SPOT)
    with pytest.raises(ValueError, match="exceed the rented"):
        meter.book_window("spot", 10.0, {"explore": 9.0}, reconfiguring_s=2.0)


def test_usage_is_a_snapshot() -> None:
    meter = CostMeter(ON_DEMAND, SPOT)
    meter.book("spot", "rollout", 10.0)
    before = meter.usage("spot")
    meter.book("spot", "rollout", 10.0)
    assert before.rented_device_s == 10.0
    assert meter.usage("spot").rented_device_s == 20.0


@pytest.mark.parametrize(("pool", "phase", "seconds", "message"), [
    ("spot", "dozing", 1.0, "phase must be one of"),
    ("reserved", "idle", 1.0, "pool must be one of"),
    ("spot", "idle", -1.0, "must be finite and >= 0"),
    ("spot", "idle", math.nan, "must be finite and >= 0"),
])
def test_bad_bookings_name_what_is_wrong(pool: str, phase: str, seconds: float, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        CostMeter(ON_DEMAND, SPOT).book(pool, phase, seconds)  # type: ignore[arg-type]


def test_a_negative_price_is_refused() -> None:
    with pytest.raises(ValueError, match=r"spot_per_gpu_hour must be a finite price >= 0"):
        CostMeter(ON_DEMAND, -1.0)
