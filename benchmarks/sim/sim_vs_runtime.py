"""The simulator against the runtime: replay a measured local `spotlight train` run and compare.

For each run directory (default: one made here by a short `spotlight train`), the simulator gets
the run's own cluster, trace and measured times, simulates the same number of iterations in the
same mode, and the two are compared on wall time of the loop (or time to a target accuracy when
the run reached one), spot and on-demand utilisation, and spot utilisation during training.

    nice -n 10 .venv/bin/python benchmarks/sim/sim_vs_runtime.py                      # makes a run (8 iterations)
    nice -n 10 .venv/bin/python benchmarks/sim/sim_vs_runtime.py runs/train --target 0.25

What is taken from the run (metrics.jsonl: per-iteration records; events.jsonl: the run's clock):
- devices: 1 on-demand + runtime.num_spot_devices spot devices (one per logical node, SP 1);
- trace: runtime.trace clipped to the spot nodes exactly as the runtime does (`Availability.clipped`),
  scaled by runtime.time_scale, and windowed to start where the loop started: the run spends its
  first seconds validating the base model while the trace already runs, and the simulator has no
  validation phase. Validation after the first iteration (every eval.every) is not removed, so
  runs longer than eval.every iterations drift against the trace by the validation time;
- notice: runtime.grace_s (the runtime's notice → removal), elastic recovery with no re-forming cost
  (SP 1: a survivor has nothing to re-form);
- spot_sample_step_s: Σ spot `rollout` busy intervals / Σ their sample-steps; a helper's part is its
  share of `np.array_split` of the P prompts over 1 + helpers (the runtime's static split), × G × T;
- on_demand_sample_step_s: the same number. The on-demand device's own generation is not logged
  apart from its scoring and waiting, and on this machine every logical device is one thread of
  the same CPU; the table prints what helper-less iterations imply as a check;
- explore_sample_step_s: Σ spot `explore` busy intervals in a round / the round's candidate-steps:
  its own P · N · S · (1 − missed fraction), with (N, S) from the iteration the round seeded, plus
  the staleness monitor's explore.monitor_prompts · N' · S' with the previous round's plan (N', S')
  (`round_work`). The simulator queues the same monitor work in its rounds and, as the runtime,
  takes its predicted time off the planner's budget (`round_budget`) and tells the planner the
  cost only of rounds that finished;
- train_s: mean time/train_s (the GRPO update; also the planner's budget in both);
- broadcast_s: mean time/seeds_s, the critical-path hand-off of θ_i to the spot devices before the
  rollout (in spotlight mode the seeds are ready, so this is the weight load); weight_copy_s: a
  joining node's added → its first weight load done, over the nodes up before their next removal.
  The runtime's device loads the current weights as soon as it is up (`SpotPool.poll`), not at the
  next iteration, so this is the device's start-up (a Ray worker process, imports, the model) plus
  one load; the simulator makes a joining device unusable, and billed, for that long.
- score_candidate_s: per round, the trainer's time/explore_wait_s less the round's overrun (its last
  explore busy interval's end − training's end, if later), over the round's P · N candidates: the
  time `_close_round` takes to score them (the monitor's re-scores folded in);
- explore_wait_s (the trainer's wait for an overrunning round) and the planner's first budget
  (explore.initial_budget_s) are the run's settings; later budgets are the previous update's time
  in both;
- the batch of the simulator's rollout padding is one prompt's group (G samples): the runtime splits
  prompts statically, so the rollout lasts as long as the largest part, ⌈P / devices⌉ prompts.

Two variants are simulated, both reported. `mean times`: every iteration takes the run's mean
times above. `per-iteration times`: iteration i replays its own measured times
(`MeasuredTimes.per_iteration`): train_s = its time/train_s, broadcast_s = its time/seeds_s, the
rollout sample-step = its spot rollout busy time / its spot rollout work (the mean when no spot
device helped it), and the exploration sample-step of the round opened during it (the mean when
none ran). The shared machine's speed changed during a run (other jobs on the same 2 cores), which
one mean time per phase cannot follow; the replay takes that noise out, so what is left of a gap is
the loop's decisions (planner, waits, preemptions). Nothing in either is fitted to the outcome.

Measured, over the loop's windows [start, end] of each iteration (start = end − seeds − rollout −
train − explore_wait, i.e. without validation and checkpoints between iterations): loop wall time =
Σ window lengths; spot utilisation = busy / held spot device-seconds from events.jsonl (busy =
rollout, explore and weight loads, as the runtime's ledger counts); on-demand utilisation =
Σ util/on_demand × window / Σ window; spot utilisation while training = the same over
[rollout end, train end]. The simulator's numbers use the same busy phases (its `broadcast` included
for spot); on-demand busy is rollout and training only, as the runtime's ledger books it (the
scoring in `_close_round` is not booked busy there, so it is idle in both). Time to target: with
--target, the first validation reaching it sets the iteration count; the simulated time is the
simulated end of that iteration (the simulator's convergence law is not calibrated to this task, so
the iteration count is taken from the run, and only the time per iteration is compared).

Prints a table (measured, simulated, relative error) and writes benchmarks/results/sim_vs_runtime.json.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from spotlight.config import TrainConfig, load_config, parse_config
from spotlight.market.traces import Availability, resolve_trace
from spotlight.sim.results import SimResult
from spotlight.sim.sim_config import SimConfig
from spotlight.sim.simulator import simulate
from spotlight.sim.spot_timeline import SpotTimeline

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `benchmarks.*` imports

from benchmarks.provenance import REPO, RESULTS, git_commit, machine

TOLERANCE = 0.15
TOLERANCED = ("loop_s", "util_spot", "util_on_demand", "util_spot_train_phase")  # the targets


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def overlap(intervals: list[tuple[float, float]], windows: list[tuple[float, float]]) -> float:
    """Σ over intervals and windows of the length of their intersection."""
    return sum(max(0.0, min(b, w1) - max(a, w0)) for a, b in intervals for w0, w1 in windows)


class MeasuredRun:
    """A runtime run directory: its config, per-iteration records and events on the run's clock."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.config = load_config(TrainConfig, run_dir / "config.yaml", [])
        self.records = [r for r in read_jsonl(run_dir / "metrics.jsonl") if r.get("iteration", 0) >= 1
                        and "time/iteration_s" in r]
        self.validation = [r for r in read_jsonl(run_dir / "metrics.jsonl") if "val/strict_accuracy" in r]
        self.events = read_jsonl(run_dir / "events.jsonl")
        if not self.records:
            raise SystemExit(f"{run_dir}: no iteration records in metrics.jsonl; did the run finish an iteration?")
        ends = np.cumsum([r["time/iteration_s"] for r in self.records])  # the runtime's clock: 0 = run start
        loops = [r["time/seeds_s"] + r["time/rollout_s"] + r["time/train_s"] + r["time/explore_wait_s"]
                 for r in self.records]
        self.windows = [(float(e - loop), float(e)) for e, loop in zip(ends, loops, strict=True)]
        self.train_windows = [(s + r["time/seeds_s"] + r["time/rollout_s"], e - r["time/explore_wait_s"])
                              for (s, e), r in zip(self.windows, self.records, strict=True)]
        self.busy = [(e["start"], e["end"], e["phase"], e["device"]) for e in self.events if e["kind"] == "busy"]
        self.held = self._held()

    def _held(self) -> list[tuple[float, float]]:
        """Held intervals of the spot devices (one per node): node added → node removed (or the run's end)."""
        end = self.windows[-1][1]
        since: dict[str, float] = {}
        held = []
        for event in self.events:
            if event["kind"] == "node_added":
                since[event["node"]] = event["t"]
            elif event["kind"] == "node_removed" and event["node"] in since:
                held.append((since.pop(event["node"]), event["t"]))
        return held + [(t, end) for t in since.values()]

    def in_window(self, k: int, phase: str) -> list[tuple[float, float, str]]:
        s, e = self.windows[k]
        return [(a, b, device) for a, b, p, device in self.busy if p == phase and s - 1e-3 <= a < e]


