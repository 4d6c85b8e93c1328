"""The in-process backend: vanilla, sync-explore and stale-explore on the trainer's own device.

Exploration runs before the rollout, in sequence: with θ_i in sync-explore, with θ_{i-1} in
stale-explore. Stale-explore is what Spotlight runs on spot devices, run here so that the effect of
stale weights on convergence is measured apart from the systems effect; it also ranks a few
prompts' candidates with θ_i to log how stale the ranking was (Kendall τ).
"""

from __future__ import annotations

import time
from typing import Any

import torch

from spotlight.backends.protocol import TrainerView
from spotlight.diffusion.sampler import SamplingPlan, Trajectory
from spotlight.explore.planner import ExplorePlan
from spotlight.loop.evaluation import sample_validation
from spotlight.loop.rollout import group_requests, rollout_plan
from spotlight.loop.seed_choice import Exploration, explore
from spotlight.loop.streams import Stream, candidate_seeds, iteration_generator
from spotlight.models.generation import generate
from spotlight.models.loop_model import LoopModel
from spotlight.rewards.overlap import sample_and_prefetch

__all__ = ["LocalBackend"]


class LocalBackend:
    """Rollout and exploration in this process (see the module docstring); implements `Backend`."""

    def __init__(self, view: TrainerView) -> None:
        self.view = view
        self._rollout_started = 0.0
        self._rollout_s = 0.0

    def start_iteration(self, iteration: int) -> None:
        """Nothing to hand out: every sampler here reads the trainer's own weights."""

    def choose_seeds(self, iteration: int, prompts: list[str], budget_s: float) -> Exploration:
        """Random seeds, or the G most varied of N candidates explored here with θ_i or θ_{i-1}."""
        view, config = self.view, self.view.config
        random_seeds = candidate_seeds(config.seed, iteration, len(prompts), config.rollout.group_size)
        if not config.mode.explores:
            return Exploration(seeds=random_seeds)
        plan, plan_metrics = self._plan(budget_s, len(prompts))
        if plan is None:  # nothing fits the budget: random seeds, as vanilla
            return Exploration(seeds=random_seeds, metrics=plan_metrics)
        candidates = candidate_seeds(config.seed, iteration, len(prompts), plan.num_candidates)
        generator = iteration_generator(config.seed, iteration, Stream.SELECTION)
        explorer = view.previous if config.mode.stale else view.model
        started = time.perf_counter()
        exploration, rewards = explore(explorer, prompts, candidates, plan, config, view.reward, generator)
        elapsed = time.perf_counter() - started
        if view.planner is not None:
            view.planner.observe_cost(plan, elapsed, len(prompts) * plan.num_candidates, plan.num_steps)
        exploration.metrics.update({"time/explore_s": elapsed, **plan_metrics})
        if config.mode.stale:
            exploration.metrics.update(self._measure_staleness(iteration, prompts, candidates, rewards,
                                                               exploration.seeds, plan))
        exploration.plan = plan
        return exploration

    def rollout(self, iteration: int, prompts: list[str], seeds: torch.Tensor) -> Trajectory:
        """All groups sampled here with θ_i; with reward.overlap, chunk by chunk, each scored while the next samples."""
        self._rollout_started = time.perf_counter()
        expanded, flat_seeds = group_requests(prompts, seeds)
        plan, model = rollout_plan(self.view.config), self.view.model
        return sample_and_prefetch(expanded, seeds.shape[1], self.view.config.reward.overlap_groups,
                                   lambda rows: generate(model, expanded[rows], flat_seeds[rows], plan),
                                   model.decode_images,
                                   self.view.reward)

    def training_started(self, iteration: int, budget_s: float) -> None:
        """Nothing runs beside training in one process; the rollout phase (sampling and scoring) ends here."""
        self._rollout_s = time.perf_counter() - self._rollout_started

    def training_ended(self, iteration: int) -> dict[str, float]:
        return {"time/rollout_s": self._rollout_s}

    def validation_samples(self, model: LoopModel, prompts: list[str], seeds: list[int],
                           plan: SamplingPlan) -> torch.Tensor:
        """Validation's samples, all drawn here."""
        return sample_validation(model, prompts, seeds, plan)

    def close(self) -> None:
        """Nothing held."""

    def state_dict(self) -> dict[str, Any]:
        """Nothing held between iterations: every choice is redrawn from the run's streams."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Nothing to take back."""

    def _plan(self, budget_s: float, num_prompts: int) -> tuple[ExplorePlan | None, dict[str, float]]:
        """This iteration's exploration plan: the planner's choice within the budget, or the fixed plan."""
        section, planner = self.view.config.explore, self.view.planner
        if planner is None:
            return ExplorePlan(section.num_candidates, section.num_steps, section.sampler), {}
        decision = planner.choose(budget_s, num_devices=1, num_prompts=num_prompts)
        metrics = {"planner/budget_s": budget_s, "planner/predicted_s": decision.predicted_time_s,
                   "planner/feasible_arms": float(len(decision.feasible_arms))}
        if decision.plan is not None:
            metrics.update({"planner/num_candidates": float(decision.plan.num_candidates),
                            "planner/num_steps": float(decision.plan.num_steps)})
        return decision.plan, metrics

    def _measure_staleness(self, iteration: int, prompts: list[str], candidates: torch.Tensor,
                           stale_rewards: torch.Tensor, stale_seeds: torch.Tensor,
                           plan: ExplorePlan) -> dict[str, float]:
        """Rank a sample of prompts' candidates with the fresh weights θ_i too; log Kendall τ and overlap."""
        view = self.view
        sample = view.config.explore.monitored_prompts(iteration, len(prompts))  # it runs on the critical path
        if sample == 0:
            return {}
        generator = iteration_generator(view.config.seed, iteration, Stream.SELECTION)
        fresh, fresh_rewards = explore(view.model, prompts[:sample], candidates[:sample], plan, view.config,
                                       view.reward, generator)
        record = view.monitor.record(iteration, stale_rewards[:sample], fresh_rewards, stale_seeds[:sample],
                                     fresh.seeds)
        return {"staleness/kendall_tau": record.tau, "staleness/selection_overlap": record.overlap}
