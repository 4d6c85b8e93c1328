"""Tests for spotlight.market.prices: the packaged table, per-GPU prices, discounts and overrides."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from spotlight.market.prices import Offering, PriceError, load_prices, price_override, spot_discount

# The Spotlight paper's price table, per hour of a whole machine: (on-demand, spot).
PAPER = {
    "p5.48xlarge": (55.04, 14.24),
    "p5.4xlarge": (None, 2.47),
    "a3-highgpu-8g": (88.49, 39.81),
    "Standard_ND96isr_H100_v5": (98.32, 18.17),
}


def test_packaged_table_is_the_papers_table() -> None:
    prices = load_prices()
    assert {name: (o.on_demand_per_hour, o.spot_per_hour) for name, o in prices.items()} == PAPER
    assert all(o.source == "Spotlight paper price table" for o in prices.values())
    assert all(o.date == "as used by the paper" for o in prices.values())


@pytest.mark.parametrize(
    ("instance", "discount"),
    [
        ("p5.48xlarge", 0.7413),  # 1 − 14.24 / 55.04 = 1 − 0.25872
        ("a3-highgpu-8g", 0.5501),  # 1 − 39.81 / 88.49 = 1 − 0.44988
        ("Standard_ND96isr_H100_v5", 0.8152),  # 1 − 18.17 / 98.32 = 1 − 0.18481
    ],
)
def test_spot_discount_matches_the_table_by_hand(instance: str, discount: float) -> None:
    assert spot_discount(load_prices()[instance]) == pytest.approx(discount, abs=1e-4)


def test_per_gpu_hour_divides_the_machine_price_by_its_gpus() -> None:
    prices = load_prices()
    assert prices["p5.48xlarge"].per_gpu_hour("spot") == pytest.approx(1.78)  # 14.24 / 8
    assert prices["p5.48xlarge"].per_gpu_hour("on_demand") == pytest.approx(6.88)  # 55.04 / 8
    assert prices["p5.4xlarge"].per_gpu_hour("spot") == pytest.approx(2.47)  # one GPU


def test_missing_on_demand_price_says_how_to_set_it() -> None:
    offering = load_prices()["p5.4xlarge"]
    with pytest.raises(PriceError, match="p5.4xlarge: no on_demand price .* set it with a price override"):
        offering.per_gpu_hour("on_demand")
    with pytest.raises(PriceError, match="p5.4xlarge: no on_demand price"):
        spot_discount(offering)


def test_override_changes_only_the_given_field_and_records_it() -> None:
    prices = load_prices()
    merged = price_override(prices, {"p5.48xlarge": {"spot_per_hour": 12.0}})
    offering = merged["p5.48xlarge"]
    assert offering.spot_per_hour == 12.0
    assert offering.on_demand_per_hour == 55.04
    assert offering.source == "price override of spot_per_hour over: Spotlight paper price table"
    assert prices["p5.48xlarge"].spot_per_hour == 14.24  # the input is not changed
    assert merged["a3-highgpu-8g"] is prices["a3-highgpu-8g"]


def test_override_can_fill_a_missing_price_and_add_a_machine() -> None:
    merged = price_override(
        load_prices(),
        {
            "p5.4xlarge": {"on_demand_per_hour": 6.88},
            "g6e.xlarge": {
                "provider": "aws",
                "gpus_per_machine": 1,
                "on_demand_per_hour": 1.861,
                "spot_per_hour": 0.75,
            },
        },
    )
    assert spot_discount(merged["p5.4xlarge"]) == pytest.approx(1 - 2.47 / 6.88)
    assert merged["g6e.xlarge"].instance == "g6e.xlarge"
    assert merged["g6e.xlarge"].source == "price override"


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        (
            {"spot_per_hour": -1.0},
            r"\.spot_per_hour: Input should be greater than or equal to 0 \(got -1.0\)",
        ),
        ({"spot_per_hour": "cheap"}, r"\.spot_per_hour: Input should be a valid number \(got 'cheap'\)"),
        ({"spot_per_hour": True}, r"\.spot_per_hour: Input should be a valid number"),
        ({"on_demand_per_hour": math.inf}, r"\.on_demand_per_hour: Input should be a finite number"),
        ({"gpus_per_machine": 0}, r"\.gpus_per_machine: Input should be greater than or equal to 1"),
        ({"spot_per_hr": 3.0}, r"\.spot_per_hr: unknown field; known fields are provider, instance"),
        ({"instance": "p5.4xlarge"}, r"\.instance: must match its key 'p5.48xlarge'"),
    ],
)
def test_bad_override_names_the_config_field(fields: dict, expected: str) -> None:
    with pytest.raises(PriceError, match=r"^sim\.prices\['p5.48xlarge'\]" + expected):
        price_override(load_prices(), {"p5.48xlarge": fields}, where="sim.prices")


def test_new_machine_without_required_fields_lists_each_missing_one() -> None:
    with pytest.raises(PriceError) as error:
        price_override(load_prices(), {"new-box": {"spot_per_hour": 1.0}})
    message = str(error.value)
    for field in ("provider", "gpus_per_machine", "on_demand_per_hour"):
        assert f"prices['new-box'].{field}: required field is missing" in message
    assert "spot_per_hour" not in message


def test_price_file_accepts_yaml_dates_and_rejects_duplicates(tmp_path: Path) -> None:
    entry = (
        "  - {provider: aws, instance: x1, gpus_per_machine: 2, on_demand_per_hour: 4,"
        " spot_per_hour: 1.5, source: quote, date: 2025-01-31}\n"
    )
    path = tmp_path / "prices.yaml"
    path.write_text("offerings:\n" + entry)
    offering = load_prices(path)["x1"]
    assert offering.date == "2025-01-31"
    assert offering.per_gpu_hour("on_demand") == 2.0
    path.write_text("offerings:\n" + entry + entry)
    with pytest.raises(PriceError, match=r"prices\.yaml: offerings\[1\] \(x1\): instance x1 is listed twice"):
        load_prices(path)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("machines: []\n", r"expected a top-level 'offerings:' list"),
        ("offerings: [\n", r"prices\.yaml:2: not valid YAML"),
        ("offerings:\n  - {provider: aws}\n", r"offerings\[0\] \(\?\)\.instance: required field is missing"),
    ],
)
def test_bad_price_file_names_the_file_and_entry(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "prices.yaml"
    path.write_text(text)
    with pytest.raises(PriceError, match=expected):
        load_prices(path)


def test_offering_is_frozen() -> None:
    offering: Offering = load_prices()["p5.48xlarge"]
    with pytest.raises(ValueError):
        offering.spot_per_hour = 1.0  # type: ignore[misc]
