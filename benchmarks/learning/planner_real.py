"""The exploration planner against every fixed arm of its grid, in real stale-explore training runs.

Each run is ``spotlight train`` in mode stale-explore from the shipped base model with the same
seed (so every run draws the same prompts): one run per fixed arm (num_candidates, num_steps), and
one with the bandit planner choosing among those arms within the budget (the previous iteration's
training time, which Spotlight's exploration must hide behind). Per run it reports the realised
within-group reward variance of the rollouts (what the planner maximises), the exploration time,
and the overrun: the exploration seconds past the budget, which on the cluster would stall the
trainer. An arm "fits" when its median overrun is zero. The planner should match or beat the
best arm that fits, without overrunning. Prints a table, writes JSON.

    python benchmarks/learning/planner_real.py --iterations 16 --jobs 2
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `benchmarks.*` imports

from benchmarks.learning.exploration_convergence import run_one
from benchmarks.provenance import RESULTS, git_commit, machine


def summarise(history: list[dict], skip: int) -> dict[str, float]:
    """Mean realised group variance, exploration time and overrun past the budget, after ``skip`` iterations.

    The budget of iteration i is iteration i-1's training time (Trainer.budget_s); iteration 1 has
    the configured initial budget, so the first ``skip`` iterations (the planner's calibration) are
    left out of every run alike.
    """
    rows = [r for r in history if "rollout/group_reward_var" in r]
    overruns = [max(0.0, rows[i].get("time/explore_s", 0.0) - rows[i - 1]["time/train_s"])
                for i in range(1, len(rows))]
    kept = rows[skip:]
    overruns = overruns[max(0, skip - 1):]
    return {
        "group_reward_var": statistics.fmean(r["rollout/group_reward_var"] for r in kept),
        "group_reward_std": statistics.fmean(r["rollout/group_reward_std"] for r in kept),
        "explore_s": statistics.fmean(r.get("time/explore_s", 0.0) for r in kept),
        "train_s": statistics.fmean(r["time/train_s"] for r in kept),
        "overrun_s_median": statistics.median(overruns) if overruns else 0.0,
        "overrun_s_mean": statistics.fmean(overruns) if overruns else 0.0,
        "iterations": len(kept),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-candidates", type=int, nargs="+", default=[8, 16, 32])
    parser.add_argument("--num-steps", type=int, nargs="+", default=[4, 7, 10])
    parser.add_argument("--iterations", type=int, default=16)
    parser.add_argument("--skip", type=int, default=3, help="calibration iterations left out of every summary")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="section.field=value")
    parser.add_argument("--runs-dir", default="runs/bench-planner-real")
    parser.add_argument("--out", default=str(RESULTS / "planner_real.json"))
    args = parser.parse_args()

    common = [*args.overrides, "mode=stale-explore", f"seed={args.seed}", "num_threads=1",
              f"iterations={args.iterations}", f"eval.every={args.iterations + 1}"]
    runs = {f"fixed N={n} S={s}": [*common, f"explore.num_candidates={n}", f"explore.num_steps={s}",
                                   f"run_dir={args.runs_dir}/fixed-n{n}-s{s}"]
            for n, s in itertools.product(args.num_candidates, args.num_steps)}
    runs["planner"] = [*common, f"explore.planner.num_candidates={args.num_candidates}",
                       f"explore.planner.num_steps={args.num_steps}", f"run_dir={args.runs_dir}/planner"]
    started = time.perf_counter()
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        futures = {name: pool.submit(run_one, None, overrides) for name, overrides in runs.items()}
        histories = {name: future.result() for name, future in futures.items()}

    summary = {name: summarise(history, args.skip) for name, history in histories.items()}
    planner_history = [r for r in histories["planner"] if "rollout/group_reward_var" in r]
    summary["planner"]["choices"] = [(r.get("planner/num_candidates"), r.get("planner/num_steps"))
                                     for r in planner_history]
    fitting = {name: entry for name, entry in summary.items()
               if name != "planner" and entry["overrun_s_median"] == 0.0}
    best_fitting = max(fitting, key=lambda name: fitting[name]["group_reward_var"]) if fitting else None

    print(f"{'run':<18}{'group var':>11}{'group std':>11}{'explore s':>11}{'train s':>9}"
          f"{'overrun s (median/mean)':>26}")
    for name, entry in summary.items():
        print(f"{name:<18}{entry['group_reward_var']:>11.4f}{entry['group_reward_std']:>11.3f}"
              f"{entry['explore_s']:>11.2f}{entry['train_s']:>9.2f}"
              f"{entry['overrun_s_median']:>14.2f} / {entry['overrun_s_mean']:.2f}")
    print(f"best fixed arm that fits the budget: {best_fitting}")
    print(f"planner choices (N, S) per iteration: {summary['planner']['choices']}")
    payload = {
        "benchmark": "planner_real", "commit": git_commit(), "machine": machine(), "args": vars(args),
        "runs": summary, "best_fitting_fixed_arm": best_fitting, "wall_s": time.perf_counter() - started,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(payload, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
