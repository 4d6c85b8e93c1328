"""The README's short table of headline results, each row from one benchmark's JSON.

Standard library only, like the rest of the page (``write_results_page.py`` writes it between two marker lines).
"""

from __future__ import annotations

from collections.abc import Callable

from benchmarks.sim.sections import paper_model
from benchmarks.tables import Table, fmt, minutes


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
        return [f"simulated at paper scale ({paper_model(r)}; {cluster.get('on_demand_devices')} on-demand + "
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
