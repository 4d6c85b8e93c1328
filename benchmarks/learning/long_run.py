"""Does the default update survive long runs? Vanilla runs well past the point where the old update collapsed.

Each seed is a real `spotlight train` run in mode vanilla, in its own process, pinned to one core
with one thread, with validation (EMA and raw weights, fixed seeds) every ``--eval-every``
iterations and no target to stop at, so a collapse after the peak cannot hide. A run ends after
``--minutes`` of training (``runtime.max_wall_s``; validation left out) or ``--iterations``,
whichever comes first. The old update collapsed between iterations 80 and 120 (issue 21), so a run
that ends earlier proves nothing and the table says how far each went.

A seed passes when its final EMA strict accuracy is within ``--tolerance`` (0.03) of its best and at
least ``--gain`` (0.12) above the base model's. ``--overrides`` compares variants of the update (e.g.
``train.old_policy_decay=0`` for the update before issue 21).

    .venv/bin/python benchmarks/learning/long_run.py --seeds 0 1 2 --minutes 40
    .venv/bin/python benchmarks/learning/long_run.py --analyse-only --tag default     # re-read finished runs

Prints a table; writes JSON (commit, machine, load average, every curve) and a PNG of the EMA and
raw curves with standard errors to benchmarks/results/long_run[-TAG].{json,png}.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `benchmarks.*` imports

from benchmarks.provenance import REPO, RESULTS, git_commit, machine


def run_seed(seed: int, core: int, run_dir: Path, args: argparse.Namespace) -> subprocess.Popen:
    """Start one vanilla run of ``seed`` pinned to ``core``; its output goes to RUN_DIR.log."""
    shutil.rmtree(run_dir, ignore_errors=True)
    overrides = [
        "mode=vanilla", f"seed={seed}", f"iterations={args.iterations}", f"runtime.max_wall_s={args.minutes * 60}",
        f"eval.every={args.eval_every}", f"eval.seeds_per_prompt={args.seeds_per_prompt}", "eval.raw_model=true",
        f"device_cores=[{core}]", f"run_dir={run_dir}", *args.overrides,
    ]
    command = [sys.executable, "-m", "spotlight", "train", *(arg for o in overrides for arg in ("-s", o))]
    log = Path(f"{run_dir}.log").open("w")
    return subprocess.Popen(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)


def run_all(args: argparse.Namespace, root: Path) -> None:
    """Run the seeds, ``--parallel`` at a time, each pinned to a core (more runs than cores share them)."""
    cores = sorted(os.sched_getaffinity(0))
    waiting, running = list(args.seeds), {}
    while waiting or running:
        for slot, (seed, process) in list(running.items()):
            if process.poll() is not None:
                del running[slot]
                print(f"  done seed {seed}: exit {process.returncode}", flush=True)
        for slot in range(args.parallel):
            if slot not in running and waiting:
                seed, core = waiting.pop(0), cores[slot % len(cores)]
                running[slot] = (seed, run_seed(seed, core, root / f"seed{seed}", args))
                print(f"  start seed {seed} on core {core}", flush=True)
        time.sleep(5.0)


def curve(run_dir: Path) -> list[dict[str, float]]:
    """The validated records of a run: iteration, training minutes, EMA and raw strict accuracy with s.e., loss."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    losses = {r["iteration"]: r.get("train/loss") for r in records}
    return [{"iteration": r["iteration"], "minutes": r["time/wall_s"] / 60,
             "ema": r["val/strict_accuracy"], "ema_se": r["val/strict_accuracy_se"],
             "raw": r.get("val_raw/strict_accuracy", r["val/strict_accuracy"]),
             "raw_se": r.get("val_raw/strict_accuracy_se", r["val/strict_accuracy_se"]),
             "loss": losses.get(r["iteration"]), "guard": r.get("guard/action")}
            for r in records if "val/strict_accuracy" in r]


