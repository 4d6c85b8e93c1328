"""Tests for spotlight.sim.spot_timeline: the live and usable counts of a trace, their integrals and events."""

from __future__ import annotations

import math

import pytest
from small_sims import STEADY, trace_of

from spotlight.sim.spot_timeline import SpotTimeline


def test_timeline_integrates_the_live_count_and_replays_the_trace() -> None:
    trace = trace_of([(0, "add", "a"), (0, "add", "b"), (10, "remove", "b"), (30, "add", "b")], 40.0)
    spot = SpotTimeline(trace, spot_devices=2, time_scale=1.0, sp_degree=1)
    assert [spot.live_at(t) for t in (0, 9.9, 10, 29, 30, 39)] == [2, 2, 1, 1, 2, 2]
    assert spot.live_device_seconds(0, 40) == pytest.approx(2 * 10 + 1 * 20 + 2 * 10)
    assert spot.live_device_seconds(0, 120) == pytest.approx(3 * 60)
    assert spot.live_at(55.0) == spot.live_at(15.0) == 1
    assert spot.events(0, 40) == {"removed": 1, "groups_hit": 1, "removal_points": 1,
                                  "usable_after_removal": 1, "added": 1}
    assert spot.events(40, 80)["removed"] == 1  # the replay preempts again at 50


def test_the_replay_jump_from_the_last_count_to_the_first_is_an_event() -> None:
    trace = trace_of([(0, "add", "a"), (0, "add", "b"), (10, "remove", "b")], 40.0)
    spot = SpotTimeline(trace, spot_devices=2, time_scale=1.0, sp_degree=1)
    assert spot.events(0, 40)["added"] == 0  # the start is no event
    assert spot.events(0, 40.5)["added"] == 1  # back to 2 at t = 40


def test_timeline_maps_the_trace_peak_onto_the_pool_and_counts_whole_sp_groups() -> None:
    trace = trace_of([(0, "add", n) for n in "abcd"] + [(5, "remove", "a")], 100.0)
    spot = SpotTimeline(trace, spot_devices=8, time_scale=2.0, sp_degree=4)
    assert spot.live_at(0) == 8 and spot.usable_at(0) == 8
    assert spot.live_at(9.9) == 8 and spot.live_at(10.0) == 6  # 5 s × time scale 2
    assert spot.usable_at(10.0) == 4
    assert spot.events(0, 20)["groups_hit"] == 1  # 2 devices of one machine-local group of 4


def test_time_to_capacity_by_hand() -> None:
    trace = trace_of([(0, "add", "a"), (0, "add", "b"), (10, "remove", "b")], 40.0)
    spot = SpotTimeline(trace, spot_devices=2, time_scale=1.0, sp_degree=1)
    # Rate 1 + 2 = 3 until t = 10 (30 done), then 1 + 1 = 2: 10 more take 5 s.
    assert spot.time_to_capacity(0.0, 40.0, od_rate=1.0, spot_rate=1.0) == pytest.approx(15.0)
    # Spot alone, from t = 20: 1 device until 40, then 2 (replay) — 30 of work ends at 25 + 20 = 45.
    assert spot.time_to_capacity(20.0, 30.0, od_rate=0.0, spot_rate=1.0) == pytest.approx(45.0)
    assert spot.time_to_capacity(0.0, 1e4, od_rate=0.0, spot_rate=1.0) == pytest.approx(40.0 * 1e4 / 50.0)


def test_an_empty_spot_pool_never_finishes_spot_work() -> None:
    spot = SpotTimeline(STEADY, spot_devices=0, time_scale=1.0, sp_degree=1)
    assert spot.time_to_capacity(0.0, 1.0, od_rate=0.0, spot_rate=1.0) == math.inf
