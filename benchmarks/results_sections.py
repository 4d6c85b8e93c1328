"""The tables docs/results.md shows for each benchmark's JSON, one function per benchmark.

Each function reads only what its benchmark wrote (see that benchmark's docstring for the fields) and
returns tables of formatted strings; nothing here computes a new number beyond a ratio or a rounding,
so the page says what the JSON says. Standard library only.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class Table:
    """One markdown table: an optional caption line above it, its column names, its rows."""

    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)
    caption: str = ""


def fmt(value: object, digits: int = 3) -> str:
    """A number with ``digits`` decimals; '–' for a missing value, 'not reached' for infinity."""
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (int, float)):
        if isinstance(value, float) and math.isnan(value):
            return "–"
        if isinstance(value, float) and math.isinf(value):
            return "not reached"
        return f"{value:.{digits}f}" if isinstance(value, float) or digits == 0 else f"{value}"
    return str(value)


def short_commit(commit: object) -> str:
    """``abc1234`` (or ``abc1234+dirty``) from a full hash; 'not recorded' when the JSON has none."""
    if not isinstance(commit, str) or not commit:
        return "not recorded"
    head, _, dirty = commit.partition("+")
    return head[:7] + (f"+{dirty}" if dirty else "")


def spread(median: str, low: str, high: str) -> str:
    """``median [low–high]``, or '–' when nothing reached it."""
    return "–" if median in ("–", "not reached") else f"{median} [{low}–{high}]"


def minutes(seconds: object) -> str:
    """Seconds as minutes with one decimal."""
    return fmt(seconds / 60.0, 1) if isinstance(seconds, (int, float)) else "–"


def generic_table(result: dict) -> Table:
    """The JSON's top-level numbers and flags, for a benchmark without a summary of its own."""
    rows = [[f"`{key}`", fmt(value)] for key, value in result.items()
            if isinstance(value, (int, float, bool)) and key not in ("seed",)]
    return Table(["field", "value"], rows)


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
                           "iteration by phase, `benchmarks/decomposition.py`):")
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


def _paper_model(result: dict) -> str:
    """What the paper-scale simulation priced: the folder its workload was derived from, else the typed model."""
    source = result.get("workload_source") or {}
    if source.get("kind") == "folder":
        resolution = "×".join(str(side) for side in source.get("resolution") or []) or "?"
        return (f"`{source.get('pretrained')}`'s workload derived from its folder's configs: {resolution}, "
                f"{source.get('algorithm')} {source.get('finetune')}"
                + (f" {source.get('lora_rank')}" if source.get("finetune") == "lora" else "")
                + f", {fmt(source.get('flops_per_forward', 0) / 1e12, 0)} TFLOP per forward")
    workload = result.get("config", {}).get("workload", {})
    params = workload.get("params")
    return (f"typed workload: {params / 1e9:.0f} B-parameter DiT at {workload.get('resolution')}²" if params
            else "the paper's model")


