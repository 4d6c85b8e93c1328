"""Seeds for a rollout's groups: random, or the G most varied of N explored candidates per prompt.

Every backend ends here: the in-process backend scores candidates itself (`explore`), the Ray
backend gets their latents back from spot devices and scores them, and both keep the same seeds
(`select_explored`, with the selection stream of the iteration the seeds are for).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from spotlight.config import TrainConfig
from spotlight.explore.candidates import exploration_sampling, score_candidates
from spotlight.explore.planner import ExplorePlan
from spotlight.explore.selection import select_seeds
from spotlight.loop.rollout import rollout_plan
from spotlight.models.loop_model import LoopModel
from spotlight.rewards.base import Reward

__all__ = ["Exploration", "explore", "select_explored"]


@dataclass
class Exploration:
    """Seeds (P, G) for a rollout, what choosing them measured, and the plan that explored them (None: random).

    ``preview``: the (P, G) rewards the exploration scored for the chosen seeds (None: random seeds), which
    the rollout's own rewards of the same seeds check (`spotlight.explore.fidelity`).
    """

    seeds: torch.Tensor
    metrics: dict[str, float] = field(default_factory=dict)
    plan: ExplorePlan | None = None
    preview: torch.Tensor | None = None


def explore(
    explorer: LoopModel, prompts: list[str], candidates: torch.Tensor, plan: ExplorePlan, config: TrainConfig,
    reward: Reward, generator: torch.Generator,
) -> tuple[Exploration, torch.Tensor]:
    """Score every candidate seed (P, N) under ``plan`` with ``explorer``'s weights; keep the G most varied.

    Returns the exploration and the (P, N) candidate rewards (the staleness monitor compares them).
    """
    sampling = exploration_sampling(plan, rollout_plan(config))
    rewards = score_candidates(explorer, prompts, candidates, sampling, reward)
    return select_explored(rewards, candidates, config, generator), rewards


def select_explored(rewards: torch.Tensor, candidates: torch.Tensor, config: TrainConfig,
                    generator: torch.Generator) -> Exploration:
    """Keep the G most varied of each prompt's scored candidates (rewards and seeds (P, N)), wherever scored."""
    selection = select_seeds(rewards, candidates, config.rollout.group_size, generator)
    metrics = {
        "explore/selected_reward_std": float(selection.variance.sqrt().mean()),
        "explore/candidate_reward_std": float(rewards.nan_to_num(0).std(dim=1, unbiased=False).mean()),
        "explore/degenerate_prompts": float(selection.degenerate.float().mean()),
    }
    return Exploration(seeds=selection.seeds, metrics=metrics, preview=torch.gather(rewards, 1, selection.indices))
