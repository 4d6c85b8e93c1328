"""Spotlight's headline on this machine: wall time, dollars and iterations to a validation target, per mode.

Modes, each a real `spotlight train` run in its own process with one core per device (pinned, one
thread each; `spotlight/cores.py`):

    vanilla        1 device: random seeds
    sync-explore   1 device: seed exploration with the current weights on the critical path
    spot-rollout   1 on-demand + N spot devices (Ray, the spot trace): the spot devices help the rollout
    spotlight      1 on-demand + N spot devices (Ray, the spot trace): stale exploration on the spot
                   devices while the trainer trains, and rollout help

N is ``--spot-devices`` (1: the 2-core table). A spot mode's run takes 1 + N + C cores
(`core_plan.py`): the trainer's alone, one per spot device, and C (``--control-cores``; default every
core the runs leave) for Ray's control plane, on which no device runs; C = 0 puts Ray on the spot
devices' cores, as on a 2-core machine. 1 + N + C beyond ``--cores`` is refused.

The target is fixed before any run: the shipped base model's validation strict accuracy (measured
here with the same validation settings) plus ``--gain``. A run stops at the first validation that
reaches it (``eval.target_accuracy``) or at ``--max-wall-s`` of training. Time is the iterations' own
wall time (`time/wall_s`: validation left out, as it is a measurement). Dollars are the devices held
during those iterations at the run's prices (on-demand price for the trainer; spot price per spot
device held), so both sides are billed for the same seconds.

    .venv/bin/python benchmarks/learning/time_to_target.py --seeds 0 1 2 3 4
    .venv/bin/python benchmarks/learning/time_to_target.py --reward strict --seeds 0 1 2   # binary strict reward
    python benchmarks/learning/time_to_target.py --modes vanilla spotlight --spot-devices 8 --pair \
        --out benchmarks/results/time_to_target_1x8.json      # 16 cores: benchmarks/learning/run_1x8.sh

Runs go one at a time on an otherwise idle machine (``--pair`` runs two one-device runs side by side,
faster and less honest: they share memory bandwidth and caches). Each run records the load average
at its start and end, the machine (CPU model, cores) and the commit. Prints the table and its
decomposition (`benchmarks/learning/decomposition.py`: iterations × seconds per iteration, per phase, ratios to
vanilla, the free-exploration ceiling and what the spot cores buy), the planner's and the
exploration's report with the simulator's prediction for the same 1 + N (`exploration_report.py`),
writes JSON (commit, machine, every run's curve) and a PNG of the curves to benchmarks/results/.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from spotlight.components.checkpoint import load_model
from spotlight.config import TrainConfig, load_config
from spotlight.cores import available_cores, pinned
from spotlight.loop.evaluation import evaluate
from spotlight.market.prices import default_prices
from spotlight.task_presets import get_task

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `benchmarks.*` imports

from benchmarks.learning.core_plan import SPOT_MODES, CorePlan, plan_cores
from benchmarks.learning.decomposition import affordable_candidates, decompose, format_table, phase_seconds
from benchmarks.learning.exploration_report import (
    exploration_stats,
    format_report,
    predict,
    reference_rows,
    summarise_exploration,
    summarise_predictions,
)
from benchmarks.provenance import REPO, RESULTS, git_commit, machine

MODES = ("vanilla", "sync-explore", "spot-rollout", "spotlight")
LOAD_FILE = "load_average.json"  # a run's load average at its start and end, kept beside its metrics
REWARDS = {"mixed": "reward.strict_weight=0.5", "strict": "reward.strict_weight=1.0"}


@dataclass
class Job:
    mode: str
    seed: int
    run_dir: Path
    overrides: list[str]
    process: subprocess.Popen | None = None
    cores: list[int] | None = None
    load_average: dict[str, float] | None = None

    @property
    def finished(self) -> bool:
        """It ran to its end (or, with --analyse-only, an earlier invocation left its metrics)."""
        if self.process is None:
            return (self.run_dir / "metrics.jsonl").is_file()
        return self.process.returncode == 0


def base_accuracy(overrides: list[str], core: int) -> tuple[float, float]:
    """Validation strict accuracy (and its standard error) of the base model under the runs' settings."""
    config = load_config(TrainConfig, None, overrides)
    task = get_task(config.task)
    with pinned(core):
        result = evaluate(load_model(config.base_checkpoint), task.split()[1],
                          task.make_reward(config.reward.strict_weight), config.eval.seeds_per_prompt,
                          config.eval.num_steps, config.rollout.shift)
    return result.strict_accuracy, result.strict_accuracy_se


