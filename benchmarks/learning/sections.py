"""docs/results.md's tables for the benchmarks of learning and exploration (this folder), one function each.

Each function reads only what its benchmark wrote (see that benchmark's docstring for the fields) and
returns tables of formatted strings; nothing here computes a new number beyond a ratio or a rounding,
so the page says what the JSON says. Standard library only.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from benchmarks.tables import Table, fmt, minutes, short_commit, spread


def time_to_target(result: dict) -> list[Table]:
    """Per mode: wall time, dollars and iterations to the target; the decomposition by phase."""
    commits: dict[str, set[str]] = {}
    for run in result.get("runs", []):
        commits.setdefault(run["mode"], set()).add(short_commit(run.get("commit")))
    target = result.get("target")
    caption = (f"Target: validation strict accuracy {fmt(target)} (base {fmt(result.get('base_strict'))} "
               f"± {fmt(result.get('base_strict_se'))}, plus {fmt(result.get('args', {}).get('gain'), 2)}); "
               f"reward `{result.get('args', {}).get('reward', 'not recorded')}`; prices "
               f"{json.dumps(result.get('prices'))} per device-hour.")
    summary = Table(["mode", "runs reached", "wall to target, median [min–max] (min)", "$ to target, median",
                     "iterations, median [min–max]", "group reward std", "wall vs vanilla", "runs' commits"],
                    caption=caption)
    for mode, row in result.get("summary", {}).items():
        wall, usd, its = row["wall_s_to_target"], row["usd_to_target"], row["iterations_to_target"]
        versus = 1.0 if mode == "vanilla" else row.get("wall_s_to_target_vs_vanilla")
        summary.rows.append([
            mode, f"{wall.get('reached', 0)}/{row.get('runs')}",
            spread(minutes(wall.get("median")), minutes(wall.get("min")), minutes(wall.get("max"))),
            fmt(usd.get("median"), 2),
            spread(fmt(its.get("median"), 0), fmt(its.get("min"), 0), fmt(its.get("max"), 0)),
            fmt(row.get("group_reward_std")), fmt(versus, 2), ", ".join(sorted(commits.get(mode, {"–"})))])
    phases = Table(["mode", "iterations", "s / iteration", "seeds", "rollout", "update", "exploration wait",
                    "zero-spread groups"],
                   caption="Where the time goes (medians over the runs that reached the target; seconds per "
                           "iteration by phase, `benchmarks/learning/decomposition.py`):")
    for mode, row in result.get("decomposition", {}).items():
        phases.rows.append([mode, fmt(row.get("iterations"), 0), fmt(row.get("iteration_s"), 2),
                            fmt(row.get("seeds"), 2), fmt(row.get("rollout"), 2), fmt(row.get("update"), 2),
                            fmt(row.get("wait"), 2), fmt(row.get("zero_std_groups"), 3)])
    per_run = Table(["mode", "seed", "reached", "iterations", "wall (min)", "group reward std", "final strict"],
                    caption="Every run:")
    for run in result.get("runs", []):
        per_run.rows.append([run["mode"], fmt(run["seed"], 0), fmt(bool(run.get("reached"))),
                             fmt(run.get("iterations_to_target"), 0), minutes(run.get("wall_s_to_target")),
                             fmt(run.get("group_reward_std")), fmt(run.get("final_strict"))])
    return [summary, phases, per_run]


def long_run(result: dict) -> list[Table]:
    """Per seed: base, best and final validation strict accuracy, the guard's rollbacks and stop."""
    overrides = result.get("args", {}).get("overrides") or []
    table = Table(["seed", "base", "best (iteration)", "final", "rollbacks", "stopped at", "minutes",
                   "kept peak", "gained"],
                  caption=f"Tag `{result.get('args', {}).get('tag')}`; run overrides: "
                          + (" ".join(f"`{item}`" for item in overrides)
                             or "none (the update as the code stood at that commit)"))
    for seed, row in result.get("verdicts", {}).items():
        table.rows.append([seed, fmt(row.get("base")), f"{fmt(row.get('best'))} ({fmt(row.get('best_iteration'), 0)})",
                           fmt(row.get("final")), ", ".join(str(it) for it in row.get("rollbacks") or []) or "–",
                           fmt(row.get("stopped_at"), 0), fmt(row.get("minutes"), 1), fmt(row.get("kept_peak")),
                           fmt(row.get("gained"))])
    return [table]


