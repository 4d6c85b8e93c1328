"""Exploration rounds on the pull queue: a batch of exploration requests that spot devices (or SP groups)
serve until it is drained, with the device time and pull round trips it cost.

GRPO-free: a round carries request ids and a plan; what the requests mean (candidates of which
prompts, scored how) is the Ray backend's. The controller thread updates an open round
(`SpotCluster`), the main thread opens and closes it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from spotlight.explore.planner import ExplorePlan

__all__ = ["Round", "results_in_order"]


@dataclass
class Round:
    """One exploration round: candidates of ``target``'s prompts denoised with θ_version via the queue.

    ``ids`` are the round's own requests (``prompts`` x ``plan.num_candidates``, prompt-major);
    ``extra_ids`` ride along on the same devices (the staleness monitor's re-scores) at
    ``extra_steps`` denoising steps each, so that the round's device time can be shared out.
    """

    target: int
    version: int
    plan: ExplorePlan
    prompts: list[str]
    candidates: torch.Tensor  # (P, N)
    ids: list[str]
    extra_ids: list[str] = field(default_factory=list)
    extra_steps: int = 0
    opened_at: float = 0.0
    drained: bool = False
    device_s: float = 0.0
    pull_trips_s: list[float] = field(default_factory=list)
    plan_metrics: dict[str, float] = field(default_factory=dict)

    @property
    def all_ids(self) -> list[str]:
        """Every request of the round: its own, then those riding along."""
        return self.ids + self.extra_ids

    def own_share(self) -> float:
        """The fraction of the round's device time that went to its own requests (not those riding along)."""
        own = len(self.ids) * self.plan.num_steps
        extra = len(self.extra_ids) * self.extra_steps
        return own / (own + extra) if extra else 1.0


def results_in_order(results: dict[str, torch.Tensor], ids: list[str], shape: tuple[int, ...]) -> torch.Tensor:
    """Results in request order; a cancelled request's slot is zeros (the caller marks its reward NaN)."""
    return torch.stack([results.get(rid, torch.zeros(shape)) for rid in ids])
