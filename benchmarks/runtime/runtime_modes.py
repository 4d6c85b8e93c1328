"""The four runtime modes on this machine: 1 on-demand + 1 spot device, same base model, seed and trace.

For vanilla, sync-explore, spot-rollout and spotlight, each a real `spotlight train` run on a local
Ray cluster (vanilla rents no spot device), it measures:
- spot-device utilisation during training phases (busy / held spot device-seconds while the
  on-demand device trains; target >= 0.8 in spotlight, ~0 in spot-rollout),
- wall-clock and dollars per iteration, and to the target validation accuracy (base + --gain),
- the share of busy device time spent in model compute (target >= 0.9),
- queue round-trip latency per pull (exploring modes).

    nice -n 19 .venv/bin/python benchmarks/runtime/runtime_modes.py --quick     # 6 iterations per mode
    nice -n 19 .venv/bin/python benchmarks/runtime/runtime_modes.py --iterations 40 --max-wall-s 900

Prints a table and writes benchmarks/results/runtime_modes.json with the machine, the commit and the
arguments. The machine is shared: the numbers depend on what else runs (the JSON keeps the load).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np

from spotlight.config import TrainConfig, load_config
from spotlight.trainer import train

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `benchmarks.*` imports

from benchmarks.provenance import RESULTS, git_commit, machine

MODES = ("vanilla", "sync-explore", "spot-rollout", "spotlight")


def first_reaching(records: list[dict], target: float, key: str) -> dict | None:
    """The first validation record whose accuracy reaches ``target`` (None if none did)."""
    return next((r for r in records if r.get(key, -math.inf) >= target), None)


def mean_of(records: list[dict], key: str) -> float:
    values = [r[key] for r in records if key in r and r[key] is not None and math.isfinite(r[key])]
    return float(np.mean(values)) if values else math.nan


def run_mode(mode: str, args: argparse.Namespace) -> dict:
    """One training run in ``mode``; returns its per-mode numbers."""
    run_dir = Path(args.runs_dir) / mode
    shutil.rmtree(run_dir, ignore_errors=True)
    overrides = [f"mode={mode}", f"run_dir={run_dir}", f"iterations={args.iterations}", f"seed={args.seed}",
                 "runtime.use_ray=true", f"runtime.max_wall_s={args.max_wall_s}", *args.set]
    config = load_config(TrainConfig, args.config, overrides)
    started = time.perf_counter()
    summary = train(config, on_iteration=lambda i, r: print(
        f"  {mode} it {i}: {r.get('time/iteration_s', 0):.1f} s  spot util (train) "
        f"{r.get('util/spot_train_phase', math.nan):.2f}  ${r.get('cost/usd', 0):.5f}", flush=True))
    wall_s = time.perf_counter() - started
    records = summary.history[1:]
    totals = json.loads((run_dir / "summary.json").read_text())
    base = summary.history[0]["val/strict_accuracy"]
    target = base + args.gain
    reached = first_reaching(summary.history[1:], target, "val/strict_accuracy")
    iterations = len(records)
    return {
        "iterations": iterations,
        "run_wall_s": wall_s,
        "train_wall_s": records[-1]["time/wall_s"],
        "base_val_accuracy": base,
        "final_val_accuracy": summary.validation[-1]["val/strict_accuracy"],
        "target_val_accuracy": target,
        "iterations_to_target": None if reached is None else reached["iteration"],
        "wall_s_to_target": None if reached is None else reached["time/wall_s"],
        "usd_to_target": None if reached is None else reached["cost/usd"],
        "wall_s_per_iteration": mean_of(records, "time/iteration_s"),
        "usd_per_iteration": records[-1]["cost/usd"] / iterations,
        "usd_total": totals["cost/usd"],
        "spot_util_train_phase": mean_of(records, "util/spot_train_phase"),
        # without the first round (the planner's one-off calibration on the cheapest plan) and the last
        # iteration (no next prompts to explore): what the loop sustains
        "spot_util_train_phase_steady": mean_of(records[1:-1], "util/spot_train_phase"),
        "spot_util": totals["util/spot"],
        "on_demand_util": totals["util/on_demand"],
        "compute_share": totals["util/compute_share"],
        "compute_share_spot": totals["util/compute_share_spot"],
        "queue_round_trip_ms": mean_of(records, "queue/pull_round_trip_ms"),
        "train_s": mean_of(records, "time/train_s"),
        "rollout_s": mean_of(records, "time/rollout_s"),
        "explore_wait_s": mean_of(records, "time/explore_wait_s"),
        "group_reward_std": mean_of(records, "rollout/group_reward_std"),
        "preemption_notices": totals["preemption_notices"],
        "queue": totals.get("queue"),
        "prices": totals["prices"],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=None, help="a train config (default: the defaults)")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--iterations", type=int, default=40)
    parser.add_argument("--max-wall-s", type=float, default=900.0, help="per mode")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--gain", type=float, default=0.05, help="target = base validation accuracy + gain")
    parser.add_argument("--quick", action="store_true", help="6 iterations, 8 prompts, validation at the end")
    parser.add_argument("--set", "-s", action="append", default=[], help="extra config override")
    parser.add_argument("--runs-dir", default="runs/bench-runtime")
    parser.add_argument("--out", default=str(RESULTS / "runtime_modes.json"))
    args = parser.parse_args(argv)
    if args.quick:
        args.iterations = 6
        args.set = ["rollout.prompts_per_iteration=8", "eval.every=6", "eval.seeds_per_prompt=1", *args.set]
    load_before = os.getloadavg()
    results = {}
    for mode in args.modes.split(","):
        print(f"{mode}:", flush=True)
        results[mode] = run_mode(mode, args)
    payload = {"benchmark": "runtime_modes", "commit": git_commit(), "machine": machine(),
               "load_average_before": load_before, "load_average_after": os.getloadavg(),
               "args": vars(args), "modes": results}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(payload, indent=2, default=float))
    columns = ("iterations", "wall_s_per_iteration", "usd_per_iteration", "spot_util_train_phase",
               "spot_util_train_phase_steady", "compute_share",
               "queue_round_trip_ms", "final_val_accuracy", "wall_s_to_target", "usd_to_target")
    print("mode".ljust(14) + "".join(c[:14].rjust(16) for c in columns))
    for mode, row in results.items():
        cells = [row[c] for c in columns]
        print(mode.ljust(14) + "".join(("-" if v is None else f"{v:.4g}").rjust(16) for v in cells))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    sys.exit(main())
