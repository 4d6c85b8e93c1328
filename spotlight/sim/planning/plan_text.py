"""`spotlight plan`'s answer as tables for a terminal (``--json`` prints `PlanReport.to_json` instead)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from spotlight.sim.cluster_mix import MixRow
from spotlight.sim.planning.plan_report import PlanReport

__all__ = ["print_plan"]


def _table(title: str, rows: list[tuple[str, Any]]) -> Table:
    table = Table(title=title, title_justify="left")
    table.add_column("")
    table.add_column("value", justify="right")
    for name, value in rows:
        table.add_row(name, f"{value:.4g}" if isinstance(value, float) else str(value))
    return table


def _mix(row: MixRow | None) -> str:
    if row is None:
        return "none meets the deadline"
    return (f"{row.on_demand_devices} on-demand ({row.on_demand_instance}) + {row.spot_devices} spot "
            f"({row.spot_instance}): {row.time_to_target_s / 3600:.2f} h, ${row.dollars_to_target:,.0f}")


def print_plan(report: PlanReport, console: Console) -> None:
    """Print the workload, the iteration's split, one GPU's numbers, the cheapest mixes and the assumptions."""
    work = report.workload
    if "tflop_per_forward" in work:
        console.print(_table(f"workload: {work['from']} ({work['family']}) on {work['gpu']}", [
            ("resolution", "x".join(str(side) for side in work["resolution"])),
            ("tokens (image + text)", f"{work['image_tokens']} + {work['text_tokens']}"),
            ("TFLOP per forward / forward+backward", f"{work['tflop_per_forward']:.3g} / "
                                                    f"{work['tflop_per_forward_backward']:.3g}"),
            ("rollout forwards per image", work["rollout_forwards_per_image"]),
            ("update passes per sample", ", ".join(f"{n:g} {name}" for name, n in
                                                   work["update_passes_per_sample"].items())),
            ("update TFLOP per sample", work["update_tflop_per_sample"]),
            ("parameters (trained)", f"{work['parameters'] / 1e9:.2f} B ({work['trainable_parameters'] / 1e6:.1f} M)"),
            ("all-reduce per optimizer step", f"{work['gradient_bytes_per_step'] / 1e6:.1f} MB "
                                              f"x {work['optimizer_steps']} steps"),
        ]))
    else:
        console.print(f"workload: {work['from']}")
    split = report.iteration_s
    console.print(_table(f"one iteration on {report.per_gpu['cluster']}, seconds", [
        ("rollout", split["rollout"]), ("update", split["update"]), ("exploration (trainer waits)",
                                                                     split["exploration_wait"]),
        ("weight broadcast", split["weight_broadcast"]), ("total", split["total"]),
        ("exploration on spot, device-seconds", split["exploration_spot_device_s"]),
    ]))
    gpu = report.per_gpu
    rows: list[tuple[str, Any]] = [("rollout device-s per image", gpu["rollout_device_s_per_image"]),
                                   ("update device-s per sample", gpu["update_device_s_per_sample"]),
                                   ("images per GPU-second", gpu["images_per_gpu_s"])]
    if "memory_gib" in gpu:
        peak = f", peak phase {gpu['memory_peak_phase']}" if gpu.get("memory_peak_phase") else ""
        rows += [("trainer memory, GiB", f"{gpu['memory_gib']:.1f} of {gpu['device_memory_gib']:.1f}{peak}"),
                 ("micro-batch (of the minibatch's rows)", f"{gpu['micro_batch']} of {gpu['minibatch_rows']}")]
    console.print(_table("one GPU", rows))
    console.print(f"cheapest mix for {report.deadline_h:g} h, with exploration (spotlight): "
                  f"{_mix(report.with_exploration)}")
    console.print(f"cheapest mix for {report.deadline_h:g} h, without (spot-rollout): "
                  f"{_mix(report.without_exploration)}")
    assumptions = Table(title="assumptions", title_justify="left")
    for column in ("", "value", "from"):
        assumptions.add_column(column)
    for row in report.assumptions:
        value = row["value"]
        assumptions.add_row(row["name"], f"{value:.4g}" if isinstance(value, float) else str(value), row["source"])
    console.print(assumptions)
