"""Which cluster to rent: the cheapest mix of on-demand and spot devices that meets a deadline (`spotlight plan`).

Every mix is a full simulation (`spotlight.sim.simulator.simulate`) of the same loop. A machine's size
matters to the loop only through whether an SP group fits inside it (NVLink, else the network), so
machines that agree on that run the loop identically and differ only in price: each device count is
simulated once per such shape and the other price sources re-priced from its rented device-seconds
per pool, when the run stopped at the target (then those are the run's whole bill).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from spotlight.market.prices import Offering, load_prices, price_override
from spotlight.market.traces import Availability, resolve_trace
from spotlight.sim.results import SimResult
from spotlight.sim.sim_config import SimConfig
from spotlight.sim.simulator import simulate

__all__ = ["MixRow", "MixSweep", "cheapest_mix", "price_sources"]


@dataclass(frozen=True)
class MixRow:
    """One simulated cluster mix: its devices, price sources and outcome."""

    on_demand_devices: int
    spot_devices: int
    on_demand_instance: str
    spot_instance: str
    time_to_target_s: float
    dollars_to_target: float
    meets_deadline: bool


@dataclass(frozen=True)
class MixSweep:
    """The cheapest mix that meets the deadline (None when none does) and every mix tried."""

    best: MixRow | None
    rows: list[MixRow]


def price_sources(prices: Mapping[str, Offering]) -> list[tuple[str, str]]:
    """Return every (on-demand instance, spot instance) pair of one provider that has both prices."""
    on_demand = [o for o in prices.values() if o.on_demand_per_hour is not None]
    spot = [o for o in prices.values() if o.spot_per_hour is not None]
    return [(a.instance, b.instance) for a in on_demand for b in spot if a.provider == b.provider]


def cheapest_mix(
    deadline_s: float,
    base: SimConfig | None = None,
    on_demand_options: Sequence[int] = (8, 16, 32, 64),
    spot_options: Sequence[int] = (0, 16, 32, 64),
    sources: Sequence[tuple[str, str]] | None = None,
    prices: Mapping[str, Offering] | None = None,
    trace: Availability | None = None,
    on_result: Callable[[MixRow], None] | None = None,
) -> MixSweep:
    """Return the cheapest cluster mix whose simulated time to target is within `deadline_s`.

    Sweeps on_demand_options × spot_options × sources ((on-demand instance, spot instance) pairs;
    default: every same-provider pair with both prices), simulating `base` (default SimConfig())
    with each; dollars to target decides, then time. `on_result` sees each row as it is done.
    """
    if not (deadline_s > 0):
        raise ValueError(f"cheapest_mix: deadline_s must be > 0 seconds (got {deadline_s})")
    base = base if base is not None else SimConfig()
    if prices is None:
        prices = price_override(load_prices(), base.cluster.price_overrides, "cluster.price_overrides")
    if trace is None:
        trace = resolve_trace(base.cluster.trace, "cluster.trace")
    sources = list(sources) if sources is not None else price_sources(prices)
    if not sources:
        raise ValueError("cheapest_mix: no price source has both an on-demand and a spot price; pass sources")
    rows: list[MixRow] = []
    simulated: dict[tuple[int, int, bool, bool], SimResult] = {}
    for on_demand, spot, (od_instance, spot_instance) in itertools.product(on_demand_options, spot_options, sources):
        sp = base.workload.sp_degree
        shape = (on_demand, spot, _gpus(prices, od_instance) >= sp, _gpus(prices, spot_instance) >= sp)
        result = simulated.get(shape)
        dollars = None if result is None else _repriced(result, base, prices, od_instance, spot_instance)
        if dollars is None:
            cluster = base.cluster.model_copy(update={
                "on_demand_devices": on_demand, "spot_devices": spot,
                "on_demand_instance": od_instance, "spot_instance": spot_instance,
            })
            result = simulate(base.model_copy(update={"cluster": cluster}), trace=trace, prices=prices)
            simulated.setdefault(shape, result)
            dollars = result.dollars_to_target
        row = MixRow(on_demand, spot, od_instance, spot_instance, result.time_to_target_s,
                     dollars, result.reached and result.time_to_target_s <= deadline_s)
        rows.append(row)
        if on_result is not None:
            on_result(row)
    meeting = [row for row in rows if row.meets_deadline]
    best = min(meeting, key=lambda row: (row.dollars_to_target, row.time_to_target_s)) if meeting else None
    return MixSweep(best, rows)


def _gpus(prices: Mapping[str, Offering], instance: str) -> int:
    return prices[instance].gpus_per_machine if instance in prices else 0  # unknown: simulate() names it


def _repriced(result: SimResult, base: SimConfig, prices: Mapping[str, Offering], od_instance: str,
              spot_instance: str) -> float | None:
    """Dollars to target of ``result``'s run at these machines' prices; None when it must be simulated.

    Only a run that stopped at the target rented exactly what the target cost; a pool the run did not
    rent (spot in vanilla) costs nothing at any price.
    """
    if not (result.reached and base.loop.stop_at_target and result.iterations_run == result.iterations_to_target):
        return None
    new = {"on_demand": prices[od_instance].on_demand_per_hour, "spot": prices[spot_instance].spot_per_hour}
    dollars = 0.0
    for pool, usage in result.usage.items():
        if usage.rented_device_s == 0:
            continue
        machine = prices[od_instance if pool == "on_demand" else spot_instance]
        price = new[pool]
        if price is None:
            return None  # simulate() raises its one-line error for the missing price
        dollars += usage.rented_device_s / 3600.0 * price / machine.gpus_per_machine
    return dollars
