"""Candidate scoring: run an exploration plan over candidate seeds and score the results with the reward."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from spotlight.diffusion.sampler import SamplingPlan
from spotlight.explore.planner import ExplorePlan
from spotlight.models.generation import generate, images_of
from spotlight.models.policy import Policy, to_images
from spotlight.rewards.base import Reward, guarded_score


def exploration_sampling(plan: ExplorePlan, rollout: SamplingPlan) -> SamplingPlan:
    """How exploration arm ``plan`` samples for a rollout drawn with ``rollout``.

    A seed names a sample's whole randomness: its initial latent and, for SDE steps, the noise of
    step k (stream (seed, k)). An arm of S < K steps takes the rollout's first S - 1 steps (same
    schedule, same seeded noise, same sampler) and jumps to the data in one ODE step
    (`SamplingPlan.prefix_of`); S >= K is the rollout itself, so with fresh weights its candidates
    are the rollout's samples. Why: a sample's SDE noise decides most of its reward, so only arms
    that walk the rollout's noise path rank seeds the way the rollout will score them. With an ODE
    rollout (nft) the seed is the initial latent alone and every arm is an ODE prefix. An ODE arm
    for an SDE rollout samples S ODE steps of its own schedule (kept to measure how little it predicts).
    Every arm keeps the rollout's rows per sampling forward (``sample_batch``): it bounds the memory alike.
    """
    if plan.sampler == "ode" and rollout.sampler == "sde":
        return SamplingPlan(num_steps=plan.num_steps, shift=rollout.shift, sampler="ode", grid_end=rollout.grid_end,
                            shift_terminal=rollout.shift_terminal, sample_batch=rollout.sample_batch)
    if plan.num_steps >= rollout.num_steps:
        return rollout
    return SamplingPlan(num_steps=plan.num_steps, shift=rollout.shift, sampler=rollout.sampler,
                        noise_level=rollout.noise_level, sde_steps=rollout.sde_steps, prefix_of=rollout.num_steps,
                        grid_end=rollout.grid_end, shift_terminal=rollout.shift_terminal,
                        sample_batch=rollout.sample_batch)


def score_candidates(
    model: Policy, prompts: Sequence[str], seeds: torch.Tensor, sampling: SamplingPlan, reward: Reward
) -> torch.Tensor:
    """Rewards (P, N) of each prompt's N candidate seeds (P, N) sampled with ``sampling``; NaN where scoring failed.

    A pure function of (weights, prompts, seeds, plan): the same call on a spot worker with stale
    weights, or on the trainer with fresh ones, differs only through the weights. With the rollout's
    own sampling plan and fresh weights the candidate IS the rollout sample.
    """
    num_prompts, num_candidates = seeds.shape
    if len(prompts) != num_prompts:
        raise ValueError(f"need one row of seeds per prompt (got {len(prompts)} prompts, {num_prompts} rows)")
    expanded = [prompt for prompt in prompts for _ in range(num_candidates)]
    trajectory = generate(model, expanded, seeds.reshape(-1).tolist(), sampling, record=False)
    return score_latents(trajectory.final, prompts, reward, lambda latents: images_of(model, latents))


def score_latents(latents: torch.Tensor, prompts: Sequence[str], reward: Reward,
                  decode: Callable[[torch.Tensor], torch.Tensor] = to_images) -> torch.Tensor:
    """Rewards (P, N) of denoised candidates ``latents`` (P·N, C, H, W), prompt-major; NaN where scoring failed.

    The scoring half of `score_candidates`, for candidates denoised elsewhere (spot devices via the queue).
    ``decode`` turns latents into the reward's images (a pipeline policy's VAE: `generation.images_of`).
    """
    num_prompts = len(prompts)
    if num_prompts == 0 or latents.shape[0] % num_prompts:
        raise ValueError(f"need the same number of candidates for each of the {num_prompts} prompts "
                         f"(got {latents.shape[0]} latents)")
    num_candidates = latents.shape[0] // num_prompts
    expanded = [prompt for prompt in prompts for _ in range(num_candidates)]
    scored = guarded_score(reward, decode(latents), expanded)
    rewards = torch.where(scored.valid, scored.rewards, torch.full_like(scored.rewards, float("nan")))
    return rewards.reshape(num_prompts, num_candidates)