def round_work(run: MeasuredRun, k: int) -> float:
    """Candidate-steps done by the round opened in iteration k (it seeds k + 1): its own, less the
    missed fraction, plus the staleness monitor's re-score of the previous round's first prompts
    with that round's plan (queued after the own candidates, so counted only when none was missed)."""
    prompts, seeded = run.config.rollout.prompts_per_iteration, run.records[k + 1]
    missed = seeded.get("explore/missed_fraction", 0.0)
    work = prompts * seeded["planner/num_candidates"] * seeded["planner/num_steps"] * (1.0 - missed)
    previous = run.records[k]
    if "planner/num_candidates" in previous and missed == 0.0:
        shown = min(run.config.explore.monitor_prompts, prompts)
        work += shown * previous["planner/num_candidates"] * previous["planner/num_steps"]
    return work


def measured_times(run: MeasuredRun) -> tuple[dict[str, float], dict[str, Any]]:
    """The MeasuredTimes fields from the run (module docstring), and diagnostics behind them."""
    config = run.config
    prompts, group, steps = config.rollout.prompts_per_iteration, config.rollout.group_size, config.rollout.num_steps
    rollout_s, rollout_work, implied_od = 0.0, 0, []
    explore_s, explore_work = 0.0, 0.0
    for k, record in enumerate(run.records):
        parts = run.in_window(k, "rollout")
        sizes = [len(part) for part in np.array_split(np.arange(prompts), 1 + len(parts))]
        rollout_s += sum(b - a for a, b, _ in parts)
        rollout_work += sum(sizes[1:]) * group * steps
        if not parts:  # the on-demand device rolled out alone: an upper bound of its step (scoring included)
            implied_od.append(record["time/rollout_s"] / (prompts * group * steps))
        if k + 1 < len(run.records) and "planner/num_candidates" in run.records[k + 1]:
            explore_s += sum(b - a for a, b, _ in run.in_window(k, "explore"))
            explore_work += round_work(run, k)
    if rollout_work == 0:
        raise SystemExit(f"{run.run_dir}: no spot device helped a rollout; the spot step time cannot be measured")
    sample_step = rollout_s / rollout_work
    joins = []
    for event in run.events:
        if event["kind"] == "node_added" and event["t"] > 0:  # this incarnation: up to the node's next removal
            gone = min((e["t"] for e in run.events if e["kind"] == "node_removed" and e["node"] == event["node"]
                        and e["t"] > event["t"]), default=math.inf)
            loads = [e["end"] for e in run.events if e["kind"] == "busy" and e["phase"] == "broadcast"
                     and e["node"] == event["node"] and event["t"] <= e["start"] < gone]
            if loads:  # a node removed before it was up never loaded: no start-up to time
                joins.append(min(loads) - event["t"])
    score_s, scored = 0.0, 0
    for k, record in enumerate(run.records):
        if k + 1 < len(run.records) and "planner/num_candidates" in run.records[k + 1]:
            train_end = run.train_windows[k][1]
            last = max((b for _, b, _ in run.in_window(k, "explore")), default=train_end)
            score_s += record["time/explore_wait_s"] - max(0.0, last - train_end)
            scored += prompts * int(run.records[k + 1]["planner/num_candidates"])
    fields = {
        "on_demand_sample_step_s": sample_step,
        "spot_sample_step_s": sample_step,
        "explore_sample_step_s": explore_s / explore_work if explore_work > 0 else None,
        "train_s": float(np.mean([r["time/train_s"] for r in run.records])),
        "broadcast_s": float(np.mean([r["time/seeds_s"] for r in run.records])),
        "weight_copy_s": float(np.mean(joins)) if joins else None,
        "score_candidate_s": max(0.0, score_s / scored) if scored else 0.0,
    }
    diagnostics = {
        "on_demand_step_implied_by_solo_rollouts_s": float(np.mean(implied_od)) if implied_od else None,
        "train_s_range": [min(r["time/train_s"] for r in run.records), max(r["time/train_s"] for r in run.records)],
        "explore_wait_s_mean": float(np.mean([r["time/explore_wait_s"] for r in run.records])),
        "rollout_parts_timed": int(sum(len(run.in_window(k, "rollout")) for k in range(len(run.records)))),
        "joins_timed": len(joins),
    }
    return fields, diagnostics


