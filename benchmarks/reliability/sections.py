"""docs/results.md's tables for the benchmarks of faults and recovery (this folder), one function each.

Each function reads only what its benchmark wrote (see that benchmark's docstring for the fields) and
returns tables of formatted strings; nothing here computes a new number beyond a ratio or a rounding,
so the page says what the JSON says. Standard library only.
"""

from __future__ import annotations

from collections.abc import Callable

from benchmarks.tables import Table, fmt


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


SECTIONS: dict[str, Callable[[dict], list[Table]]] = {
    "chaos": chaos, "elastic_recovery": elastic_recovery,
}
