"""The planner and the exploration at 1 + N spot devices, and the simulator's prediction beside the measurement.

Three questions a wider spot pool raises (issue 37), answered from the runs of `time_to_target.py`:

    plan       which N × S (candidates per prompt × preview steps) the planner picks with N spot
               devices' budget (`planner/num_candidates`, `planner/num_steps`, every explored iteration)
    staleness  whether the stale ranking still holds: the staleness monitor's Kendall τ between the
               stale preview's ranking and a fresh one (`staleness/kendall_tau`) against the floor
    signal     whether wider candidate pools raise the chosen groups' reward std
               (`rollout/group_reward_std`) past sync-explore's (0.376 in the 1 + 1 table: exploration
               with fresh weights on the critical path)

The prediction: `spotlight.sim` on the same 1 + N setting, built from a measured spotlight run
directory exactly as `sim_vs_runtime.py` builds it (the run's cluster, trace and per-phase times),
but run to the target under the convergence law with α fitted to the measured 1 + 1 runs
(`benchmarks/results/time_to_target.json`) and vanilla's iterations as measured, and the signal
model's stale τ set to the one measured. Its iterations and wall time, for vanilla and spotlight,
stand beside the measured ones; nothing in it is fitted to the 1 + N outcome.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np


def exploration_stats(records: list[dict[str, Any]], last_iteration: int | None) -> dict[str, Any] | None:
    """One run's plans, staleness τ and selected std over iterations 1..``last_iteration`` (None: all).

    None when the run explored nothing (a one-device mode, or spot-rollout).
    """
    rows = [r for r in records if r.get("iteration", 0) >= 1
            and (last_iteration is None or r["iteration"] <= last_iteration)]
    plans = [(int(r["planner/num_candidates"]), int(r["planner/num_steps"])) for r in rows
             if "planner/num_candidates" in r]
    if not plans:
        return None
    taus = [r["staleness/kendall_tau"] for r in rows if "staleness/kendall_tau" in r]
    devices = [r["planner/spot_devices"] for r in rows if "planner/spot_devices" in r]
    selected = [r["explore/selected_reward_std"] for r in rows if "explore/selected_reward_std" in r]
    return {
        "explored_iterations": len(plans), "iterations": len(rows),
        "plans": [[n, s, count] for (n, s), count in Counter(plans).most_common()],
        "candidate_steps_median": float(np.median([n * s for n, s in plans])),
        "spot_devices_mean": float(np.mean(devices)) if devices else None,
        "kendall_tau": taus, "selected_reward_std": float(np.mean(selected)) if selected else None,
    }


def summarise_exploration(outcomes: list[dict[str, Any]], mode: str, reference_std: float | None,
                          staleness_floor: float, largest_n: int) -> dict[str, Any] | None:
    """The plan, τ and std of ``mode``'s runs together (None: no run of it explored).

    ``largest_n``: the planner grid's largest N; picked most, it is the grid that bounds exploration, not
    the spot devices' budget.
    """
    runs = [o for o in outcomes if o["mode"] == mode and o.get("exploration")]
    if not runs:
        return None
    plans: Counter[tuple[int, int]] = Counter()
    for run in runs:
        plans.update({(n, s): count for n, s, count in run["exploration"]["plans"]})
    taus = [tau for run in runs for tau in run["exploration"]["kendall_tau"]]
    std = float(np.mean([run["group_reward_std"] for run in runs]))
    (top_n, top_s), top_count = plans.most_common(1)[0]
    return {
        "runs": len(runs), "spot_devices": runs[0].get("spot_devices"),
        "most_picked": {"num_candidates": top_n, "num_steps": top_s, "share": top_count / sum(plans.values()),
                        "largest_n_of_grid": top_n == largest_n},
        "plans": [[n, s, count] for (n, s), count in plans.most_common()],
        "candidate_steps_median": float(np.median([run["exploration"]["candidate_steps_median"] for run in runs])),
        "kendall_tau": {"mean": float(np.mean(taus)) if taus else None, "min": min(taus, default=None),
                        "max": max(taus, default=None), "checks": len(taus), "floor": staleness_floor},
        "group_reward_std": std, "sync_explore_group_reward_std": reference_std,
        "above_sync_explore": None if reference_std is None else std > reference_std,
        "selected_reward_std": _mean([run["exploration"]["selected_reward_std"] for run in runs]),
    }


def reference_rows(path: Path) -> tuple[float | None, float | None]:
    """sync-explore's group reward std and vanilla's median iterations to target in an earlier
    time_to_target JSON (None where it has no such file or row)."""
    if not path.is_file():
        return None, None
    summary = json.loads(path.read_text()).get("summary", {})
    return (summary.get("sync-explore", {}).get("group_reward_std"),
            summary.get("vanilla", {}).get("iterations_to_target", {}).get("median"))


def predict(run_dir: Path, reference: Path, stale_tau: float | None) -> dict[str, Any]:
    """The simulator's iterations and time to target for vanilla and spotlight in ``run_dir``'s 1 + N setting.

    α is fitted to ``reference``'s runs and vanilla needs its median iterations (the 1 + 1 table: the
    same task, seeds and target); ``stale_tau`` is the run's measured staleness τ (None: the signal
    model's assumed 0.8). {"error": why} where the run has nothing to time (too short) or no fit.
    """
    from benchmarks.sim.sim_vs_runtime import MeasuredRun, measured_times, sim_config
    from benchmarks.sim.simulate_paper_scale import with_fields
    from spotlight.modes import Mode
    from spotlight.sim.simulator import simulate

    _, vanilla_iterations = reference_rows(reference)
    if vanilla_iterations is None:
        return {"error": f"{reference} has no vanilla median iterations to give the simulator"}
    try:
        run = MeasuredRun(run_dir)
        times, _ = measured_times(run)
    except SystemExit as error:  # sim_vs_runtime's one line: nothing to time in this run
        return {"error": str(error)}
    sim, trace = sim_config(run, times, len(run.records))
    sim = with_fields(sim, loop={"stop_at_target": True, "max_iterations": 1000},
                      convergence={"measured": str(reference), "vanilla_iterations": vanilla_iterations})
    if stale_tau is not None:  # the signal model's staleness error, as the monitor measured it
        sim = with_fields(sim, signal={"stale_kendall_tau": min(1.0, max(1e-3, stale_tau))})
    results = {mode.value: simulate(with_fields(sim, mode=mode), trace=trace).summary()
               for mode in (Mode.VANILLA, Mode.SPOTLIGHT)}
    out = {mode: {"iterations_to_target": r["iterations_to_target"],
                  "wall_s_to_target": r["time_to_target_h"] * 3600 if r["reached"] else None,
                  "mean_iteration_s": r["mean_iteration_s"], "mean_group_std": r["mean_group_std"],
                  "mean_random_std": r["mean_random_std"]} for mode, r in results.items()}
    vanilla, spotlight = out["vanilla"]["wall_s_to_target"], out["spotlight"]["wall_s_to_target"]
    return {"alpha": results["spotlight"]["alpha"], "alpha_source": results["spotlight"]["alpha_source"],
            "vanilla_iterations": vanilla_iterations, "stale_kendall_tau": sim.signal.stale_kendall_tau,
            "stale_kendall_tau_measured": stale_tau is not None, "measured_times": times, "modes": out,
            "wall_vs_vanilla": spotlight / vanilla if vanilla and spotlight else None}


def summarise_predictions(outcomes: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Medians over the spotlight runs' predictions (each kept in its run, so merged seeds keep theirs)."""
    predictions = [o["prediction"] for o in outcomes if o["mode"] == "spotlight" and o.get("prediction")]
    usable = [p for p in predictions if "error" not in p]
    if not usable:
        return {"error": predictions[-1]["error"]} if predictions else None

    def median(values: list[float | None]) -> float | None:
        kept = [v for v in values if v is not None]
        return float(np.median(kept)) if kept else None

    first = usable[0]
    return {"runs": len(usable), "alpha": first["alpha"], "alpha_source": first["alpha_source"],
            "vanilla_iterations": first["vanilla_iterations"],
            "stale_kendall_tau": median([p["stale_kendall_tau"] for p in usable]),
            "stale_kendall_tau_measured": all(p["stale_kendall_tau_measured"] for p in usable),
            "modes": {mode: {key: median([p["modes"][mode][key] for p in usable])
                             for key in ("iterations_to_target", "wall_s_to_target")}
                      for mode in ("vanilla", "spotlight")},
            "wall_vs_vanilla": median([p["wall_vs_vanilla"] for p in usable])}