def simulate_paper_scale(result: dict) -> list[Table]:
    """Where the workload came from, each mode's time and dollars, Spotlight's ratios against each mode, the
    fitted convergence exponent, and the simulator's speed."""
    source = result.get("workload_source") or {}
    workload = Table(["workload", "value"], caption=f"Workload: {_paper_model(result)}.")
    if source.get("kind") == "folder":
        gpu = source.get("gpu_profile") or {}
        workload.rows += [
            ["folder (`model.pretrained`)", f"`{source.get('folder')}` ({source.get('family')}, "
                                            f"{fmt(source.get('parameters', 0) / 1e9, 1)} B parameters)"],
            [f"overrides on `{source.get('config')}`", " ".join(f"`{item}`" for item in source.get("overrides", []))],
            ["TFLOP per conditional forward (meta-device count)", fmt(source.get("flops_per_forward", 0) / 1e12, 1)],
            ["TFLOP of update per rollout sample", fmt(source.get("update_flops_per_sample", 0) / 1e12, 0)],
            ["forwards per rollout image", fmt(source.get("rollout_forwards_per_image"), 0)],
            ["image + text tokens", f"{fmt(source.get('image_tokens'), 0)} + {fmt(source.get('text_tokens'), 0)} "
                                    f"({source.get('text_tokens_source')})"],
            ["GPU profile, efficiency rollout / update",
             f"{gpu.get('name')}, {fmt(gpu.get('rollout_efficiency'), 2)} / {fmt(gpu.get('update_efficiency'), 2)}"],
            ["the plan's one-trainer memory check (not applied: the cluster spreads the rollout)",
             str(source.get("one_trainer_memory_fit"))],
        ]
    else:
        typed = result.get("config", {}).get("workload", {})
        workload.rows += [[key, fmt(typed.get(key), 2) if isinstance(typed.get(key), float) else str(typed.get(key))]
                          for key in ("params", "num_layers", "mfu", "train_pass_factor", "kl_reference")]
    modes = Table(["mode", "iterations", "hours", "dollars", "on-demand util", "spot util"])
    for mode, summary in result.get("modes", {}).items():
        utilisation = summary.get("utilisation", {})
        modes.rows.append([mode, fmt(summary.get("iterations_to_target"), 0), fmt(summary.get("time_to_target_h"), 2),
                           fmt(summary.get("dollars_to_target"), 0), fmt(utilisation.get("on_demand"), 2),
                           fmt(utilisation.get("spot"), 2)])
    drivers = result.get("drivers", {})
    ratios = Table(["spotlight vs", "faster", "cheaper"],
                   caption=f"Convergence exponent α {fmt(drivers.get('alpha'), 2)}, group-std ratio "
                           f"{fmt(drivers.get('sigma_ratio'), 2)}, "
                           f"α needed for 4× {fmt(drivers.get('alpha_for_4x'), 1)}; "
                           f"published claim {json.dumps(result.get('published_claim'))}.")
    for mode, row in result.get("ratios", {}).items():
        ratios.rows.append([mode, f"{fmt(row['faster'], 2)}×", f"{fmt(row['cheaper'], 2)}×"])
    speed = result.get("speed", {})
    timing = Table(["simulated GPUs", "iterations", "median wall (s)"],
                   [[fmt(speed.get("gpus"), 0), fmt(speed.get("iterations"), 0), fmt(speed.get("median_s"), 2)]],
                   caption="Simulator speed:")
    return [workload, modes, ratios, timing]


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


def chaos(result: dict) -> list[Table]:
    """Faults injected and what survived them, against a fault-free run."""
    faults = result.get("chaos", {}).get("faults", {})
    requests = result.get("requests_chaos", {})
    rows = [["iterations", fmt(result.get("iterations"), 0)],
            ["faults (unnoticed spot losses, queue kills, reward-server kills, driver kills)",
             ", ".join(fmt(faults.get(key), 0)
                       for key in ("unnoticed_loss", "queue_kill", "reward_kill", "driver_kill"))],
            ["preemption notices", fmt(result.get("chaos", {}).get("preemption_notices"), 0)],
            ["requests done / lost / stored twice",
             f"{fmt(requests.get('done'), 0)} / {fmt(requests.get('lost'), 0)} / "
                                                    f"{fmt(requests.get('stored_twice'), 0)}"],
            ["results bit-identical to the fault-free run", f"{fmt(result.get('results_bit_identical'), 0)} of "
                                                            f"{fmt(result.get('results_compared'), 0)}"],
            ["metric rows equal", f"{fmt(result.get('metric_rows_equal'), 0)} of {fmt(result.get('metric_rows'), 0)}"],
            ["final weights bit-identical", fmt(result.get("final_weights_bit_identical"))]]
    return [Table(["what", "value"], rows)]


def elastic_recovery(result: dict) -> list[Table]:
    """Recovery time of an SP group after a loss: the persistent agent against a cold restart."""
    params = result.get("config", {}).get("num_params")
    rows = [["parameters", fmt(params, 0)], ["SP degree", fmt(result.get("config", {}).get("sp_degree"), 0)],
            ["agent recovery (s)", fmt(result.get("agent_recovery_s"), 2)],
            ["cold restart (s)", fmt(result.get("cold_restart_s"), 2)],
            ["ratio", f"{fmt(result.get('ratio'), 1)}×"],
            ["resumed bit-identical", fmt(result.get("resumed_bit_identical"))]]
    return [Table(["what", "value"], rows)]