def per_iteration_times(run: MeasuredRun) -> list[dict[str, float | None]]:
    """Each iteration's own times (module docstring, `per-iteration times`); None keeps the mean."""
    config = run.config
    prompts, group, steps = config.rollout.prompts_per_iteration, config.rollout.group_size, config.rollout.num_steps
    entries = []
    for k, record in enumerate(run.records):
        parts = run.in_window(k, "rollout")
        sizes = [len(part) for part in np.array_split(np.arange(prompts), 1 + len(parts))]
        rollout_work = sum(sizes[1:]) * group * steps
        sample_step = sum(b - a for a, b, _ in parts) / rollout_work if parts else None
        explore_step = None
        if k + 1 < len(run.records) and "planner/num_candidates" in run.records[k + 1]:
            work = round_work(run, k)
            busy = sum(b - a for a, b, _ in run.in_window(k, "explore"))
            explore_step = busy / work if work > 0 and busy > 0 else None
        entries.append({"on_demand_sample_step_s": sample_step, "spot_sample_step_s": sample_step,
                        "explore_sample_step_s": explore_step, "train_s": record["time/train_s"],
                        "broadcast_s": record["time/seeds_s"]})
    return entries


def measured_outcome(run: MeasuredRun, iterations: int) -> dict[str, float]:
    """Loop wall time and utilisation over the first `iterations` iterations (module docstring)."""
    windows, train_windows = run.windows[:iterations], run.train_windows[:iterations]
    busy = [(a, b) for a, b, _, _ in run.busy]
    loop_s = sum(e - s for s, e in windows)
    od_busy = sum(r["util/on_demand"] * (e - s) for r, (s, e) in zip(run.records, windows, strict=False))
    return {
        "loop_s": loop_s,
        "util_spot": overlap(busy, windows) / max(1e-9, overlap(run.held, windows)),
        "util_on_demand": od_busy / loop_s,
        "util_spot_train_phase": overlap(busy, train_windows) / max(1e-9, overlap(run.held, train_windows)),
        "mean_rollout_s": float(np.mean([r["time/rollout_s"] for r in run.records[:iterations]])),
        "explore_wait_s": float(sum(r["time/explore_wait_s"] for r in run.records[:iterations])),
    }


