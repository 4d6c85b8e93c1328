"""The runtime cost meter: held vs busy device-seconds, dollars and utilisation, by hand-computed numbers."""

from __future__ import annotations

import math

import pytest

from spotlight.runtime.cost_meter import DeviceLedger, DevicePrices, default_prices
from spotlight.sim.prices import PriceError, load_prices

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