def disaggregated(result: dict) -> list[Table]:
    """The disaggregation ladder: samples per second of each rung, mean [min–max] over the repeats."""
    table = Table(["rung", "samples / s, mean [min–max]", "vs first rung, mean [min–max]", "group reward std"])
    for rung, row in result.get("table", {}).items():
        rate = row.get("samples_per_s", {})
        versus = row.get("vs_colocated") or row.get("vs_first") or {}
        table.rows.append([rung, f"{fmt(rate.get('mean'), 1)} [{fmt(rate.get('min'), 1)}–{fmt(rate.get('max'), 1)}]",
                           f"{fmt(versus.get('mean'), 2)}× [{fmt(versus.get('min'), 2)}–{fmt(versus.get('max'), 2)}]",
                           fmt(row.get("group_reward_std", {}).get("mean"))])
    ceiling = result.get("overlap_ceiling")
    if isinstance(ceiling, dict):
        table.caption = ("Overlap ceiling from the measured generation and training times: "
                         f"{fmt(ceiling.get('ceiling'), 2)}×.")
    return [table]


def trainer_scaling(result: dict) -> list[Table]:
    """Trainer ranks: the loop's rollout and update on K = 1 and 2 ranks, update throughput for K devices, and the
    all-reduce bytes of the real families."""
    loop = Table(["case", "ranks", "rollout (s)", "update (s)", "rollout K=2/K=1", "update K=2/K=1"],
                 caption="The loop (mode vanilla, no spot device), median of the repeats; ratios pair by pair:")
    ratios = result.get("loop_ratio_k2_over_k1", {})
    for row in result.get("loop", []):
        case_ratios = ratios.get(row["case"], {}) if row.get("devices") == 2 else {}
        loop.rows.append([row["case"], fmt(row.get("devices"), 0), fmt(row["rollout"]["median_s"], 2),
                          fmt(row["train"]["median_s"], 2),
                          fmt(case_ratios.get("rollout", {}).get("median"), 2) if case_ratios else "",
                          fmt(case_ratios.get("train", {}).get("median"), 2) if case_ratios else ""])
    scaling = Table(["ranks", "update (s)", "samples / s", "all-reduce (s)"],
                    caption=f"Load average {fmt(result.get('load_average'), 1)} from other jobs during the run.")
    for row in result.get("scaling", []):
        scaling.rows.append([fmt(row.get("devices"), 0), fmt(row.get("update_s"), 2), fmt(row.get("samples_per_s"), 1),
                             fmt(row.get("all_reduce_s"), 3)])
    families = Table(["model", "parameters", "LoRA all-reduce (MiB)", "full all-reduce (GiB)"],
                     caption="Gradient bytes each step must all-reduce (counted from the model configs, not timed):")
    for row in result.get("families", []):
        families.rows.append([row["model"], fmt(row.get("parameters"), 0),
                              fmt(row.get("lora_allreduce_bytes", 0) / 2**20, 0),
                              fmt(row.get("full_allreduce_bytes", 0) / 2**30, 1)])
    return [loop, scaling, families]


def reward_accuracy(result: dict) -> list[Table]:
    """The reward on rendered ground truth, on another prompt's image, and on images with no object."""
    key = "strict_accuracy" if "no_object" in result else "exact_match"
    table = Table(["images", "count", key.replace("_", " "), "mean reward"])
    for condition, kinds in result.get("accuracy", {}).items():
        row = kinds.get("all", {})
        table.rows.append([condition, fmt(row.get("images"), 0), fmt(row.get(key)), fmt(row.get("mean_reward"))])
    for label, kinds in (("all prompts, clean", result.get("all_prompts_clean")),
                         ("another prompt's image", result.get("wrong_prompt") or result.get("wrong_text"))):
        if isinstance(kinds, dict):
            row = kinds.get("all", {})
            table.rows.append([label, fmt(row.get("images"), 0), fmt(row.get(key)), fmt(row.get("mean_reward"))])
    for condition, row in (result.get("no_object") or result.get("no_text") or {}).items():
        table.rows.append([condition, "–", fmt(row.get("strict_rate", row.get("exact_match"))),
                           fmt(row.get("mean_reward"))])
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


