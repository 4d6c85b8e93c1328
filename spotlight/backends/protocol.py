"""The one interface between the training loop and where its sampling runs.

The loop (`spotlight.trainer.Trainer.iteration`) is the same in every mode; a backend decides where
the rollout is sampled and where, when and with which weights exploration runs:

    local (one process)   rollout here; exploration here, before the rollout, with θ_i (sync-explore)
                          or θ_{i-1} (stale-explore)
    Ray (device pools)    rollout split over the on-demand device and the spot devices holding θ_i;
                          exploration on spot devices, with θ_i before the rollout (sync-explore) or
                          with θ_i for P_{i+1} while θ_i trains (spotlight), through the pull queue

Backends never import the loop: what they need of the trainer they get as a `TrainerView`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from spotlight.config import TrainConfig
from spotlight.diffusion.sampler import SamplingPlan, Trajectory
from spotlight.explore.planner import ExplorationPlanner
from spotlight.explore.staleness import StalenessMonitor
from spotlight.loop.seed_choice import Exploration
from spotlight.models.loop_model import LoopModel
from spotlight.rewards.base import Reward

__all__ = ["Backend", "TrainerView"]


@dataclass(frozen=True)
class TrainerView:
    """What a backend sees of the trainer. The models are updated in place by the loop, never replaced."""

    config: TrainConfig
    model: LoopModel  # θ_i while iteration i runs; θ_{i+1} once it has trained
    previous: LoopModel  # θ_{i-1}: the stale explorer
    eval_model: LoopModel  # what validation samples (the EMA, or the model itself)
    reward: Reward
    train_prompts: list[str]
    planner: ExplorationPlanner | None
    monitor: StalenessMonitor
    run_dir: Path


class Backend(Protocol):
    """Where iteration i's sampling runs. The loop calls these in this order, once per iteration."""

    def start_iteration(self, iteration: int) -> None:
        """θ_i is final: hand it to every device that samples with it."""
        ...

    def choose_seeds(self, iteration: int, prompts: list[str], budget_s: float) -> Exploration:
        """The (P, G) seeds of P_i's groups: random, or explored with θ_i or θ_{i-1} as the mode says.

        ``budget_s`` is the last training time: what a planner must fit an exploration into.
        """
        ...

    def rollout(self, iteration: int, prompts: list[str], seeds: torch.Tensor) -> Trajectory:
        """Sample the (P, G) groups with θ_i, in `spotlight.loop.rollout.group_requests` order."""
        ...

    def training_started(self, iteration: int, budget_s: float) -> None:
        """θ_i starts training: what runs beside it starts now (spotlight: exploring P_{i+1} with θ_i)."""
        ...

    def training_ended(self, iteration: int) -> dict[str, float]:
        """θ_{i+1} is trained: wait for what ran beside it; this backend's metrics of the iteration."""
        ...

    def validation_samples(self, model: LoopModel, prompts: list[str], seeds: list[int],
                           plan: SamplingPlan) -> torch.Tensor:
        """Validation's final latents of ``model`` for each (prompt, seed), in chunks of fixed size
        (`spotlight.loop.evaluation.sample_validation`): here, or shared with spot devices, the same bits."""
        ...

    def close(self) -> None:
        """Release what the backend holds (devices, threads) and write its run totals; safe to call twice."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """What the backend holds between iterations that a resumed run needs (JSON-able; {} when nothing)."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take back `state_dict` after ``--resume``, before the first iteration."""
        ...