def start(job: Job, cores: list[int], plan: CorePlan, log_dir: Path) -> None:
    shutil.rmtree(job.run_dir, ignore_errors=True)
    placed = [*job.overrides, *plan.overrides(job.mode, cores), f"run_dir={job.run_dir}"]
    command = [sys.executable, "-m", "spotlight", "train", *(arg for o in placed for arg in ("-s", o))]
    log = (log_dir / f"{job.mode}-seed{job.seed}.log").open("w")
    job.process = subprocess.Popen(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    job.cores = cores
    job.load_average = {"start": os.getloadavg()[0]}


def run_all(jobs: list[Job], log_dir: Path, cores: list[int], plan: CorePlan, pair: bool) -> None:
    """Run the jobs in order: alone, or with ``pair`` side by side while their cores (``plan``) fit ``cores``."""
    free, running, waiting = list(cores), [], list(jobs)
    while waiting or running:
        for job in list(running):
            if job.process.poll() is not None:
                running.remove(job)
                job.load_average["end"] = os.getloadavg()[0]
                (job.run_dir / LOAD_FILE).write_text(json.dumps(job.load_average))  # for --analyse-only
                free.extend(job.cores)
                status = "ok" if job.process.returncode == 0 else f"FAILED (exit {job.process.returncode})"
                print(f"  done {job.mode} seed {job.seed}: {status}", flush=True)
        while waiting and len(free) >= plan.cores_needed(waiting[0].mode) and (pair or not running):
            job = waiting.pop(0)
            need = plan.cores_needed(job.mode)
            cores, free = sorted(free)[:need], sorted(free)[need:]
            start(job, cores, plan, log_dir)
            running.append(job)
            print(f"  start {job.mode} seed {job.seed} on cores {cores}", flush=True)
        time.sleep(2.0)


def dollars(records: list[dict], prices: dict[str, float]) -> list[float]:
    """Cumulative dollars after each record: the trainer at on-demand price, each spot device held at spot."""
    total, previous_wall, out = 0.0, 0.0, []
    for record in records:
        step_s = record["time/wall_s"] - previous_wall
        previous_wall = record["time/wall_s"]
        spot = record.get("runtime/spot_devices", 0.0)
        total += step_s / 3600 * (prices["on_demand_per_hour"] + spot * prices["spot_per_hour"])
        out.append(total)
    return out


def outcome(job: Job, target: float, prices: dict[str, float], reference: Path | None) -> dict:
    """One run's curve and when it reached the target (None where it did not); a spotlight run's exploration,
    and the simulator's prediction for its 1 + N setting with α fitted to ``reference``'s runs (None: none)."""
    records = [json.loads(line) for line in (job.run_dir / "metrics.jsonl").read_text().splitlines()]
    spent = dollars(records, prices)
    curve = [{"iteration": r["iteration"], "wall_s": r["time/wall_s"], "usd": usd,
              "strict": r["val/strict_accuracy"], "se": r["val/strict_accuracy_se"]}
             for r, usd in zip(records, spent, strict=True) if "val/strict_accuracy" in r]
    reached = next((point for point in curve[1:] if point["strict"] >= target), None)
    trained = [r for r in records[1:] if "rollout/group_reward_std" in r]
    config = load_config(TrainConfig, job.run_dir / "config.yaml")
    candidates = [r["planner/num_candidates"] for r in trained if "planner/num_candidates" in r]
    explored = exploration_stats(records, None)  # every iteration, as group_reward_std: the planner's picks
    return {
        "mode": job.mode, "seed": job.seed, "curve": curve, "reached": reached is not None,
        "wall_s_to_target": reached["wall_s"] if reached else None,
        "usd_to_target": reached["usd"] if reached else None,
        "iterations_to_target": reached["iteration"] if reached else None,
        "final_strict": curve[-1]["strict"], "train_wall_s": records[-1]["time/wall_s"],
        "group_reward_std": float(np.mean([r["rollout/group_reward_std"] for r in trained])),
        "zero_std_groups": float(np.mean([r.get("rollout/zero_std_groups", 0.0) for r in trained])),
        "phases": phase_seconds(records, reached["iteration"] if reached else None),
        "explore_candidates": (float(np.mean(candidates)) if candidates
                               else float(config.explore.num_candidates) if job.mode == "sync-explore" else None),
        "spot_devices": config.runtime.num_spot_devices if job.mode in SPOT_MODES else 0,
        "cores": job.cores, "control_cores": config.control_cores,
        "exploration": explored,
        "prediction": (predict(job.run_dir, reference, float(np.mean(explored["kendall_tau"]))
                               if explored["kendall_tau"] else None)
                       if explored and job.mode == "spotlight" and reference else None),
        "load_average": job.load_average or (json.loads((job.run_dir / LOAD_FILE).read_text())
                                             if (job.run_dir / LOAD_FILE).is_file() else None),
    }


def earlier_outcomes(path: Path, target: float, have: set[tuple[str, int]], spot_devices: int) -> list[dict]:
    """The runs recorded in an earlier JSON of this benchmark whose (mode, seed) this invocation did not run.

    Why: a run directory is scratch (a fresh machine has none), but every run's curve and phases are in
    the JSON; a seed added later joins the earlier ones without re-running them. Refused unless the
    earlier runs chased the same target (same base model, reward and validation settings) and their
    spot modes ran with as many spot devices (a JSON before --spot-devices ran 1).
    """
    if not path.is_file():
        raise SystemExit(f"--merge {path}: no such file; give a JSON this benchmark wrote (benchmarks/results/)")
    earlier = json.loads(path.read_text())
    if abs(earlier["target"] - target) > 1e-6:
        raise SystemExit(f"--merge {path}: its runs chased target {earlier['target']:.4f}, these {target:.4f}: "
                         "merge only runs with the same reward, gain and validation settings")
    kept = [run for run in earlier["runs"] if (run["mode"], run["seed"]) not in have]
    other = sorted({run.get("spot_devices", 1) for run in kept if run["mode"] in SPOT_MODES} - {spot_devices})
    if other:
        raise SystemExit(f"--merge {path}: its spot runs had {other} spot devices, these {spot_devices}: merge "
                         "only runs at the same 1 + N (give --spot-devices to match, or another --out)")
    for run in kept:
        run.setdefault("commit", earlier.get("commit"))  # where it came from, as its table row can't say
        run.setdefault("machine", earlier.get("machine"))
    return kept


def spread(values: list[float | None], runs: int) -> dict:
    """Median, min, max over the runs that reached the target; a run that did not counts as not reached."""
    reached = [v for v in values if v is not None]
    if len(reached) * 2 <= runs:  # the median run did not reach the target
        return {"median": None, "min": min(reached, default=None), "max": max(reached, default=None),
                "reached": len(reached)}
    ordered = sorted(reached) + [math.inf] * (runs - len(reached))
    return {"median": float(np.median(ordered)), "min": min(reached), "max": max(reached), "reached": len(reached)}


def summarise(outcomes: list[dict], modes: list[str]) -> dict:
    summary = {}
    for mode in modes:
        runs = [o for o in outcomes if o["mode"] == mode]
        summary[mode] = {key: spread([o[key] for o in runs], len(runs))
                         for key in ("wall_s_to_target", "usd_to_target", "iterations_to_target")}
        summary[mode]["runs"] = len(runs)
        summary[mode]["final_strict_mean"] = float(np.mean([o["final_strict"] for o in runs]))
        summary[mode]["group_reward_std"] = float(np.mean([o["group_reward_std"] for o in runs]))
    for mode in modes:
        for reference in ("vanilla", "sync-explore"):
            if reference not in summary or reference == mode:
                continue
            for key in ("wall_s_to_target", "usd_to_target", "iterations_to_target"):
                ours, theirs = summary[mode][key]["median"], summary[reference][key]["median"]
                ratio = ours / theirs if ours is not None and theirs not in (None, 0) else None
                summary[mode][f"{key}_vs_{reference}"] = ratio
    return summary


def plot(outcomes: list[dict], target: float, base: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {"vanilla": "tab:grey", "sync-explore": "tab:blue", "spot-rollout": "tab:orange", "spotlight": "tab:red"}
    figure, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    for run in outcomes:
        wall = [p["wall_s"] / 60 for p in run["curve"]]
        usd = [p["usd"] for p in run["curve"]]
        strict = [p["strict"] for p in run["curve"]]
        se = [p["se"] for p in run["curve"]]
        label = run["mode"] if run["seed"] == min(o["seed"] for o in outcomes if o["mode"] == run["mode"]) else None
        for ax, xs in ((axes[0], wall), (axes[1], usd)):
            ax.errorbar(xs, strict, yerr=se, color=colours.get(run["mode"]), alpha=0.7, marker="o", markersize=3,
                        capsize=2, label=label)
    for ax, xlabel in ((axes[0], "training wall time (min, validation left out)"), (axes[1], "dollars")):
        ax.axhline(target, color="black", linestyle="--", linewidth=1, label=f"target {target:.3f}")
        ax.axhline(base, color="black", linestyle=":", linewidth=1, label=f"base {base:.3f}")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("validation strict accuracy (EMA, ± s.e.)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    figure.suptitle("Time and dollars to target, one core per device")
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def explore_report(outcomes: list[dict], summary: dict, config: TrainConfig,
                   args: argparse.Namespace) -> tuple[dict | None, dict | None]:
    """Print and return the exploration at 1 + N and the simulator's prediction (`exploration_report.py`)."""
    sync_std, _ = reference_rows(args.reference)
    planner = config.explore.planner or config.runtime.planner
    exploration = summarise_exploration(outcomes, "spotlight", sync_std, config.explore.staleness_floor,
                                        max(planner.num_candidates))
    prediction = summarise_predictions(outcomes)
    measured = {mode: {"iterations": row["iterations_to_target"]["median"], "wall_s": row["wall_s_to_target"]["median"],
                       "wall_vs_vanilla": row.get("wall_s_to_target_vs_vanilla")} for mode, row in summary.items()}
    print("\n" + format_report(exploration, prediction, measured))
    return exploration, prediction


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    parser.add_argument("--gain", type=float, default=0.10, help="target = base validation strict accuracy + gain")
    parser.add_argument("--reward", choices=sorted(REWARDS), default="mixed",
                        help="mixed: partial credit + strict (the default); strict: the 0/1 flag alone")
    parser.add_argument("--max-wall-s", type=float, default=1200.0, help="training time cap per run")
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument("--eval-seeds", type=int, default=10, help="validation seeds per prompt (80 prompts)")
    parser.add_argument("--set", "-s", action="append", default=[], help="extra config override for every run")
    parser.add_argument("--cores", nargs="+", type=int, default=available_cores(),
                        help="cores the runs may use (default: this process's; --cores 1 leaves core 0 to another job)")
    parser.add_argument("--spot-devices", type=int, default=1,
                        help="N: spot devices behind the trainer in spot-rollout and spotlight, one core each")
    parser.add_argument("--control-cores", type=int, default=None,
                        help="C: cores for Ray's control plane, apart from every device's (default: those the runs "
                             "leave; 0: on the spot devices' cores)")
    parser.add_argument("--reference", type=Path, default=RESULTS / "time_to_target.json",
                        help="the 1 + 1 table: sync-explore's group std to compare with, and the runs the "
                             "simulator's alpha is fitted to")
    parser.add_argument("--pair", action="store_true",
                        help="runs side by side while their cores fit --cores (faster; they share memory bandwidth)")
    parser.add_argument("--runs-dir", default="runs/time-to-target")
    parser.add_argument("--out", default=None, help="default: benchmarks/results/time_to_target[_strict].json")
    parser.add_argument("--analyse-only", action="store_true",
                        help="summarise finished runs in --runs-dir (their own target) without running")
    parser.add_argument("--merge", type=Path, default=None,
                        help="an earlier JSON of this benchmark (same reward and target): its runs join the table "
                             "where this invocation has no run of that mode and seed (e.g. re-run one mode only)")
    args = parser.parse_args(argv)
    plan = plan_cores(args.modes, args.cores, args.spot_devices, args.control_cores, args.pair, available_cores())
    suffix = "" if args.reward == "mixed" else f"_{args.reward}"
    out = Path(args.out) if args.out else RESULTS / f"time_to_target{suffix}.json"
    common = [REWARDS[args.reward], f"eval.every={args.eval_every}", f"eval.seeds_per_prompt={args.eval_seeds}",
              "eval.raw_model=false", "iterations=100000", f"runtime.max_wall_s={args.max_wall_s}", *args.set]
    runs_dir = Path(args.runs_dir)
    if args.analyse_only:  # the runs exist: their target and base are in their own records
        first = runs_dir / f"{args.modes[0]}-seed{args.seeds[0]}"
        target = load_config(TrainConfig, first / "config.yaml").eval.target_accuracy
        record = json.loads((first / "metrics.jsonl").read_text().splitlines()[0])
        base, base_se = record["val/strict_accuracy"], record["val/strict_accuracy_se"]
    else:
        base, base_se = base_accuracy(common, args.cores[0])
        target = base + args.gain
    print(f"base validation strict accuracy {base:.3f} ± {base_se:.3f}; target {target:.3f} (fixed before the runs)",
          flush=True)
    runs_dir.mkdir(parents=True, exist_ok=True)
    jobs = [Job(mode, seed, runs_dir / f"{mode}-seed{seed}",
                [f"mode={mode}", f"seed={seed}", f"eval.target_accuracy={target}", *common])
            for seed in args.seeds for mode in args.modes]
    jobs.sort(key=lambda job: plan.cores_needed(job.mode))  # one-device runs pair up first
    started = time.time()
    load_before = os.getloadavg()
    if not args.analyse_only:
        run_all(jobs, runs_dir, args.cores, plan, args.pair)
    config = load_config(TrainConfig, None, common)
    table = default_prices(config.runtime.prices.instance, config.runtime.prices.on_demand_per_gpu_hour,
                           config.runtime.prices.spot_per_gpu_hour)
    prices = {"on_demand_per_hour": table.on_demand_per_hour, "spot_per_hour": table.spot_per_hour}
    reference = args.reference if args.reference.is_file() else None
    outcomes = [outcome(job, target, prices, reference) | {"commit": git_commit(), "machine": machine()}
                for job in jobs if job.finished]
    if args.merge is not None:
        outcomes += earlier_outcomes(args.merge, target, {(o["mode"], o["seed"]) for o in outcomes},
                                     args.spot_devices)
        outcomes.sort(key=lambda o: (MODES.index(o["mode"]), o["seed"]))
    modes = [mode for mode in MODES if mode in args.modes or any(o["mode"] == mode for o in outcomes)]
    summary = summarise(outcomes, modes)
    print(f"\n{'mode':14s} {'reached':>8s} {'wall to target (min) med [min-max]':>36s} "
          f"{'$ to target med':>16s} {'iters med':>10s} {'vs vanilla':>11s} {'vs sync':>8s}")
    for mode in modes:
        row = summary[mode]
        wall, usd, iters = row["wall_s_to_target"], row["usd_to_target"], row["iterations_to_target"]

        def fmt(value, scale=1.0, digits=1):
            return "-" if value is None else f"{value / scale:.{digits}f}"

        print(f"{mode:14s} {wall['reached']:>3d}/{row['runs']:<4d} "
              f"{fmt(wall['median'], 60):>18s} [{fmt(wall['min'], 60)}-{fmt(wall['max'], 60)}]{'':8s} "
              f"{fmt(usd['median'], 1, 4):>16s} {fmt(iters['median'], 1, 0):>10s} "
              f"{fmt(row.get('wall_s_to_target_vs_vanilla'), 1, 2):>11s} "
              f"{fmt(row.get('wall_s_to_target_vs_sync-explore'), 1, 2):>8s}")
    decomposition = decompose(outcomes, modes)
    spot_core = affordable_candidates(outcomes, config.rollout.prompts_per_iteration, args.spot_devices)
    print("\nwhere the time goes (medians; seconds per iteration over the iterations to target):")
    print(format_table(decomposition))
    if spot_core:
        print(f"{args.spot_devices} spot core(s) buy {spot_core['candidates_per_prompt']:.1f} candidates per prompt "
              f"per update ({spot_core['update_s']:.2f} s update / {spot_core['candidate_s'] * 1000:.1f} ms per "
              "candidate)")
    exploration, prediction = explore_report(outcomes, summary, config, args)
    payload = {"benchmark": "time_to_target", "decomposition": decomposition, "spot_core": spot_core,
               "spot_devices": args.spot_devices, "control_cores": plan.control_cores,
               "exploration": exploration, "prediction": prediction,
               "commit": git_commit(), "machine": machine(),
               "args": {key: str(value) if isinstance(value, Path) else value for key, value in vars(args).items()},
               "base_strict": base, "base_strict_se": base_se, "target": target, "prices": prices,
               "load_average_before": load_before, "load_average_after": os.getloadavg(),
               "elapsed_s": time.time() - started, "summary": summary, "runs": outcomes,
               # the simulator's convergence fit reads this (`convergence.measured`; sim/convergence.py)
               "modes": {mode: {"group_reward_std": {"values": [o["group_reward_std"] for o in outcomes
                                                               if o["mode"] == mode]},
                                "iterations_to_target": {"values": [o["iterations_to_target"] or math.inf
                                                                    for o in outcomes if o["mode"] == mode]}}
                         for mode in modes},
               "failed": [f"{job.mode} seed {job.seed}" for job in jobs if not job.finished]}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=2))
    plot(outcomes, target, base, out.with_suffix(".png"))
    print(f"\nwrote {out} and {out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
