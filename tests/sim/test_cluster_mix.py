"""Tests for spotlight.sim.cluster_mix: price sources and the cheapest mix that meets a deadline."""

from __future__ import annotations

import pytest
from small_sims import STEADY, small

from spotlight.market.prices import load_prices
from spotlight.sim import cluster_mix
from spotlight.sim.cluster_mix import cheapest_mix, price_sources
from spotlight.sim.simulator import simulate


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


def test_a_mix_repriced_from_another_source_of_its_shape_costs_what_its_own_simulation_costs(monkeypatch) -> None:
    """p5.48xlarge and a3-highgpu-8g are both 8-GPU machines: the second is re-priced, not simulated."""
    base = small("spotlight", iterations=3)
    calls = []
    monkeypatch.setattr(cluster_mix, "simulate", lambda *args, **kwargs: calls.append(1) or simulate(*args, **kwargs))
    repriced = cheapest_mix(1e6, base, (4,), (4,), [("p5.48xlarge", "p5.48xlarge"), ("a3-highgpu-8g", "a3-highgpu-8g")],
                            trace=STEADY).rows[1]
    assert len(calls) == 1
    simulated = cheapest_mix(1e6, base, (4,), (4,), [("a3-highgpu-8g", "a3-highgpu-8g")], trace=STEADY).rows[0]
    assert repriced.dollars_to_target == pytest.approx(simulated.dollars_to_target, rel=1e-9)
    assert repriced.time_to_target_s == simulated.time_to_target_s
