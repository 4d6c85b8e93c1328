"""docs/results.md's tables for the runtime's benchmarks (this folder), one function each.

Each function reads only what its benchmark wrote (see that benchmark's docstring for the fields) and
returns tables of formatted strings; nothing here computes a new number beyond a ratio or a rounding,
so the page says what the JSON says. Standard library only.
"""

from __future__ import annotations

from collections.abc import Callable

from benchmarks.tables import Table, fmt


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


SECTIONS: dict[str, Callable[[dict], list[Table]]] = {
    "disaggregated_measured": disaggregated, "trainer_scaling": trainer_scaling, "runtime_modes": runtime_modes,
}
