"""Seed exploration vs vanilla GRPO on the default task: iterations to target, group reward std, Kendall τ.

Runs ``spotlight train`` in the modes vanilla, sync-explore and stale-explore for several seeds from
the shipped base model, in parallel worker processes (one thread each), then reports per mode:
iterations (and wall seconds) to reach the target strict validation accuracy (base + ``--gain``),
the mean within-group reward std of the rollouts, and for stale-explore the Kendall τ between the
stale (θ_{i-1}) and fresh (θ_i) candidate rankings. Prints a table, writes JSON.

    python benchmarks/learning/exploration_convergence.py --seeds 0 1 2 --iterations 60 --jobs 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from spotlight.config import TrainConfig, load_config
from spotlight.trainer import train

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `benchmarks.*` imports

from benchmarks.provenance import RESULTS, git_commit, machine

MODES = ("vanilla", "sync-explore", "stale-explore")


def run_one(config_path: str | None, overrides: list[str]) -> list[dict]:
    """One training run in this worker process; returns its metrics history."""
    config = load_config(TrainConfig, config_path, overrides)
    return train(config).history


def iterations_to_target(
    history: list[dict], target: float, metric: str = "val/strict_accuracy"
) -> tuple[float, float]:
    """(iteration, wall seconds) of the first validation with ``metric`` >= ``target``; (inf, inf) if never."""
    for record in history:
        if record.get(metric, -1.0) >= target:
            return float(record["iteration"]), float(record["time/wall_s"])
    return float("inf"), float("inf")


def spread(values: list[float]) -> dict[str, float]:
    finite = [v for v in values if np.isfinite(v)]
    return {
        "mean": statistics.fmean(finite) if finite else float("inf"),
        "std": statistics.pstdev(finite) if len(finite) > 1 else 0.0,
        "reached": len(finite),
        "runs": len(values),
        "values": values,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=None, help="base YAML config (defaults: the package defaults)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("--iterations", type=int, default=None)
    parser.add_argument("--gain", type=float, default=0.15, help="target = base strict accuracy + gain")
    parser.add_argument("--reward-gain", type=float, default=0.1,
                        help="second target on the validation reward (partial credit): base reward + this")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="section.field=value")
    parser.add_argument("--runs-dir", default="runs/bench-exploration")
    parser.add_argument("--out", default=str(RESULTS / "exploration_convergence.json"))
    args = parser.parse_args()

    started = time.perf_counter()
    jobs = {}
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        for mode in args.modes:
            for seed in args.seeds:
                overrides = [*args.overrides, f"mode={mode}", f"seed={seed}", "num_threads=1",
                             f"run_dir={args.runs_dir}/{mode}-seed{seed}"]
                if args.iterations is not None:
                    overrides.append(f"iterations={args.iterations}")
                jobs[(mode, seed)] = pool.submit(run_one, args.config, overrides)
        histories = {key: future.result() for key, future in jobs.items()}

    base_accuracy = next(iter(histories.values()))[0]["val/strict_accuracy"]
    base_reward = next(iter(histories.values()))[0]["val/reward"]
    target = base_accuracy + args.gain
    reward_target = base_reward + args.reward_gain
    summary: dict[str, dict] = {}
    for mode in args.modes:
        runs = [histories[(mode, seed)] for seed in args.seeds]
        reached = [iterations_to_target(h, target) for h in runs]
        reached_reward = [iterations_to_target(h, reward_target, "val/reward") for h in runs]
        group_std = [statistics.fmean(r["rollout/group_reward_std"] for r in h if "rollout/group_reward_std" in r)
                     for h in runs]
        final_acc = [h[-1]["val/strict_accuracy"] for h in runs]
        entry = {
            "iterations_to_target": spread([r[0] for r in reached]),
            "wall_s_to_target": spread([r[1] for r in reached]),
            "iterations_to_reward_target": spread([r[0] for r in reached_reward]),
            "wall_s_to_reward_target": spread([r[1] for r in reached_reward]),
            "group_reward_std": spread(group_std),
            "final_val_accuracy": spread(final_acc),
            "curves": [[(r["iteration"], r["val/strict_accuracy"], r["val/reward"]) for r in h
                        if "val/strict_accuracy" in r] for h in runs],
        }
        taus = [r["staleness/kendall_tau"] for h in runs for r in h
                if np.isfinite(r.get("staleness/kendall_tau", float("nan")))]
        if taus:
            entry["kendall_tau"] = {"median": float(np.median(taus)), "p10": float(np.percentile(taus, 10)),
                                    "count": len(taus)}
        summary[mode] = entry

    print(f"base strict accuracy {base_accuracy:.3f}, target {target:.3f}; "
          f"base reward {base_reward:.3f}, reward target {reward_target:.3f}")
    print(f"{'mode':<15}{'iters to target':>20}{'wall s to target':>20}{'group reward std':>20}{'final acc':>14}")
    for mode, entry in summary.items():
        it, wall = entry["iterations_to_target"], entry["wall_s_to_target"]
        std, acc = entry["group_reward_std"], entry["final_val_accuracy"]
        print(f"{mode:<15}{it['mean']:>11.1f} ± {it['std']:<5.1f} ({it['reached']}/{it['runs']})"
              f"{wall['mean']:>12.0f} ± {wall['std']:<5.0f}{std['mean']:>13.3f} ± {std['std']:.3f}"
              f"{acc['mean']:>9.3f} ± {acc['std']:.3f}")
        rit = entry["iterations_to_reward_target"]
        print(f"{'':<15}iterations to reward target {rit['mean']:.1f} ± {rit['std']:.1f} "
              f"({rit['reached']}/{rit['runs']})")
        if "kendall_tau" in entry:
            tau = entry["kendall_tau"]
            print(f"{'':<15}Kendall τ stale vs fresh: median {tau['median']:.3f}, p10 {tau['p10']:.3f} "
                  f"({tau['count']} iterations)")
    payload = {
        "benchmark": "exploration_convergence", "commit": git_commit(), "machine": machine(),
        "args": vars(args), "base_accuracy": base_accuracy, "target": target,
        "base_reward": base_reward, "reward_target": reward_target, "modes": summary,
        "wall_s": time.perf_counter() - started,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(payload, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
