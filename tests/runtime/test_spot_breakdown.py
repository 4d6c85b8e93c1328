"""The spot device's held time, broken down by what it did, adds up to the time it was billed (issue 43).

`util/spot` said 0.45 and nothing about the other 0.55. The breakdown (`util/spot_<activity>`) splits held
time into the device's activities: its share of the rollout, exploring, its share of validation, loading
weights, starting, and waiting for work; each iteration's idle time is split again by what the trainer did
meanwhile. The numbers expected below are counted by hand from the intervals, not read off the ledger.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from spotlight.market.billing import DeviceLedger
from spotlight.market.prices import DevicePrices
from spotlight.runtime.spot.events import EventLog
from spotlight.runtime.spot.usage import IDLE_WHILE, SPOT_ACTIVITIES, IterationMarks, iteration_usage, run_totals


def a_spot_device_that_leaves_and_comes_back() -> DeviceLedger:
    """30 s of run. spot-0 is held 0-20 s: weights 0-1, rollout 1-4, explore 6-11, validation 12-17 (busy 14 of 20).
    spot-1 joins at 22 s, its process is up at 25 s, loads weights 25-25.5 and explores 26-29.5 until the end."""
    ledger = DeviceLedger(DevicePrices(on_demand_per_hour=6.88, spot_per_hour=1.78, source="test"))
    ledger.hold("on-demand", "on_demand", 0.0)
    ledger.hold("spot-0", "spot", 0.0)
    for start, end, phase in ((0.0, 1.0, "broadcast"), (1.0, 4.0, "rollout"), (6.0, 11.0, "explore"),
                              (12.0, 17.0, "eval")):
        ledger.busy("spot-0", start, end, phase)
    ledger.busy("spot-0", 19.5, 20.3, "explore")  # timed on the device: sticks out of its held time by 0.3 s
    ledger.release("spot-0", 20.0)
    ledger.hold("spot-1", "spot", 22.0)
    ledger.started("spot-1", 25.0)
    ledger.busy("spot-1", 25.0, 25.5, "broadcast")
    ledger.busy("spot-1", 26.0, 29.5, "explore")
    return ledger


def test_activities_add_up_to_the_held_time() -> None:
    ledger = a_spot_device_that_leaves_and_comes_back()
    seconds = ledger.activity_s("spot", 0.0, 30.0)
    assert seconds == {"weights": pytest.approx(1.5), "rollout": pytest.approx(3.0), "explore": pytest.approx(9.0),
                       "eval": pytest.approx(5.0), "starting": pytest.approx(3.0), "idle": pytest.approx(6.5)}
    assert sum(seconds.values()) == pytest.approx(ledger.held_s("spot", 0.0, 30.0)) == pytest.approx(28.0)
    # busy is what is neither idle nor starting: 18.5 of 28 held device-seconds
    assert ledger.utilisation("spot", 0.0, 30.0) == pytest.approx(18.5 / 28.0)
    # a window cuts every interval: 10-24 s holds explore 10-11, idle 11-12, eval 12-17, idle 17-19.5,
    # explore 19.5-20 of spot-0 and 2 s of spot-1's start-up
    window = ledger.activity_s("spot", 10.0, 24.0)
    assert window == {"explore": pytest.approx(1.5), "eval": pytest.approx(5.0), "idle": pytest.approx(3.5),
                      "starting": pytest.approx(2.0)}


def test_overlapping_intervals_count_each_second_once() -> None:
    ledger = DeviceLedger(DevicePrices(on_demand_per_hour=1.0, spot_per_hour=1.0, source="test"))
    ledger.hold("spot-0", "spot", 0.0)
    ledger.busy("spot-0", 0.0, 6.0, "rollout")
    ledger.busy("spot-0", 4.0, 8.0, "explore")  # two clocks disagreeing by 2 s
    ledger.release("spot-0", 10.0)
    seconds = ledger.activity_s("spot", 0.0, 10.0)
    assert sum(seconds.values()) == pytest.approx(10.0)
    assert seconds["rollout"] == pytest.approx(6.0) and seconds["explore"] == pytest.approx(2.0)
    assert seconds["idle"] == pytest.approx(2.0)


def test_each_iteration_and_the_summary_break_held_time_down_to_fractions_summing_to_one(tmp_path: Path) -> None:
    ledger = a_spot_device_that_leaves_and_comes_back()
    events = EventLog(tmp_path / "events.jsonl")
    # iteration 1: validation 0-1 s (weights), seeds 1-1, rollout 1-5, train 5-11, close 11-12;
    # iteration 2: validation 12-17, seeds 17-18, rollout 18-20, train 20-28, close 28-30
    first = IterationMarks(previous_end=0.0, started=1.0, rollout_started=1.0, rollout_ended=5.0, train_ended=11.0,
                           ended=12.0)
    second = IterationMarks(previous_end=12.0, started=17.0, rollout_started=18.0, rollout_ended=20.0,
                            train_ended=28.0, ended=30.0)
    for marks in (first, second):
        record = iteration_usage(ledger, events, marks, explorers=1)
        shares = [record[f"util/spot_{activity}"] for activity in SPOT_ACTIVITIES]
        assert sum(shares) == pytest.approx(1.0)
        busy = sum(record[f"util/spot_{activity}"] for activity in ("rollout", "explore", "eval", "weights"))
        assert busy == pytest.approx(record["util/spot"])
        assert sum(record[f"util/spot_idle_{phase}"] for phase in IDLE_WHILE) == pytest.approx(record["util/spot_idle"])
    # iteration 2 holds 16 device-seconds (12-20 spot-0, 22-30 spot-1): spot-0 idles 17-19.5 (1 s while seeds are
    # chosen, 1.5 s in the rollout), spot-1 starts 22-25, idles 25.5-26 in training and 29.5-30 closing the round
    assert record["util/spot_window_held_s"] == pytest.approx(16.0)
    assert record["util/spot_eval"] == pytest.approx(5.0 / 16.0)
    assert record["util/spot_starting"] == pytest.approx(3.0 / 16.0)
    assert record["util/spot_idle_seeds"] == pytest.approx(1.0 / 16.0)
    assert record["util/spot_idle_rollout"] == pytest.approx(1.5 / 16.0)
    assert record["util/spot_idle_train"] == pytest.approx(0.5 / 16.0)
    assert record["util/spot_idle_close"] == pytest.approx(0.5 / 16.0)
    assert record["util/spot_idle_validation"] == 0.0
    totals = run_totals(ledger, events, "spotlight", 30.0)
    assert sum(totals[f"util/spot_{activity}"] for activity in SPOT_ACTIVITIES) == pytest.approx(1.0)
    assert sum(totals["spot_activity_s"].values()) == pytest.approx(28.0)
    assert totals["util/spot"] == pytest.approx(18.5 / 28.0)
    assert totals["util/spot_idle"] == pytest.approx(6.5 / 28.0)


def test_nothing_held_is_no_breakdown(tmp_path: Path) -> None:
    ledger = DeviceLedger(DevicePrices(on_demand_per_hour=1.0, spot_per_hour=1.0, source="test"))
    ledger.hold("on-demand", "on_demand", 0.0)
    record = iteration_usage(ledger, EventLog(tmp_path / "events.jsonl"), IterationMarks(ended=5.0), explorers=0)
    assert all(math.isnan(record[f"util/spot_{activity}"]) for activity in SPOT_ACTIVITIES)
