"""Scored batches for the disaggregation tests: real SDE rollouts of a randomised TinyDiT."""

from __future__ import annotations

import copy

import torch
from random_models import TINY_SHAPES_CONFIG, randomised_tinydit

from spotlight.diffusion.sampler import SamplingPlan, sample
from spotlight.disagg.samples import GenerationId, ScoredSample
from spotlight.models.tinydit import TinyDiT
from spotlight.tasks.shapes import tokenize

PROMPTS = ["a red circle", "two blue squares", "a green circle above a yellow triangle", "a yellow square"]
PLAN = SamplingPlan(num_steps=3, sampler="sde", noise_level=0.7)


def policy(seed: int = 0) -> TinyDiT:
    return randomised_tinydit(TINY_SHAPES_CONFIG, seed=seed, std=0.05)


def rewards_with_ties(num_prompts: int, group_size: int, seed: int) -> torch.Tensor:
    """Rewards (P, G) in which the last group is all equal (advantage 0 everywhere) and a sample ties its mean."""
    rewards = torch.rand(num_prompts, group_size, generator=torch.Generator().manual_seed(seed))
    rewards[-1] = 0.5
    return rewards


def scored_batch(model: TinyDiT, group_size: int = 4, version: int = 0, seed: int = 0,
                 produced_by: str = "generator") -> list[ScoredSample]:
    """Every (prompt, sample) of a len(PROMPTS) x group_size batch, sampled by ``model``, in prompt-major order."""
    tokens = tokenize(PROMPTS, TINY_SHAPES_CONFIG.max_text_len)
    rewards = rewards_with_ties(len(PROMPTS), group_size, seed)
    samples = []
    for prompt, prompt_tokens in enumerate(tokens):
        seeds = [1000 * seed + 10 * prompt + j for j in range(group_size)]
        batch_tokens = prompt_tokens.expand(group_size, -1)
        trajectory = sample(lambda x, sigma, t=batch_tokens: model(x, sigma, t), seeds, PLAN,
                            TINY_SHAPES_CONFIG.latent_shape)
        for j in range(group_size):
            samples.append(ScoredSample(
                id=GenerationId(prompt, j, version), latents=trajectory.latents[j], log_probs=trajectory.log_probs[j],
                tokens=prompt_tokens, reward=float(rewards[prompt, j]), produced_by=produced_by,
                step_versions=(version,) * PLAN.num_steps))
    return samples


def twin(model: torch.nn.Module) -> torch.nn.Module:
    return copy.deepcopy(model)


def score_by_brightness(final: torch.Tensor, members) -> list[tuple[float, bool]]:
    """A deterministic stand-in reward for tests: the mean of each final latent (every score valid)."""
    return [(float(row.mean()), True) for row in final]


def batch_tokens() -> torch.Tensor:
    return tokenize(PROMPTS, TINY_SHAPES_CONFIG.max_text_len)


def batch_seeds(group_size: int) -> torch.Tensor:
    return torch.arange(len(PROMPTS) * group_size).reshape(len(PROMPTS), group_size) + 500