def pipeline_learns(result: dict) -> list[Table]:
    """A tiny pipeline folder post-trained on a user reward: the rise of its rollout reward per seed."""
    window = result.get("window")
    table = Table(["seed", f"first {window} iterations", f"last {window}", "rise", "wall (s)"],
                  caption=f"Family `{result.get('family')}`, {result.get('iterations')} iterations.")
    for run in result.get("runs", []):
        table.rows.append([fmt(run.get("seed"), 0), fmt(run.get("first"), 4), fmt(run.get("last"), 4),
                           f"{run.get('rise', 0):+.4f}", fmt(run.get("wall_s"), 0)])
    return [table]


def planner_synthetic(result: dict) -> list[Table]:
    """Cumulative regret of the planner, its ablations and the fixed arms on drifting synthetic arms."""
    table = Table(["policy", "cumulative regret", "s.e.", "first half", "second half"])
    for row in result.get("results", []):
        table.rows.append([row["policy"], fmt(row.get("cumulative_regret_mean"), 1),
                           fmt(row.get("cumulative_regret_se"), 1),
                           fmt(row.get("first_half"), 1), fmt(row.get("second_half"), 1)])
    return [table]


def planner_real(result: dict) -> list[Table]:
    """Real stale-explore runs: group reward variance and overrun of the planner and each fixed arm."""
    table = Table(["arm", "group reward var", "explore (s)", "train (s)", "overrun median (s)", "iterations"],
                  caption=f"Best fixed arm that fits the training time: {result.get('best_fitting_fixed_arm')}.")
    for arm, row in result.get("runs", {}).items():
        table.rows.append([arm, fmt(row.get("group_reward_var")), fmt(row.get("explore_s"), 2),
                           fmt(row.get("train_s"), 2),
                           fmt(row.get("overrun_s_median"), 2), fmt(row.get("iterations"), 0)])
    return [table]


def noise_attribution(result: dict) -> list[Table]:
    """How well an exploration arm of S steps ranks seeds: its correlation with the rollout's reward."""
    table = Table(["rollout", "arm steps", "arm sampler", "correlation", "selected group std", "random group std"])
    for row in result.get("exploration_arms", []):
        table.rows.append([row.get("rollout", "sde"), fmt(row.get("arm_steps"), 0), str(row.get("sampler")),
                           fmt(row.get("correlation"), 2), fmt(row.get("selected_group_std")),
                           fmt(row.get("random_group_std"))])
    return [table]


def exploration_convergence(result: dict) -> list[Table]:
    """Modes side by side for a fixed number of iterations: group reward std and final accuracy."""
    table = Table(["mode", "group reward std (mean)", "final val accuracy (mean)", "runs reaching the target"])
    for mode, row in result.get("modes", {}).items():
        reached = row.get("iterations_to_target", {})
        table.rows.append([mode, fmt(row.get("group_reward_std", {}).get("mean")),
                           fmt(row.get("final_val_accuracy", {}).get("mean")),
                           f"{fmt(reached.get('reached'), 0)}/{fmt(reached.get('runs'), 0)}"])
    return [table]


SECTIONS: dict[str, Callable[[dict], list[Table]]] = {
    "time_to_target": time_to_target, "long_run": long_run, "pipeline_learns": pipeline_learns,
    "planner_synthetic": planner_synthetic, "planner_real": planner_real, "noise_attribution": noise_attribution,
    "exploration_convergence": exploration_convergence,
}
