"""Billing: the simulator's CostMeter (dollars from device-seconds, idle as the remainder, utilisation
shares) and the runtime's DeviceLedger (held vs busy device-seconds), by hand-computed numbers."""

from __future__ import annotations

import math

import pytest

from spotlight.market.billing import PHASES, CostMeter, DeviceLedger
from spotlight.market.prices import DevicePrices, PriceError, default_prices, load_prices

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


PRICES = DevicePrices(on_demand_per_hour=3.6, spot_per_hour=1.8, source="test")  # 1e-3 and 5e-4 $/s


def test_dollars_charge_every_held_second_busy_or_not() -> None:
    ledger = DeviceLedger(PRICES)
    ledger.hold("od", "on_demand", 0.0)
    ledger.hold("s0", "spot", 10.0)
    ledger.busy("s0", 12.0, 14.0, "explore")
    ledger.release("s0", 30.0)  # preempted: billing stops
    ledger.hold("s0", "spot", 50.0)  # a new node joins
    assert ledger.dollars("on_demand", 100.0) == pytest.approx(100 * 1e-3)
    assert ledger.dollars("spot", 100.0) == pytest.approx((20 + 50) * 5e-4)
    assert ledger.dollars("spot", 40.0) == pytest.approx(20 * 5e-4)


def test_utilisation_is_busy_over_held_inside_the_window() -> None:
    ledger = DeviceLedger(PRICES)
    ledger.hold("s0", "spot", 0.0)
    ledger.hold("s1", "spot", 5.0)
    ledger.busy("s0", 2.0, 8.0, "explore", compute_s=5.4)
    ledger.busy("s1", 6.0, 10.0, "rollout", compute_s=3.6)
    # window [4, 10): held 6 + 5 = 11 device-s; busy 4 (s0: 4..8) + 4 (s1: 6..10) = 8
    assert ledger.held_s("spot", 4.0, 10.0) == pytest.approx(11.0)
    assert ledger.busy_s("spot", 4.0, 10.0) == pytest.approx(8.0)
    assert ledger.busy_s("spot", 4.0, 10.0, phase="explore") == pytest.approx(4.0)
    assert ledger.utilisation("spot", 4.0, 10.0) == pytest.approx(8.0 / 11.0)
    assert ledger.compute_share("spot") == pytest.approx((5.4 + 3.6) / (6.0 + 4.0))
    assert math.isnan(ledger.utilisation("on_demand", 0.0, 10.0))


def test_default_prices_come_per_gpu_from_the_package_table() -> None:
    offering = load_prices()["p5.48xlarge"]
    prices = default_prices("p5.48xlarge")
    assert prices.on_demand_per_hour == pytest.approx(offering.on_demand_per_hour / offering.gpus_per_machine)
    assert prices.spot_per_hour == pytest.approx(offering.spot_per_hour / offering.gpus_per_machine)
    assert default_prices("p5.48xlarge", spot=1.0).spot_per_hour == 1.0
    with pytest.raises(PriceError, match="not in the price table"):
        default_prices("no-such-machine")


def test_bookkeeping_errors_name_the_device() -> None:
    ledger = DeviceLedger(PRICES)
    with pytest.raises(ValueError, match="never held"):
        ledger.busy("ghost", 0.0, 1.0, "explore")
    ledger.hold("s0", "spot", 0.0)
    with pytest.raises(ValueError, match="already held"):
        ledger.hold("s0", "spot", 1.0)
    with pytest.raises(ValueError, match="ends before it starts"):
        ledger.busy("s0", 2.0, 1.0, "explore")
