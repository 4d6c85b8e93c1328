"""What a run on the device pools used and cost: one iteration's phases, and the run's totals.

Read off the device ledger (held and busy device-seconds per pool and phase) and the event log;
the report's contract for these names is in docs/runtime.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from spotlight.market.billing import DeviceLedger
from spotlight.runtime.spot.events import EventLog

__all__ = ["SPOT_ACTIVITIES", "IDLE_WHILE", "IterationMarks", "iteration_usage", "run_totals", "spot_breakdown"]

# What a held spot device does with its time (`DeviceLedger.activity_s`): sample its share of a rollout,
# explore, sample its share of validation, load weights (waiting for them), start up, or wait for work.
SPOT_ACTIVITIES = ("rollout", "explore", "eval", "weights", "starting", "idle")
# An iteration's waiting for work, split by what the trainer did meanwhile: validation and checkpoints since
# the last iteration, handing out weights and choosing seeds, the rollout (its sampling and scoring), the
# update, and closing the exploration round after it (waiting for it, scoring its candidates).
IDLE_WHILE = ("validation", "seeds", "rollout", "train", "close")


@dataclass
class IterationMarks:
    """Times on the run's clock that split one iteration into its phases (seeds, rollout, train, wait)."""

    previous_end: float = 0.0  # the end of the previous iteration (validation and checkpoints since then)
    started: float = 0.0
    rollout_started: float = 0.0
    rollout_ended: float = 0.0
    train_ended: float = 0.0
    ended: float = 0.0


def spot_breakdown(ledger: DeviceLedger, t0: float, t1: float) -> dict[str, float]:
    """``util/spot_<activity>``: each activity's share of the spot pool's held time in [t0, t1) (they sum to 1;
    NaN when nothing was held)."""
    seconds = ledger.activity_s("spot", t0, t1)
    held = sum(seconds.values())
    out = {f"util/spot_{activity}": seconds.get(activity, 0.0) / held if held > 0 else math.nan
           for activity in SPOT_ACTIVITIES}
    out.update({f"util/spot_{activity}": value / held for activity, value in seconds.items()
                if activity not in SPOT_ACTIVITIES and held > 0})  # a phase named since (never dropped)
    return out


def iteration_usage(ledger: DeviceLedger, events: EventLog, marks: IterationMarks,
                    explorers: int) -> dict[str, float]:
    """Times, utilisation per pool and phase, compute share and cumulative dollars of one iteration.

    ``util/spot`` is this iteration's busy over held spot device-seconds; ``util/spot_to_date`` and
    ``util/spot_held_fraction_to_date`` are the run's so far, from its start to this iteration's end (its
    validations and checkpoints included), as summary.json's ``util/spot`` and ``util/spot_held_fraction``
    measure the whole run: the progress line shows them, and the last iteration's agree with the summary
    up to what happens after it (the final validation). A busy interval counts once it has ended.

    The breakdown ``util/spot_<activity>`` (`SPOT_ACTIVITIES`) covers the iteration's whole window, from the
    end of the previous iteration (so the validation and checkpoint before it are in) to its end; its busy
    activities add up to ``util/spot``, which measures the same window. ``util/spot_idle_<phase>``
    (`IDLE_WHILE`) splits the waiting for work by what the trainer did meanwhile; ``util/spot_window_held_s`` is
    the held device-seconds they divide, to weigh iterations by.
    """
    window = (marks.previous_end, marks.ended)
    phases = dict(zip(IDLE_WHILE, zip((marks.previous_end, marks.started, marks.rollout_started, marks.rollout_ended,
                                       marks.train_ended), (marks.started, marks.rollout_started, marks.rollout_ended,
                                                            marks.train_ended, marks.ended), strict=True), strict=True))
    held = ledger.held_s("spot", *window)
    idle_while = {f"util/spot_idle_{phase}": (ledger.activity_s("spot", start, end)["idle"] / held if held > 0
                                              else math.nan) for phase, (start, end) in phases.items()}
    return {**spot_breakdown(ledger, *window), **idle_while, "util/spot_window_held_s": held,
        "time/rollout_s": marks.rollout_ended - marks.rollout_started,
        "time/explore_wait_s": marks.ended - marks.train_ended,
        "time/seeds_s": marks.rollout_started - marks.started,
        "time/iteration_s": marks.ended - marks.previous_end,
        "util/spot_train_phase": ledger.utilisation("spot", marks.rollout_ended, marks.train_ended),
        "util/spot_rollout_phase": ledger.utilisation("spot", marks.rollout_started, marks.rollout_ended),
        "util/spot": ledger.utilisation("spot", *window),
        "util/spot_to_date": ledger.utilisation("spot", 0.0, marks.ended),
        "util/spot_held_fraction_to_date": ledger.held_fraction("spot", 0.0, marks.ended),
        "util/on_demand": ledger.utilisation("on_demand", marks.started, marks.ended),
        "util/compute_share": ledger.compute_share(),
        "util/compute_share_spot": ledger.compute_share("spot"),
        "cost/usd_on_demand": ledger.dollars("on_demand", marks.ended),
        "cost/usd_spot": ledger.dollars("spot", marks.ended),
        "cost/usd": ledger.dollars("on_demand", marks.ended) + ledger.dollars("spot", marks.ended),
        "runtime/spot_devices": float(explorers),
        "runtime/preemption_notices": float(events.count("preemption_notice")),
    }


def run_totals(ledger: DeviceLedger, events: EventLog, mode: str, end: float) -> dict[str, Any]:
    """Totals of the run: dollars, utilisation, compute share, preemptions, queue latency.

    ``util/spot`` is busy over held device-seconds: what the spot devices did with the time they were
    billed for. ``util/spot_held_fraction`` beside it is how much of the run they were held (against the
    most spot devices held at once), so a device that was gone is not read as one that idled.
    ``util/spot_<activity>`` breaks the held time down by what the devices did (`spot_breakdown`), and
    ``spot_activity_s`` gives the same in device-seconds.
    """
    trips = [row for row in events.rows if row["kind"] == "pull_round_trip"]
    return {
        "mode": mode, "wall_s": end, "prices": vars(ledger.prices),
        "cost/usd": ledger.dollars("on_demand", end) + ledger.dollars("spot", end),
        "cost/usd_on_demand": ledger.dollars("on_demand", end), "cost/usd_spot": ledger.dollars("spot", end),
        "util/on_demand": ledger.utilisation("on_demand", 0.0, end),
        "util/spot": ledger.utilisation("spot", 0.0, end),
        "util/spot_held_fraction": ledger.held_fraction("spot", 0.0, end),
        "util/spot_held_s": ledger.held_s("spot", 0.0, end), "util/spot_busy_s": ledger.busy_s("spot", 0.0, end),
        **spot_breakdown(ledger, 0.0, end),
        "spot_activity_s": {activity: ledger.activity_s("spot", 0.0, end).get(activity, 0.0)
                            for activity in SPOT_ACTIVITIES},
        "util/compute_share": ledger.compute_share(), "util/compute_share_spot": ledger.compute_share("spot"),
        "preemption_notices": events.count("preemption_notice"),
        "nodes_removed": events.count("node_removed"), "nodes_added": events.count("node_added"),
        "queue/pull_round_trip_ms": 1e3 * float(np.mean([t["mean_s"] for t in trips])) if trips else math.nan,
    }