def sim_config(run: MeasuredRun, times: dict[str, Any], iterations: int) -> tuple[SimConfig, Availability]:
    """The SimConfig and trace of the run's loop (module docstring)."""
    config, runtime = run.config, run.config.runtime
    planner = config.explore.planner or runtime.planner
    trace = resolve_trace(runtime.trace, "runtime.trace").clipped(runtime.num_spot_devices)
    start_s = run.windows[0][0] / runtime.time_scale  # in trace seconds
    trace = trace.window(start_s, trace.duration_s)
    sim = parse_config(SimConfig, {
        "mode": config.mode,
        "seed": config.seed,
        "cluster": {
            "on_demand_devices": 1, "spot_devices": runtime.num_spot_devices,
            "on_demand_instance": runtime.prices.instance, "spot_instance": runtime.prices.instance,
            "trace": str(runtime.trace), "trace_time_scale": runtime.time_scale, "notice_s": runtime.grace_s,
            "recovery": "elastic", "elastic_reconfigure_s": 0.0,
        },
        "workload": {"sp_degree": 1, "batch_size": config.rollout.group_size,
                     "rollout_steps": config.rollout.num_steps, "measured": times},
        "loop": {"prompts_per_iteration": config.rollout.prompts_per_iteration,
                 "group_size": config.rollout.group_size, "max_iterations": iterations, "stop_at_target": False,
                 "explore_wait_s": runtime.explore_wait_s, "initial_budget_s": config.explore.initial_budget_s,
                 "monitor_prompts": config.explore.monitor_prompts},
        "planner": planner.model_dump(),
    })
    return sim, trace


