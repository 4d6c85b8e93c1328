"""Small simulations every number of which can be checked by hand, shared by the simulator's tests."""

from __future__ import annotations

from spotlight.config import parse_config
from spotlight.market.traces import Availability, NodeEvent
from spotlight.sim.sim_config import SimConfig


def trace_of(events: list[tuple[float, str, str]], duration_s: float) -> Availability:
    return Availability(tuple(NodeEvent(t, kind, node) for t, kind, node in events), duration_s)


STEADY = trace_of([(0.0, "add", "a"), (0.0, "add", "b")], 1e6)  # two nodes, never preempted


def small(mode: str, on_demand: int = 4, spot: int = 2, iterations: float = 5, **cluster: object) -> SimConfig:
    """4 prompts × 4 samples on a handful of devices: fast, and every number is hand-checkable."""
    return parse_config(SimConfig, {
        "mode": mode,
        "cluster": {"on_demand_devices": on_demand, "spot_devices": spot, **cluster},
        "loop": {"prompts_per_iteration": 4, "group_size": 4, "max_iterations": 60},
        "planner": {"num_candidates": [4, 8, 16], "num_steps": [2, 4, 8]},
        "convergence": {"vanilla_iterations": iterations},
    })
