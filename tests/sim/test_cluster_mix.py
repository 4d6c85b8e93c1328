"""Tests for spotlight.sim.cluster_mix: price sources and the cheapest mix that meets a deadline."""

from __future__ import annotations

from small_sims import STEADY, small

from spotlight.market.prices import load_prices
from spotlight.sim.cluster_mix import cheapest_mix, price_sources


def test_price_sources_pair_machines_of_one_provider() -> None:
    sources = price_sources(load_prices())
    assert ("p5.48xlarge", "p5.4xlarge") in sources
    assert ("p5.48xlarge", "a3-highgpu-8g") not in sources
    assert all(od != "p5.4xlarge" for od, _ in sources)  # it has no on-demand price


def test_cheapest_mix_is_the_cheapest_row_that_meets_the_deadline() -> None:
    base = small("spotlight", iterations=3)
    sources = [("p5.48xlarge", "p5.48xlarge"), ("a3-highgpu-8g", "a3-highgpu-8g")]
    sweep = cheapest_mix(1e6, base, (4, 8), (0, 4), sources, trace=STEADY)
    assert len(sweep.rows) == 8 and all(row.meets_deadline for row in sweep.rows)
    assert sweep.best == min(sweep.rows, key=lambda row: row.dollars_to_target)
    assert sweep.best.on_demand_instance == "p5.48xlarge"  # the cheaper provider at every size
    fastest = min(row.time_to_target_s for row in sweep.rows)
    tight = cheapest_mix(fastest * 1.0001, base, (4, 8), (0, 4), sources, trace=STEADY)
    assert tight.best is not None and tight.best.time_to_target_s == fastest
    assert cheapest_mix(fastest / 2, base, (4, 8), (0, 4), sources, trace=STEADY).best is None
