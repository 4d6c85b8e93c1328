"""Hourly prices of cloud machines, on-demand and spot, for the simulator and the runtime's ledger.

The defaults live in `prices.yaml` beside this module (package data): the table the Spotlight
paper used. A run's config can override any field, or add a machine, with `price_override`.
Prices are per whole machine per hour, as clouds bill them; `per_gpu_hour` divides by the GPUs.
`default_prices` reads the two per-GPU-hour prices the runtime's ledger bills (`DevicePrices`).
"""

from __future__ import annotations

import datetime as dt
import importlib.resources
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from spotlight.market.pools import Pool

Price = Annotated[float | None, Field(ge=0, allow_inf_nan=False)]


class PriceError(ValueError):
    """A price table or override that cannot be used; the message names the entry and field."""


class Offering(BaseModel):
    """One machine type a cloud rents, with its hourly prices (None where the source gives none)."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    provider: str = Field(min_length=1)
    instance: str = Field(min_length=1)
    gpus_per_machine: int = Field(ge=1)
    gpu: str = ""
    on_demand_per_hour: Price
    spot_per_hour: Price
    source: str
    date: str
    note: str = ""

    @field_validator("date", mode="before")
    @classmethod
    def _date_as_text(cls, value: Any) -> Any:
        """Accept a YAML date (`2024-05-01` parses as a date) and keep it as ISO text."""
        return value.isoformat() if isinstance(value, dt.date) else value

    def per_hour(self, kind: Pool) -> float:
        """Return the price of the whole machine per hour for `kind`; PriceError if it is unknown."""
        if kind not in ("on_demand", "spot"):
            raise PriceError(f"price kind must be 'on_demand' or 'spot', got {kind!r}")
        price = self.on_demand_per_hour if kind == "on_demand" else self.spot_per_hour
        if price is None:
            raise PriceError(
                f"{self.instance}: no {kind} price ({kind}_per_hour is null, source: {self.source}); "
                f"set it with a price override"
            )
        return price

    def per_gpu_hour(self, kind: Pool) -> float:
        """Return the price of one GPU-hour for `kind`: the machine's hourly price / gpus_per_machine.

        Clouds bill whole machines; per GPU is what compares an 8-GPU box with a 1-GPU one.
        """
        return self.per_hour(kind) / self.gpus_per_machine


def spot_discount(offering: Offering) -> float:
    """Return 1 − spot / on-demand: the fraction of the on-demand price that spot saves.

    Raises PriceError when either price is unknown or the on-demand price is 0.
    """
    on_demand = offering.per_hour("on_demand")
    if on_demand == 0:
        raise PriceError(f"{offering.instance}: on_demand_per_hour is 0, so a spot discount is undefined")
    return 1.0 - offering.per_hour("spot") / on_demand


def load_prices(path: str | os.PathLike[str] | None = None) -> dict[str, Offering]:
    """Return the offerings of a price file keyed by instance name (the packaged table by default).

    The file holds `offerings:`, a list of Offering fields. Raises PriceError naming the file,
    the entry and the field for anything malformed or duplicated.
    """
    if path is None:
        name = "spotlight/market/prices.yaml"
        text = importlib.resources.files("spotlight.market").joinpath("prices.yaml").read_text(encoding="utf-8")
    else:
        name = str(path)
        try:
            text = Path(path).read_text(encoding="utf-8")
        except FileNotFoundError:
            raise PriceError(f"{name}: no such price file; check the path") from None
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"{name}:{mark.line + 1}" if mark is not None else name
        raise PriceError(f"{where}: not valid YAML ({getattr(error, 'problem', error)})") from None
    entries = document.get("offerings") if isinstance(document, dict) else None
    if not isinstance(entries, list) or not entries:
        raise PriceError(f"{name}: expected a top-level 'offerings:' list of machines, got {document!r:.80}")
    prices: dict[str, Offering] = {}
    for index, entry in enumerate(entries):
        label = entry.get("instance", "?") if isinstance(entry, dict) else "?"
        where = f"{name}: offerings[{index}] ({label})"
        if not isinstance(entry, dict):
            raise PriceError(f"{where}: expected a mapping of Offering fields, got {entry!r}")
        offering = _validate(entry, where)
        if offering.instance in prices:
            raise PriceError(f"{where}: instance {offering.instance} is listed twice; keep one entry")
        prices[offering.instance] = offering
    return prices


def price_override(
    prices: Mapping[str, Offering], overrides: Mapping[str, Mapping[str, Any]] | None, where: str = "prices"
) -> dict[str, Offering]:
    """Return `prices` with `overrides` merged in: {instance: {field: value}} from a run's config.

    A known instance keeps the fields not given; an unknown one is a new machine and needs all
    required fields. Unless the override names them, `source` says which fields were overridden
    over which source, `date` becomes "not given" and `note` is cleared, so a changed price never
    claims the paper as its source. `where` is the config path used in errors, e.g.
    "cluster.price_overrides['p5.48xlarge'].spot_per_hour: Input should be greater than or equal to 0 (got -1)".
    """
    merged = dict(prices)
    for instance, fields in (overrides or {}).items():
        entry = f"{where}[{instance!r}]"
        if not isinstance(fields, Mapping):
            raise PriceError(
                f"{entry}: expected a mapping of fields (e.g. spot_per_hour: 12.5), got {fields!r}"
            )
        if fields.get("instance", instance) != instance:
            raise PriceError(f"{entry}.instance: must match its key {instance!r}, got {fields['instance']!r}")
        if instance in merged:
            base = merged[instance].model_dump()
            source = f"price override of {', '.join(fields)} over: {base['source']}"
        else:
            base, source = {"instance": instance}, "price override"
        values = {**base, "source": source, "date": "not given", "note": "", **fields}
        merged[instance] = _validate(values, entry)
    return merged


def _validate(values: Mapping[str, Any], where: str) -> Offering:
    """Return an Offering from `values`, or raise PriceError with one line per bad field."""
    try:
        return Offering.model_validate(dict(values))
    except ValidationError as error:
        problems = []
        for item in error.errors():
            field = ".".join(str(part) for part in item["loc"])
            if item["type"] == "missing":
                problems.append(f"{where}.{field}: required field is missing")
            elif item["type"] == "extra_forbidden":
                known = ", ".join(Offering.model_fields)
                problems.append(f"{where}.{field}: unknown field; known fields are {known}")
            else:
                problems.append(f"{where}.{field}: {item['msg']} (got {item['input']!r})")
        raise PriceError("; ".join(problems)) from None


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
        """Dollars per device-second in ``pool`` (the ledger bills by the second)."""
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
