"""Where a mode's wall time to target comes from: iterations × seconds per iteration, and each phase apart.

A ratio of wall times to target says nothing about its cause. It factors exactly into the ratio of
iterations (what exploration buys: a better-chosen group learns more per iteration) and the ratio of
seconds per iteration (what it costs, and what the spot devices hide); the seconds split further into
the phases every mode logs:

    seeds     choosing the seeds: sync-explore's exploration on the critical path (`time/explore_s`,
              or `time/seeds_s` in the Ray modes), ~0 for vanilla
    rollout   sampling the groups (`time/rollout_s`)
    update    the optimizer's work on the rollout (`time/train_s`)
    wait      the trainer waiting for exploration to finish after its update (`time/explore_wait_s`)
    other     the rest of the iteration (rewards, bookkeeping, Ray round trips)

Validation is left out (it is a measurement, not training). Every figure is over the iterations a run
took to reach the target (all of them for a run that did not), so a mode is charged for what it spent
on the way, not after.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

PHASES = ("seeds", "rollout", "update", "wait", "other")


def phase_seconds(records: list[dict[str, Any]], last_iteration: int | None) -> dict[str, float]:
    """Mean seconds per iteration, in total and per phase, over iterations 1..``last_iteration`` (None: all)."""
    previous_wall, rows = 0.0, []
    for record in records:
        if "time/wall_s" not in record or record["iteration"] == 0:
            continue
        if last_iteration is not None and record["iteration"] > last_iteration:
            break
        total = record["time/wall_s"] - previous_wall
        previous_wall = record["time/wall_s"]
        seeds = record.get("time/explore_s", record.get("time/seeds_s", 0.0))
        phases = {"seeds": seeds, "rollout": record.get("time/rollout_s", 0.0),
                  "update": record.get("time/train_s", 0.0), "wait": record.get("time/explore_wait_s", 0.0)}
        phases["other"] = max(total - sum(phases.values()), 0.0)
        rows.append({"iteration_s": total, **phases})
    if not rows:
        return {"iteration_s": math.nan, **{phase: math.nan for phase in PHASES}, "iterations": 0}
    means = {key: float(np.mean([row[key] for row in rows])) for key in rows[0]}
    return {**means, "iterations": len(rows)}


def decompose(outcomes: list[dict[str, Any]], modes: list[str]) -> dict[str, dict[str, float | None]]:
    """Per mode: medians of iterations to target and of the per-iteration seconds, and their ratios to vanilla.

    ``wall_vs_vanilla ≈ iterations_vs_vanilla × iteration_s_vs_vanilla`` (exact for one run; for medians
    over seeds only roughly). The ``free exploration`` row is the ceiling: sync-explore's iterations to
    target at vanilla's seconds per iteration, i.e. what exploration would give if it cost nothing.
    """
    table: dict[str, dict[str, float | None]] = {}
    for mode in modes:
        runs = [o for o in outcomes if o["mode"] == mode]
        if not runs:
            continue
        iterations = [o["iterations_to_target"] for o in runs]
        reached = sorted(i for i in iterations if i is not None)
        row: dict[str, float | None] = {
            "iterations": (float(np.median(reached + [math.inf] * (len(runs) - len(reached))))
                           if len(reached) * 2 > len(runs) else None),
            "reached": float(len(reached)), "runs": float(len(runs)),
        }
        for key in ("iteration_s", *PHASES):
            row[key] = float(np.median([o["phases"][key] for o in runs]))
        row["zero_std_groups"] = float(np.mean([o["zero_std_groups"] for o in runs]))
        table[mode] = row
    if "vanilla" in table:
        reference = table["vanilla"]
        for row in table.values():
            row["iterations_vs_vanilla"] = _ratio(row["iterations"], reference["iterations"])
            row["iteration_s_vs_vanilla"] = _ratio(row["iteration_s"], reference["iteration_s"])
            row["update_vs_vanilla"] = _ratio(row["update"], reference["update"])
            row["rollout_vs_vanilla"] = _ratio(row["rollout"], reference["rollout"])
        if "sync-explore" in table:
            sync = table["sync-explore"]
            table["free exploration"] = {
                "iterations": sync["iterations"], "iteration_s": reference["iteration_s"],
                "iterations_vs_vanilla": _ratio(sync["iterations"], reference["iterations"]),
                "iteration_s_vs_vanilla": 1.0,
            }
    return table


def affordable_candidates(outcomes: list[dict[str, Any]], prompts: int, spot_devices: int = 1) -> dict[str, float]:
    """What one spot core buys: candidates per prompt it can explore while the trainer updates.

    The cost of one candidate (one prompt, one seed, the arm's steps) is measured where exploration runs
    alone on the critical path (sync-explore: ``seeds`` seconds over prompts × candidates); the time a
    spot device has is spotlight's update (it explores i+1 while the trainer trains i).
    """
    sync = [o for o in outcomes if o["mode"] == "sync-explore" and o.get("explore_candidates")]
    spot = [o for o in outcomes if o["mode"] == "spotlight"]
    if not sync or not spot:
        return {}
    per_candidate = float(np.median([o["phases"]["seeds"] / (prompts * o["explore_candidates"]) for o in sync]))
    update = float(np.median([o["phases"]["update"] for o in spot]))
    return {"candidate_s": per_candidate, "update_s": update,
            "candidates_per_prompt": spot_devices * update / (prompts * per_candidate) if per_candidate else math.nan}


def _ratio(ours: float | None, theirs: float | None) -> float | None:
    if ours is None or theirs is None or theirs == 0 or math.isinf(ours) or math.isnan(ours):
        return None
    return ours / theirs


def format_table(table: dict[str, dict[str, float | None]]) -> str:
    """The decomposition as text: one row per mode (and the ceiling), seconds per iteration and phases."""

    def cell(value: float | None, digits: int = 2) -> str:
        return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"

    header = (f"{'mode':16s} {'iters':>6s} {'x van':>6s} {'s/iter':>7s} {'x van':>6s} "
              + " ".join(f"{phase:>7s}" for phase in PHASES) + f" {'upd x':>6s} {'roll x':>6s} {'zero-sd':>7s}")
    lines = [header]
    for mode, row in table.items():
        lines.append(
            f"{mode:16s} {cell(row.get('iterations'), 0):>6s} {cell(row.get('iterations_vs_vanilla')):>6s} "
            f"{cell(row.get('iteration_s')):>7s} {cell(row.get('iteration_s_vs_vanilla')):>6s} "
            + " ".join(f"{cell(row.get(phase)):>7s}" for phase in PHASES)
            + f" {cell(row.get('update_vs_vanilla')):>6s} {cell(row.get('rollout_vs_vanilla')):>6s}"
            f" {cell(row.get('zero_std_groups')):>7s}")
    return "\n".join(lines)