def format_report(summary: dict[str, Any] | None, prediction: dict[str, Any] | None,
                  measured: dict[str, dict[str, Any]]) -> str:
    """The report as text: the plan, τ, std against sync-explore's, then prediction beside measurement."""
    if summary is None:
        return "exploration: no spotlight run explored (nothing to report)"
    top, tau = summary["most_picked"], summary["kendall_tau"]
    reference = summary["sync_explore_group_reward_std"]
    lines = [
        f"exploration at 1 + {summary['spot_devices']} ({summary['runs']} spotlight run(s)):",
        f"  plan: N x S = {top['num_candidates']} x {top['num_steps']} most picked ({top['share']:.0%} of explored "
        f"iterations); median N*S {summary['candidate_steps_median']:.0f}; all: "
        + ", ".join(f"{n}x{s}:{c}" for n, s, c in summary["plans"][:6])
        + (" (the grid's largest N: the grid, not the budget, bounds it)" if top["largest_n_of_grid"] else ""),
        f"  stale ranking: Kendall tau {_cell(tau['mean'])} [{_cell(tau['min'])}-{_cell(tau['max'])}] over "
        f"{tau['checks']} checks (floor {tau['floor']:.2f})",
        f"  chosen groups' reward std {summary['group_reward_std']:.3f} vs sync-explore's "
        f"{_cell(reference, 3)}" + ("" if reference is None else
                                    f": {'above' if summary['above_sync_explore'] else 'not above'}"),
    ]
    if prediction is None:
        lines.append("  simulator: no prediction (no spotlight run directory)")
    elif "error" in prediction:
        lines.append(f"  simulator: no prediction ({prediction['error']})")
    else:
        tau_source = "measured" if prediction["stale_kendall_tau_measured"] else "assumed: no check measured"
        lines.append(f"  simulator, median of {prediction['runs']} run(s)' (alpha {prediction['alpha']:.2f}, "
                     f"{prediction['alpha_source']}; stale tau {prediction['stale_kendall_tau']:.2f}, {tau_source}; "
                     f"vanilla {prediction['vanilla_iterations']:.0f} iterations) vs measured:")
        lines.append(f"    {'mode':10s} {'iters sim':>9s} {'iters meas':>10s} {'wall s sim':>10s} {'wall s meas':>11s}")
        for mode, row in prediction["modes"].items():
            real = measured.get(mode, {})
            lines.append(f"    {mode:10s} {_cell(row['iterations_to_target'], 0):>9s} "
                         f"{_cell(real.get('iterations'), 0):>10s} {_cell(row['wall_s_to_target'], 1):>10s} "
                         f"{_cell(real.get('wall_s'), 1):>11s}")
        lines.append(f"    spotlight wall vs vanilla: simulated {_cell(prediction['wall_vs_vanilla'])}, "
                     f"measured {_cell(measured.get('spotlight', {}).get('wall_vs_vanilla'))}")
    return "\n".join(lines)


def _mean(values: list[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return float(np.mean(kept)) if kept else None


def _cell(value: float | None, digits: int = 2) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"
