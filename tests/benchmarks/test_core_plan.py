"""benchmarks/learning/core_plan.py: cores per run at 1 + N, the refusal, and the overrides that place a run."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `benchmarks.*`

from benchmarks.learning.core_plan import CorePlan, plan_cores  # noqa: E402
from spotlight.config import TrainConfig, load_config  # noqa: E402

SIXTEEN = list(range(16))


def test_one_plus_eight_on_sixteen_cores_gives_ray_the_cores_no_device_uses() -> None:
    plan = plan_cores(["vanilla", "spotlight"], SIXTEEN, 8, None, pair=True, available=SIXTEEN)
    assert plan == CorePlan(spot_devices=8, control_cores=6)  # 16 - trainer - 8 devices - vanilla beside
    assert plan.cores_needed("vanilla") == 1 and plan.cores_needed("spotlight") == 15
    assert plan.overrides("spotlight", list(range(1, 16))) == [
        "device_cores=[1,2,3,4,5,6,7,8,9]", "runtime.num_spot_devices=8", "control_cores=[10,11,12,13,14,15]"]
    assert plan.overrides("vanilla", [0]) == ["device_cores=[0]"]


def test_without_pair_the_spot_run_takes_every_core_left() -> None:
    assert plan_cores(["vanilla", "spotlight"], SIXTEEN, 8, None, pair=False, available=SIXTEEN).control_cores == 7


def test_one_plus_one_on_two_cores_shares_the_spot_core_with_ray() -> None:
    plan = plan_cores(["vanilla", "spotlight"], [0, 1], 1, None, pair=False, available=[0, 1])
    assert plan.control_cores == 0
    assert plan.overrides("spotlight", [0, 1]) == ["device_cores=[0,1]", "runtime.num_spot_devices=1",
                                                   "control_cores=null"]


def test_refuses_more_devices_and_control_cores_than_cores_in_one_line() -> None:
    with pytest.raises(SystemExit) as refused:
        plan_cores(["spotlight"], [0, 1], 8, 2, pair=False, available=[0, 1])
    message = str(refused.value)
    assert "1 + 8 + 2 control-plane = 11 cores" in message and "only 2" in message and "\n" not in message
    with pytest.raises(SystemExit, match="1 \\+ 1 \\+ 1 control-plane = 3 cores"):
        plan_cores(["spotlight"], [0, 1], 1, 1, pair=False, available=[0, 1])
    with pytest.raises(SystemExit, match="distinct cores"):
        plan_cores(["vanilla"], [0, 7], 1, None, pair=False, available=[0, 1])


def test_a_one_device_table_needs_no_spot_cores() -> None:
    assert plan_cores(["vanilla", "sync-explore"], [0], 8, None, pair=False, available=[0, 1]).cores_needed(
        "vanilla") == 1


def test_the_overrides_load_and_place_trainer_devices_and_control_plane_apart() -> None:
    plan = CorePlan(spot_devices=1, control_cores=0)
    config = load_config(TrainConfig, None, ["mode=spotlight", *plan.overrides("spotlight", [0, 1])])
    assert (config.device_core(0), config.device_core(1), config.control_plane_cores()) == (0, 1, [1])
    config = load_config(TrainConfig, None, ["mode=vanilla", "device_cores=[0]", "control_cores=[1]"])
    assert (config.device_core(0), config.control_plane_cores()) == (0, [1])


@pytest.mark.parametrize(("overrides", "cause"), [
    (["device_cores=[0,1]", "control_cores=[1]"], "shares core\\(s\\) \\[1\\] with device_cores"),
    (["control_cores=[1]"], "needs device_cores"),
    (["device_cores=[0]", "control_cores=[1,1]"], "control_cores \\[1, 1\\] repeats a core"),
])
def test_control_cores_off_every_device_or_refused_in_one_line(overrides: list[str], cause: str) -> None:
    with pytest.raises(ValueError, match=cause):
        load_config(TrainConfig, None, overrides)
