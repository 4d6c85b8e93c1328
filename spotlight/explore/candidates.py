"""Candidate scoring: run an exploration plan over candidate seeds and score the results with the reward."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from spotlight.diffusion.sampler import SamplingPlan
from spotlight.explore.planner import ExplorePlan
from spotlight.models.tinydit import TinyDiT
from spotlight.policy import generate, to_images
from spotlight.rewards.base import Reward, guarded_score


def score_candidates(
    model: TinyDiT,
    prompts: Sequence[str],
    seeds: torch.Tensor,
    plan: ExplorePlan,
    reward: Reward,
    shift: float = 1.0,
    noise_level: float = 0.7,
) -> torch.Tensor:
    """Rewards (P, N) of each prompt's N candidate seeds (P, N) under ``plan``; NaN where scoring failed.

    A pure function of (weights, prompts, seeds, plan): the same call on a spot worker with stale
    weights, or on the trainer with fresh ones, differs only through the weights. The SDE sampler
    follows each seed's own noise stream, so with ``plan.num_steps`` equal to the rollout's and fresh
    weights the candidate IS the rollout sample.
    """
    num_prompts, num_candidates = seeds.shape
    if len(prompts) != num_prompts:
        raise ValueError(f"need one row of seeds per prompt (got {len(prompts)} prompts, {num_prompts} rows)")
    expanded = [prompt for prompt in prompts for _ in range(num_candidates)]
    sampling = SamplingPlan(num_steps=plan.num_steps, shift=shift, sampler=plan.sampler, noise_level=noise_level)
    trajectory = generate(model, expanded, seeds.reshape(-1).tolist(), sampling, record=False)
    return score_latents(trajectory.final, prompts, reward)


def score_latents(latents: torch.Tensor, prompts: Sequence[str], reward: Reward) -> torch.Tensor:
    """Rewards (P, N) of denoised candidates ``latents`` (P·N, C, H, W), prompt-major; NaN where scoring failed.

    The scoring half of `score_candidates`, for candidates denoised elsewhere (spot devices via the queue).
    """
    num_prompts = len(prompts)
    if num_prompts == 0 or latents.shape[0] % num_prompts:
        raise ValueError(f"need the same number of candidates for each of the {num_prompts} prompts "
                         f"(got {latents.shape[0]} latents)")
    num_candidates = latents.shape[0] // num_prompts
    expanded = [prompt for prompt in prompts for _ in range(num_candidates)]
    scored = guarded_score(reward, to_images(latents), expanded)
    rewards = torch.where(scored.valid, scored.rewards, torch.full_like(scored.rewards, float("nan")))
    return rewards.reshape(num_prompts, num_candidates)
