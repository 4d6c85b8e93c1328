"""Rollouts from a velocity model: prompts to tokens (the task's tokenizer), the sampler bound to the model.

Not a policy object (that is `spotlight.models`): this is the glue every place that generates images
calls (the loop, exploration, evaluation, spot devices), so it is written once.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from spotlight.diffusion.sampler import SamplingPlan, Trajectory, VelocityFn, sample
from spotlight.models.policy import Policy
from spotlight.tasks.registry import task_of


def prompt_tokens(model: Policy, prompts: Sequence[str]) -> torch.Tensor:
    """Token ids (B, L) of prompts for ``model``'s text encoder (its task's tokenizer)."""
    return task_of(model).tokenize(prompts, model.config.max_text_len)


def velocity_fn(model: Policy, tokens: torch.Tensor) -> VelocityFn:
    """Bind the prompts so the sampler sees ``v(x, sigma)``; chunks follow the latent batch."""

    def velocity(x: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        return model(x, sigma, tokens)

    return velocity


def generate(
    model: Policy,
    prompts: Sequence[str],
    seeds: Sequence[int],
    plan: SamplingPlan,
    record: bool = True,
    chunk_size: int = 256,
) -> Trajectory:
    """Sample one trajectory per (prompt, seed) pair, in chunks to bound memory; a pure function of
    (weights, prompts, seeds, plan)."""
    if len(prompts) != len(seeds):
        raise ValueError(f"need one seed per prompt (got {len(prompts)} prompts, {len(seeds)} seeds)")
    tokens = prompt_tokens(model, prompts)
    parts = []
    for start in range(0, len(prompts), chunk_size):
        stop = start + chunk_size
        parts.append(
            sample(velocity_fn(model, tokens[start:stop]), list(seeds[start:stop]), plan,
                   model.latent_shape, record=record)
        )
    return Trajectory(
        latents=torch.cat([part.latents for part in parts]),
        log_probs=torch.cat([part.log_probs for part in parts]),
        start_step=0,
    )


def to_images(latents: torch.Tensor) -> torch.Tensor:
    """Model space [-1, 1] to images in [0, 1], (B, 3, H, W)."""
    return ((latents + 1.0) / 2.0).clamp(0.0, 1.0)
