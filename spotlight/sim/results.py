"""What a simulation returns: the per-iteration timeline and the run's headline numbers."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from spotlight.market.billing import Usage
from spotlight.market.pools import POOLS, Pool
from spotlight.modes import Mode

__all__ = ["IterationRecord", "SimResult"]


@dataclass(frozen=True)
class IterationRecord:
    """One iteration of the simulated loop. Times in seconds from the start of the run.

    sync_explore_s: exploration on the critical path (sync-explore only); explore_s: spot
    exploration from the start of training (spotlight only; ≤ train_s + loop.explore_wait_s);
    explore_wait_s: the trainer's wait after training, for the round past training (idle on
    on-demand) and for scoring its candidates on on-demand (the runtime's `time/explore_wait_s`);
    spot_explore_train_s: spot device-seconds of exploration while the trainer trained; plan: the (N, S) plan whose
    seeds this rollout used, None for random seeds; explored_prompts: prompts whose seeds it chose;
    group_std / random_std: the realised mean group reward std and what random seeds would have
    given; progress: cumulative fraction of the way to the target after this iteration; dollars:
    cumulative cost at its end; spot_removed: spot devices preempted during it.
    """

    iteration: int
    start_s: float
    sync_explore_s: float
    rollout_s: float
    train_s: float
    explore_s: float
    explore_wait_s: float
    spot_explore_train_s: float
    broadcast_s: float
    end_s: float
    spot_live: int
    plan: tuple[int, int] | None
    explored_prompts: int
    group_std: float
    random_std: float
    progress: float
    dollars: float
    spot_removed: int


@dataclass(frozen=True)
class SimResult:
    """What `simulate` returns.

    reached: whether the target was reached within loop.max_iterations; time_to_target_s and
    dollars_to_target: at the end of the iteration that reached it (inf when not reached);
    iterations_to_target: that iteration's count (None when not reached); usage: per pool, the
    device-seconds per phase of the whole simulated run, its dollars and utilisation;
    alpha / alpha_source: the convergence exponent used and where it came from.
    """

    mode: Mode
    reached: bool
    time_to_target_s: float
    dollars_to_target: float
    iterations_to_target: int | None
    iterations_run: int
    simulated_s: float
    dollars: float
    usage: dict[Pool, Usage]
    timeline: list[IterationRecord]
    alpha: float
    alpha_source: str
    prices_per_gpu_hour: dict[Pool, float] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        """Return the headline numbers and per-pool utilisation as plain (JSON-able) data."""
        return {
            "mode": self.mode,
            "reached": self.reached,
            "time_to_target_h": self.time_to_target_s / 3600.0,
            "dollars_to_target": self.dollars_to_target,
            "iterations_to_target": self.iterations_to_target,
            "mean_iteration_s": self.simulated_s / max(1, self.iterations_run),
            "mean_group_std": _mean([r.group_std for r in self.timeline]),
            "mean_random_std": _mean([r.random_std for r in self.timeline]),
            "spot_removed": sum(r.spot_removed for r in self.timeline),
            "alpha": self.alpha,
            "alpha_source": self.alpha_source,
            "utilisation": {pool: self.usage[pool].utilisation for pool in POOLS},
            "phase_shares": {pool: self.usage[pool].shares() for pool in POOLS},
            "dollars_by_pool": {pool: self.usage[pool].dollars for pool in POOLS},
            "prices_per_gpu_hour": self.prices_per_gpu_hour,
        }

    def timeline_dicts(self) -> list[dict[str, Any]]:
        """Return the per-iteration timeline as a list of plain dicts."""
        return [asdict(record) for record in self.timeline]


def _mean(values: list[float]) -> float:
    return float(np.mean(values)) if values else math.nan