def runtime_modes(result: dict) -> list[Table]:
    """Every runtime mode for a few iterations: accuracy, wall time per iteration, dollars, utilisation."""
    table = Table(["mode", "iterations", "val accuracy base → final", "s / iteration", "$ total", "on-demand util",
                   "spot util"])
    for mode, row in result.get("modes", {}).items():
        table.rows.append([mode, fmt(row.get("iterations"), 0),
                           f"{fmt(row.get('base_val_accuracy'))} → {fmt(row.get('final_val_accuracy'))}",
                           fmt(row.get("wall_s_per_iteration"), 2), fmt(row.get("usd_total"), 3),
                           fmt(row.get("on_demand_util"), 2), fmt(row.get("spot_util"), 2)])
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


def sim_vs_runtime(result: dict) -> list[Table]:
    """The simulator against measured runtime runs: loop time and utilisation, measured vs simulated."""
    table = Table(["run", "variant", "quantity", "measured", "simulated", "relative error"],
                  caption=f"Tolerance {fmt(result.get('tolerance'), 2)}.")
    for run in result.get("runs", []):
        for variant, body in (run.get("variants") or {}).items():
            for quantity, row in (body.get("comparison") or {}).items():
                table.rows.append([str(run.get("run_dir", "")).rsplit("/", 1)[-1], variant, quantity,
                                   fmt(row.get("measured")), fmt(row.get("simulated")), fmt(row.get("relative_error"))])
    return [table]


SECTIONS: dict[str, Callable[[dict], list[Table]]] = {
    "time_to_target": time_to_target, "simulate_paper_scale": simulate_paper_scale, "long_run": long_run,
    "chaos": chaos, "elastic_recovery": elastic_recovery, "disaggregated_measured": disaggregated,
    "trainer_scaling": trainer_scaling, "reward_accuracy": reward_accuracy, "ocr_reward_accuracy": reward_accuracy,
    "pipeline_learns": pipeline_learns, "planner_synthetic": planner_synthetic, "planner_real": planner_real,
    "noise_attribution": noise_attribution, "runtime_modes": runtime_modes,
    "exploration_convergence": exploration_convergence, "sim_vs_runtime": sim_vs_runtime,
}


def _ratio_row(result: dict, label: str) -> list[str]:
    """Spotlight's median wall time to target against vanilla's, from a time_to_target JSON."""
    summary = result.get("summary", {})
    spot, vanilla = summary.get("spotlight", {}), summary.get("vanilla", {})
    spot_wall, vanilla_wall = spot.get("wall_s_to_target", {}), vanilla.get("wall_s_to_target", {})
    seeds = len(result.get("args", {}).get("seeds") or [])
    limit = result.get("args", {}).get("max_wall_s")

    def reached(wall: dict, runs: object) -> str:
        if wall.get("median") is None:
            return f"not reached in {minutes(limit)} min"
        return f"{minutes(wall['median'])} min ({wall.get('reached')}/{runs} runs)"

    ratio = spot.get("wall_s_to_target_vs_vanilla")
    if ratio is not None:
        verdict = f"**{fmt(ratio, 2)}×** vanilla's wall time"
    else:
        verdict = "**only spotlight reached it**" if spot_wall.get("median") is not None else "**neither reached it**"
    return [label.format(seeds=seeds), f"{verdict}: spotlight {reached(spot_wall, spot.get('runs'))}, "
                                       f"vanilla {reached(vanilla_wall, vanilla.get('runs'))}"]