def guard_actions(run_dir: Path) -> dict[str, object]:
    """The guard's rollbacks and stop of a run (iterations), from every record, validated or not."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    acted = [(r["iteration"], r["guard/action"]) for r in records if "guard/action" in r]
    return {"rollbacks": [i for i, action in acted if action == "rollback"],
            "stopped_at": next((i for i, action in acted if action == "stop"), None)}


def judge(points: list[dict[str, float]], tolerance: float, gain: float) -> dict[str, object]:
    """Base, best, final and whether the run kept its gains (final ≥ best − tolerance and ≥ base + gain)."""
    base, final = points[0]["ema"], points[-1]["ema"]
    best = max(points, key=lambda point: point["ema"])
    return {"base": base, "best": best["ema"], "best_iteration": best["iteration"], "final": final,
            "final_se": points[-1]["ema_se"], "final_raw": points[-1]["raw"], "iterations": points[-1]["iteration"],
            "minutes": points[-1]["minutes"], "kept_peak": final >= best["ema"] - tolerance,
            "gained": final >= base + gain}


def plot(runs: dict[int, list[dict[str, float]]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(13, 4.8), sharey=True)
    for seed, points in sorted(runs.items()):
        xs = [p["iteration"] for p in points]
        for ax, key in ((axes[0], "ema"), (axes[1], "raw")):
            ax.errorbar(xs, [p[key] for p in points], yerr=[p[f"{key}_se"] for p in points], marker="o",
                        markersize=3, capsize=2, alpha=0.8, label=f"seed {seed}")
    for ax, name in ((axes[0], "EMA"), (axes[1], "raw weights")):
        ax.set_xlabel("iteration")
        ax.set_ylabel(f"validation strict accuracy, {name} (± s.e.)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--minutes", type=float, default=40.0, help="training minutes per seed (validation left out)")
    parser.add_argument("--iterations", type=int, default=100_000)
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--seeds-per-prompt", type=int, default=10, help="validation: 80 prompts x this many seeds")
    parser.add_argument("--parallel", type=int, default=1,
                        help="seeds run at once, one pinned core each (cycling): iterations, not minutes, then compare")
    parser.add_argument("--tolerance", type=float, default=0.03)
    parser.add_argument("--gain", type=float, default=0.12)
    parser.add_argument("--overrides", nargs="*", default=[], help="extra section.field=value for every run")
    parser.add_argument("--tag", default="", help="suffix of the result files and run folders")
    parser.add_argument("--analyse-only", action="store_true", help="re-read the runs of an earlier invocation")
    args = parser.parse_args(argv)
    suffix = f"-{args.tag}" if args.tag else ""
    root = REPO / "runs" / f"long_run{suffix}"
    root.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    if not args.analyse_only:
        run_all(args, root)
    runs = {seed: curve(root / f"seed{seed}") for seed in args.seeds}
    verdicts = {seed: {**judge(points, args.tolerance, args.gain), **guard_actions(root / f"seed{seed}")}
                for seed, points in runs.items()}
    print(f"{'seed':>4} {'iters':>6} {'min':>6} {'base':>6} {'best (it.)':>12} {'final ± se':>13} {'raw':>6} "
          f"{'rollbacks':>12} {'stop':>5}  kept peak / +{args.gain}")
    for seed, v in verdicts.items():
        print(f"{seed:>4} {v['iterations']:>6} {v['minutes']:>6.1f} {v['base']:>6.3f} "
              f"{v['best']:>6.3f} ({v['best_iteration']:>3}) {v['final']:>6.3f} ± {v['final_se']:.3f} "
              f"{v['final_raw']:>6.3f} {','.join(map(str, v['rollbacks'])) or '-':>12} {v['stopped_at'] or '-':>5}  "
              f"{v['kept_peak']} / {v['gained']}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    payload = {"commit": git_commit(), "machine": machine(), "load_average_before": load_before,
               "load_average_after": os.getloadavg(), "args": vars(args), "verdicts": verdicts, "curves": runs}
    (RESULTS / f"long_run{suffix}.json").write_text(json.dumps(payload, indent=1))
    plot(runs, RESULTS / f"long_run{suffix}.png",
         f"vanilla, one core, validation every {args.eval_every} iterations {' '.join(args.overrides)}")
    print(f"wrote {RESULTS / f'long_run{suffix}.json'} and .png")


if __name__ == "__main__":
    main()