def simulated_outcome(result: SimResult, sim: SimConfig, trace: Availability, iterations: int) -> dict[str, float]:
    """The same quantities as `measured_outcome`, from the simulation (busy phases as the runtime counts them)."""
    records = result.timeline[:iterations]
    spot = SpotTimeline(trace, sim.cluster.spot_devices, sim.cluster.trace_time_scale, 1)
    usage = result.usage
    spot_busy = sum(usage["spot"].device_seconds[p] for p in ("rollout", "explore", "broadcast"))
    od_busy = sum(usage["on_demand"].device_seconds[p] for p in ("rollout", "train"))
    train_ends = [r.end_s - r.broadcast_s - r.explore_wait_s for r in records]
    train_held = sum(spot.live_device_seconds(end - r.train_s, end) for r, end in zip(records, train_ends, strict=True))
    return {
        "loop_s": records[-1].end_s,
        "util_spot": spot_busy / max(1e-9, usage["spot"].rented_device_s),
        "util_on_demand": od_busy / max(1e-9, usage["on_demand"].rented_device_s),
        "util_spot_train_phase": sum(r.spot_explore_train_s for r in records) / max(1e-9, train_held),
        "mean_rollout_s": float(np.mean([r.rollout_s for r in records])),
        "explore_wait_s": float(sum(r.explore_wait_s for r in records)),
    }


def make_run(run_dir: Path, iterations: int, extra: list[str]) -> None:
    """A short `spotlight train` run in `run_dir` (replaced)."""
    command = [str(REPO / ".venv" / "bin" / "spotlight"), "train", "-s", f"iterations={iterations}",
               "-s", f"run_dir={run_dir}", *[arg for s in extra for arg in ("-s", s)]]
    print("running:", " ".join(command), flush=True)
    subprocess.run(command, check=True, cwd=REPO)