def headline(load: Callable[[str], dict | None]) -> Table:
    """The README's short table of headline results, each from its JSON (``load(stem)``; None: absent)."""
    table = Table(["what (2-core CPU unless said)", "result", "numbers"])

    def add(stem: str, row: Callable[[dict], list[str]]) -> None:
        result = load(stem)
        if result is not None:
            table.rows.append([*row(result), f"[{stem}](docs/results.md#{stem})"])

    add("time_to_target",
        lambda r: _ratio_row(r, "time to +0.10 validation strict accuracy, mixed reward, {seeds} seeds"))
    add("time_to_target_strict", lambda r: _ratio_row(r, "the same with the binary strict reward, {seeds} seeds"))
    add("time_to_target_hard", lambda r: _ratio_row(r, "the same on counting and position prompts only, {seeds} seed"))

    def simulated(r: dict) -> list[str]:
        vanilla = r.get("ratios", {}).get("vanilla", {})
        alpha = r.get("drivers", {}).get("alpha")
        cluster = r.get("config", {}).get("cluster", {})
        return [f"simulated at paper scale ({_paper_model(r)}; {cluster.get('on_demand_devices')} on-demand + "
                f"{cluster.get('spot_devices')} spot H100s, spot trace `{cluster.get('trace')}`)",
                f"**{fmt(vanilla.get('faster'), 2)}× faster, {fmt(vanilla.get('cheaper'), 2)}× cheaper** than vanilla "
                f"(α {fmt(alpha, 2)} fitted to the measured runs)"]

    def guarded(r: dict) -> list[str]:
        verdicts = list(r.get("verdicts", {}).values())
        kept = sum(bool(v.get("kept_peak")) for v in verdicts)
        bests = [v.get("best") for v in verdicts if isinstance(v.get("best"), (int, float))]
        base = verdicts[0].get("base") if verdicts else None
        span = f"{fmt(min(bests))}–{fmt(max(bests))}" if bests else "–"
        return ["40-minute runs with the guard", f"final model = best in **{kept}/{len(verdicts)}** seeds; "
                                                 f"strict accuracy {fmt(base)} → {span}"]

    def chaos_row(r: dict) -> list[str]:
        requests = r.get("requests_chaos", {})
        return ["chaos: spot losses, queue and reward-server kills, a driver SIGKILL + resume",
                f"**{fmt(r.get('results_bit_identical'), 0)}/{fmt(r.get('results_compared'), 0)}** exploration results "
                f"bit-identical to a fault-free run, {fmt(requests.get('lost'), 0)} lost"]

    def recovery(r: dict) -> list[str]:
        return ["elastic SP group re-formed after a loss (SP-2)",
                f"**{fmt(r.get('ratio'), 1)}×** faster than a cold restart ({fmt(r.get('agent_recovery_s'), 2)} vs "
                f"{fmt(r.get('cold_restart_s'), 2)} s)"]

    def scaling(r: dict) -> list[str]:
        spans = []
        for table in r.get("tables", []):
            rows = table.get("rows", [])
            if rows:
                first, last = rows[0], rows[-1]
                spans.append(f"{table.get('model')} {fmt(first.get('images_per_gpu_s'), 3)} → "
                             f"{fmt(last.get('images_per_gpu_s'), 3)}")
        gpus = [row.get("gpus") for table in r.get("tables", [])[:1] for row in table.get("rows", [])]
        span = f"{gpus[0]} to {gpus[-1]}" if gpus else "–"
        link = next((table.get("interconnect", "") for table in r.get("tables", [])), "").partition(";")[0]
        return [f"simulated K data-parallel GPUs ({span} H100s, LoRA recipes, weak-scaled; assumed: {link})",
                "images per GPU-second " + "; ".join(spans) + " (not measured on a GPU)"]

    add("simulate_paper_scale", simulated)
    add("simulated_scaling", scaling)
    add("long_run-restore", guarded)
    add("chaos", chaos_row)
    add("elastic_recovery", recovery)
    table.rows.append(["real pipelines (SD3.5-M, FLUX.1-dev, Qwen-Image) on a GPU",
                       "**not measured: no GPU lent**", "–"])
    return table
