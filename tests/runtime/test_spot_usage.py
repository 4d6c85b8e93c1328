"""A run's spot utilisation is busy over held device-seconds, with the held fraction beside it (issue 36).

The default run's summary once read `util/spot 0.476` while its spot device worked 0.92 of every stretch it
existed: the node was gone half the time, and a reader took "0.476" for a device that idled. Here one spot
device lives through the run the way the replayed trace makes it: held, busy most of the time it is held,
removed, back. The summary (`run_totals`) must say 0.92 busy over held and 0.5 held, and the per-iteration
metrics the progress line shows (`iteration_usage`) must reach the same numbers at the last iteration. The
expected values are counted by hand from the intervals below, not from the ledger.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from spotlight.market.billing import DeviceLedger
from spotlight.market.prices import DevicePrices
from spotlight.runtime.spot.events import EventLog
from spotlight.runtime.spot.usage import IterationMarks, iteration_usage, run_totals

ITERATION_S = 10.0


def ledger_of_a_spot_node_present_half_the_run() -> DeviceLedger:
    """40 s of run, 4 iterations of 10 s. spot-0 is held 0-10 s and 20-30 s (a new device after the return),
    busy 9.2 s of each 10 s it is held; the on-demand device is held throughout, busy 8 s of every 10."""
    ledger = DeviceLedger(DevicePrices(on_demand_per_hour=6.88, spot_per_hour=1.78, source="test"))
    ledger.hold("on-demand", "on_demand", 0.0)
    for start in (0.0, 10.0, 20.0, 30.0):
        ledger.busy("on-demand", start, start + 8.0, "train")
    for device, start in (("spot-0", 0.0), ("spot-1", 20.0)):
        ledger.hold(device, "spot", start)
        ledger.busy(device, start + 0.3, start + 5.0, "rollout")
        ledger.busy(device, start + 5.5, start + 10.0, "explore")  # 4.7 + 4.5 = 9.2 s of 10
        ledger.release(device, start + 10.0)
    return ledger


def test_summary_divides_spot_busy_by_held_time_and_reports_the_held_fraction(tmp_path: Path) -> None:
    ledger = ledger_of_a_spot_node_present_half_the_run()
    totals = run_totals(ledger, EventLog(tmp_path / "events.jsonl"), "spotlight", 40.0)
    assert totals["util/spot"] == pytest.approx(18.4 / 20.0)  # not 18.4 / 40 = 0.46: the device was gone, not idle
    assert totals["util/spot_held_fraction"] == pytest.approx(20.0 / 40.0)
    assert (totals["util/spot_held_s"], totals["util/spot_busy_s"]) == (pytest.approx(20.0), pytest.approx(18.4))
    assert totals["util/on_demand"] == pytest.approx(0.8)


def test_the_last_iterations_metrics_agree_with_the_summary(tmp_path: Path) -> None:
    ledger = ledger_of_a_spot_node_present_half_the_run()
    events = EventLog(tmp_path / "events.jsonl")
    records = []
    for k in range(4):
        start = k * ITERATION_S
        marks = IterationMarks(previous_end=start, started=start, rollout_started=start, rollout_ended=start + 5.0,
                               train_ended=start + 10.0, ended=start + ITERATION_S)
        records.append(iteration_usage(ledger, events, marks, explorers=1))
    totals = run_totals(ledger, events, "spotlight", 4 * ITERATION_S)
    # the iterations the node was there: 0.92 busy; the ones it was gone: nothing held, no utilisation
    assert [record["util/spot"] for record in records][::2] == [pytest.approx(0.92)] * 2
    assert all(math.isnan(record["util/spot"]) for record in records[1::2])
    # so far, as the progress line shows it: after the first iteration 9.2 / 10 held of 10 s; at the end, the summary
    assert records[0]["util/spot_to_date"] == pytest.approx(0.92)
    assert records[1]["util/spot_held_fraction_to_date"] == pytest.approx(10.0 / 20.0)
    assert records[-1]["util/spot_to_date"] == pytest.approx(totals["util/spot"])
    assert records[-1]["util/spot_held_fraction_to_date"] == pytest.approx(totals["util/spot_held_fraction"])
    # and the held-time-weighted mean of the iterations' own utilisation is the run's
    held = [ledger.held_s("spot", k * ITERATION_S, (k + 1) * ITERATION_S) for k in range(4)]
    weighted = sum(r["util/spot"] * h for r, h in zip(records, held, strict=True) if h > 0) / sum(held)
    assert weighted == pytest.approx(totals["util/spot"])


def test_peak_held_counts_devices_at_once_not_devices_ever_held() -> None:
    ledger = ledger_of_a_spot_node_present_half_the_run()
    assert ledger.peak_held("spot", 40.0) == 1  # spot-0 and spot-1 never overlap
    ledger.hold("spot-2", "spot", 22.0)  # a second node joins while spot-1 is held
    assert ledger.peak_held("spot", 40.0) == 2 and ledger.peak_held("spot", 21.0) == 1
    ledger.release("spot-2", 30.0)
    # 20 + 8 held device-seconds over 2 devices × 40 s
    assert ledger.held_fraction("spot", 0.0, 40.0) == pytest.approx(28.0 / 80.0)
