"""The runtime's cost meter: every rented device-second, what it did, and what it cost.

A device is *held* (rented, billed) from the moment its node is live until the node goes, busy or
not, as clouds bill GPU machines per second. Within that, it is *busy* in intervals labelled with
a phase (rollout, train, explore, broadcast, eval). From the two the meter answers, for any window
of the run's clock: held and busy seconds per pool (utilisation = busy / held), the dollars so far
per pool, and the share of busy time that was model compute (the rest is the runtime's overhead:
RPCs, leases, tokenising, weight loading).

Times are seconds on the run's clock (0 = the start of the run). Prices are per GPU-hour, one
device = one GPU; the defaults come from the package's price table (`spotlight.sim.prices`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from spotlight.sim.prices import PriceError, load_prices

__all__ = ["DevicePrices", "DeviceLedger", "Pool", "default_prices"]

Pool = Literal["on_demand", "spot"]
POOLS: tuple[Pool, ...] = ("on_demand", "spot")


@dataclass(frozen=True)
class DevicePrices:
    """Dollars per device-hour in each pool, and where the numbers come from."""

    on_demand_per_hour: float
    spot_per_hour: float
    source: str

    def __post_init__(self) -> None:
        for name in ("on_demand_per_hour", "spot_per_hour"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"runtime.prices.{name} must be a finite price >= 0 in $/GPU-hour (got {value})")

    def per_second(self, pool: Pool) -> float:
        return (self.on_demand_per_hour if pool == "on_demand" else self.spot_per_hour) / 3600.0


def default_prices(instance: str, on_demand: float | None = None, spot: float | None = None) -> DevicePrices:
    """Per-GPU-hour prices of ``instance`` from the package's price table; explicit values win."""
    offerings = load_prices()
    if instance not in offerings:
        raise PriceError(f"runtime.prices.instance {instance!r} is not in the price table; choose one of "
                         f"{', '.join(sorted(offerings))} or give both per-GPU-hour prices")
    offering = offerings[instance]
    on_demand_price = on_demand if on_demand is not None else offering.per_gpu_hour("on_demand")
    spot_price = spot if spot is not None else offering.per_gpu_hour("spot")
    given = " (overridden in the config)" if on_demand is not None or spot is not None else ""
    return DevicePrices(on_demand_price, spot_price, f"{offering.provider} {instance} per GPU-hour, "
                        f"{offering.source}, {offering.date}{given}")


@dataclass
class _Device:
    pool: Pool
    held: list[list[float]] = field(default_factory=list)  # [start, end]; end = inf while held
    busy: list[tuple[float, float, str]] = field(default_factory=list)
    compute_s: float = 0.0


def _overlap(start: float, end: float, t0: float, t1: float) -> float:
    return max(0.0, min(end, t1) - max(start, t0))


class DeviceLedger:
    """Held and busy intervals of every device, priced (see the module docstring)."""

    def __init__(self, prices: DevicePrices) -> None:
        self.prices = prices
        self._devices: dict[str, _Device] = {}

    def hold(self, device: str, pool: Pool, at: float) -> None:
        """Start renting ``device`` at ``at`` (its node is live)."""
        if pool not in POOLS:
            raise ValueError(f"pool must be one of {POOLS} (got {pool!r})")
        entry = self._devices.setdefault(device, _Device(pool))
        if entry.held and math.isinf(entry.held[-1][1]):
            raise ValueError(f"device {device} is already held since {entry.held[-1][0]:.3f} s; release it first")
        entry.held.append([at, math.inf])

    def release(self, device: str, at: float) -> None:
        """Stop renting ``device`` at ``at`` (its node is gone, or the run ended); idempotent."""
        entry = self._devices.get(device)
        if entry is not None and entry.held and math.isinf(entry.held[-1][1]):
            entry.held[-1][1] = max(at, entry.held[-1][0])

    def busy(self, device: str, start: float, end: float, phase: str, compute_s: float = 0.0) -> None:
        """Record that ``device`` worked on ``phase`` from ``start`` to ``end``, ``compute_s`` of it in the model."""
        entry = self._devices.get(device)
        if entry is None:
            raise ValueError(f"busy interval for device {device}, which was never held: call hold() first")
        if end < start:
            raise ValueError(f"busy interval of {device} ends before it starts ({start:.3f} > {end:.3f})")
        entry.busy.append((start, end, phase))
        entry.compute_s += compute_s

    def is_held(self, device: str) -> bool:
        entry = self._devices.get(device)
        return entry is not None and bool(entry.held) and math.isinf(entry.held[-1][1])

    def held_s(self, pool: Pool, t0: float, t1: float) -> float:
        """Device-seconds rented in ``pool`` during [t0, t1)."""
        return sum(_overlap(start, end, t0, t1) for entry in self._pool(pool) for start, end in entry.held)

    def busy_s(self, pool: Pool, t0: float, t1: float, phase: str | None = None) -> float:
        """Device-seconds busy in ``pool`` during [t0, t1) (only ``phase`` if given)."""
        return sum(_overlap(start, end, t0, t1) for entry in self._pool(pool) for start, end, label in entry.busy
                   if phase is None or label == phase)

    def utilisation(self, pool: Pool, t0: float, t1: float) -> float:
        """Busy / held device-seconds of ``pool`` in [t0, t1); NaN when nothing was held."""
        held = self.held_s(pool, t0, t1)
        return self.busy_s(pool, t0, t1) / held if held > 0 else math.nan

    def dollars(self, pool: Pool, until: float) -> float:
        """What ``pool`` cost from the start of the run to ``until``."""
        return self.held_s(pool, 0.0, until) * self.prices.per_second(pool)

    def compute_share(self, pool: Pool | None = None) -> float:
        """Model-compute seconds / busy seconds over the whole run (NaN when nothing was busy)."""
        entries = [entry for name in POOLS if pool in (None, name) for entry in self._pool(name)]
        busy = sum(end - start for entry in entries for start, end, _ in entry.busy)
        return sum(entry.compute_s for entry in entries) / busy if busy > 0 else math.nan

    def _pool(self, pool: Pool) -> list[_Device]:
        return [entry for entry in self._devices.values() if entry.pool == pool]