def compare(run_dir: Path, target: float | None) -> dict[str, Any]:
    run = MeasuredRun(run_dir)
    iterations, reached = len(run.records), None
    if target is not None:
        reached = next((r["iteration"] for r in run.validation if r["iteration"] >= 1
                        and r["val/strict_accuracy"] >= target), None)
        iterations = reached or iterations
    times, diagnostics = measured_times(run)
    measured = measured_outcome(run, iterations)
    variants = {}
    for variant, replay in (("mean_times", None), ("per_iteration_times", per_iteration_times(run))):
        sim, trace = sim_config(run, {**times, "per_iteration": replay}, iterations)
        started = time.perf_counter()
        result = simulate(sim, trace=trace)
        simulate_s = time.perf_counter() - started
        simulated = simulated_outcome(result, sim, trace, iterations)
        rows = {key: {"measured": measured[key], "simulated": simulated[key],
                      "relative_error": (simulated[key] - measured[key]) / measured[key] if measured[key] else math.nan}
                for key in measured}
        variants[variant] = {
            "comparison": rows,
            "within_tolerance": all(abs(row["relative_error"]) <= TOLERANCE for key, row in rows.items()
                                    if key in TOLERANCED),
            "simulated_spot_removed": sum(r.spot_removed for r in result.timeline),
            "simulated_plans": [r.plan for r in result.timeline],
            "simulated_explore_wait_s": [r.explore_wait_s for r in result.timeline],
            "simulate_s": simulate_s,
        }
    return {
        "run_dir": str(run_dir), "mode": run.config.mode, "iterations": iterations,
        "time_measure": (f"time to target {target} (reached at iteration {reached})" if reached else
                         f"time for {iterations} iterations" + (f" (target {target} not reached)" if target else "")),
        "spot_devices": run.config.runtime.num_spot_devices, "trace": run.config.runtime.trace,
        "time_scale": run.config.runtime.time_scale, "loop_start_s": run.windows[0][0],
        "preemption_notices": sum(1 for e in run.events if e["kind"] == "preemption_notice"),
        "measured_times": times, "per_iteration_times": per_iteration_times(run)[:iterations],
        "diagnostics": diagnostics, "variants": variants,
        "measured_plans": [(r.get("planner/num_candidates"), r.get("planner/num_steps")) for r in run.records],
        "measured_explore_wait_s": [r["time/explore_wait_s"] for r in run.records[:iterations]],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dirs", nargs="*", type=Path, help="measured runtime run directories")
    parser.add_argument("--iterations", type=int, default=8, help="iterations of the run made when none is given")
    parser.add_argument("--spot-devices", type=int, default=2, help="spot devices of the run made when none is given")
    parser.add_argument("--new-run-dir", type=Path, default=Path("/tmp/sim_vs_runtime/run"))
    parser.add_argument("--target", type=float, default=None, help="validation strict accuracy to time")
    parser.add_argument("--set", "-s", action="append", default=[], help="extra overrides for the run made here")
    args = parser.parse_args()
    run_dirs = args.run_dirs
    if not run_dirs:
        make_run(args.new_run_dir, args.iterations, [f"runtime.num_spot_devices={args.spot_devices}", *args.set])
        run_dirs = [args.new_run_dir]
    reports = [compare(run_dir, args.target) for run_dir in run_dirs]
    names = {"loop_s": "loop wall time (s)", "util_spot": "spot utilisation", "util_on_demand": "on-demand utilisation",
             "util_spot_train_phase": "spot util. while training", "mean_rollout_s": "mean rollout (s)",
             "explore_wait_s": "trainer's explore wait (s)"}
    for report in reports:
        mean, replay = report["variants"]["mean_times"], report["variants"]["per_iteration_times"]
        print(f"\n{report['run_dir']}: mode {report['mode']}, 1 on-demand + {report['spot_devices']} spot, "
              f"{report['time_measure']}, {report['preemption_notices']} preemption notices measured, "
              f"{mean['simulated_spot_removed']} / {replay['simulated_spot_removed']} spot removals simulated")
        print(f"{'':<28} {'':>10} {'sim: mean times':>22} {'sim: per-iteration times':>26}")
        print(f"{'quantity':<28} {'measured':>10} {'simulated':>10} {'rel. err':>10} "
              f"{'simulated':>12} {'rel. err':>12}")
        for key in mean["comparison"]:
            a, b = mean["comparison"][key], replay["comparison"][key]
            print(f"{names[key]:<28} {a['measured']:>10.3f} {a['simulated']:>10.3f} {a['relative_error']:>+10.1%} "
                  f"{b['simulated']:>12.3f} {b['relative_error']:>+12.1%}")
        times = report["measured_times"]
        print("measured times:", {k: (round(v, 4) if v is not None else None) for k, v in times.items()})
        print(f"within 15% ({', '.join(TOLERANCED)}): mean times {mean['within_tolerance']}, "
              f"per-iteration times {replay['within_tolerance']}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "sim_vs_runtime.json"
    out.write_text(json.dumps({"commit": git_commit(), "machine": machine(), "args": {
        **{k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "run_dirs"},
        "run_dirs": [str(p) for p in run_dirs]}, "tolerance": TOLERANCE, "runs": reports}, indent=2, default=str))
    print(f"\nwrote {out.relative_to(REPO)}", file=sys.stderr)


if __name__ == "__main__":
    main()
