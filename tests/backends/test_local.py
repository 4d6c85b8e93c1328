"""The in-process backend: random seeds, or exploration with θ_i (sync-explore) or θ_{i-1} (stale-explore)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from spotlight.config import TrainConfig, parse_config
from spotlight.explore.planner import ExplorePlan
from spotlight.loop.seed_choice import explore
from spotlight.loop.streams import Stream, candidate_seeds, iteration_generator, iteration_prompts
from spotlight.rewards.base import RewardOutput
from spotlight.trainer import Trainer


class Brightness:
    """Mean pixel brightness: every seed of a random model earns a different reward."""

    name = "brightness"

    def score(self, images: torch.Tensor, prompts) -> RewardOutput:
        rewards = images.mean(dim=(1, 2, 3))
        return RewardOutput(rewards, rewards > 0.5, torch.ones(len(prompts), dtype=torch.bool))


def trainer_for(base: Path, run_dir: Path, mode: str) -> Trainer:
    config = parse_config(TrainConfig, {
        "mode": mode, "base_checkpoint": str(base), "run_dir": str(run_dir), "num_threads": 1,
        "rollout": {"prompts_per_iteration": 2, "group_size": 3, "num_steps": 3},
        "explore": {"num_candidates": 8, "num_steps": 2, "monitor_prompts": 1, "monitor_every": 1},
    })
    trainer = Trainer(config, reward=Brightness())
    with torch.no_grad():  # θ_{i-1} differs from θ_i, as after an update
        for parameter in trainer.previous.parameters():
            parameter.add_(0.2 * torch.randn_like(parameter, generator=torch.Generator().manual_seed(1)))
    return trainer


def test_vanilla_draws_group_size_random_seeds_from_the_iteration_stream(tiny_base_model, tmp_path) -> None:
    trainer = trainer_for(tiny_base_model, tmp_path / "run", "vanilla")
    prompts = iteration_prompts(trainer.train_prompts, 0, 4, 2)
    chosen = trainer.backend.choose_seeds(4, prompts, budget_s=5.0)
    assert torch.equal(chosen.seeds, candidate_seeds(0, 4, 2, 3)) and chosen.plan is None
    assert not torch.equal(chosen.seeds, candidate_seeds(0, 5, 2, 3))  # another iteration, other seeds


@pytest.mark.parametrize(("mode", "explorer"), [("sync-explore", "model"), ("stale-explore", "previous")])
def test_exploration_ranks_candidates_with_the_weights_of_its_mode(tiny_base_model, tmp_path, mode, explorer):
    trainer = trainer_for(tiny_base_model, tmp_path / mode, mode)
    prompts = iteration_prompts(trainer.train_prompts, 0, 1, 2)
    candidates = candidate_seeds(0, 1, 2, 8)
    plan = ExplorePlan(8, 2, "sde")

    def seeds_of(model) -> torch.Tensor:
        generator = iteration_generator(0, 1, Stream.SELECTION)
        return explore(model, prompts, candidates, plan, trainer.config, trainer.reward, generator)[0].seeds

    by_weights = {"model": seeds_of(trainer.model), "previous": seeds_of(trainer.previous)}
    assert not torch.equal(by_weights["model"], by_weights["previous"])  # the weights make a difference here
    chosen = trainer.backend.choose_seeds(1, prompts, budget_s=5.0)
    assert torch.equal(chosen.seeds, by_weights[explorer])
    assert chosen.plan == plan and "explore/selected_reward_std" in chosen.metrics
    assert ("staleness/kendall_tau" in chosen.metrics) is (mode == "stale-explore")  # stale is compared to θ_i
