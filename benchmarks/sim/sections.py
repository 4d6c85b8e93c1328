"""docs/results.md's tables for the simulator's benchmarks (this folder), one function each.

Each function reads only what its benchmark wrote (see that benchmark's docstring for the fields) and
returns tables of formatted strings; nothing here computes a new number beyond a ratio or a rounding,
so the page says what the JSON says. Standard library only.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from benchmarks.tables import Table, fmt


def paper_model(result: dict) -> str:
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
    workload = Table(["workload", "value"], caption=f"Workload: {paper_model(result)}.")
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
    "simulate_paper_scale": simulate_paper_scale, "sim_vs_runtime": sim_vs_runtime,
}
