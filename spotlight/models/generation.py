"""Rollouts from a velocity model: prompts to tokens (the task's tokenizer), the sampler bound to the model.

Not a policy object (that is `spotlight.models`): this is the glue every place that generates images
calls (the loop, exploration, evaluation, spot devices), so it is written once.

Every policy tokenizes its prompts and decodes its latents itself (`spotlight.models.policy`): a
pipeline folder through its prompt ids and VAE, a pixel-space policy (TinyDiT, the tiny diffusers
families) through its task's tokenizer, its samples being the images.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from spotlight.diffusion.sampler import SamplingPlan, Trajectory, VelocityFn, sample
from spotlight.models.lora_merge import sampling_weights
from spotlight.models.pipelines.prompts import bind_prompts
from spotlight.models.policy import Policy


def prompt_tokens(model: Policy, prompts: Sequence[str], guided: bool = True) -> torch.Tensor:
    """The conditioning rows (B, L) int64 of ``prompts`` for ``model`` (``Policy.tokenize``: a pipeline's prompt
    ids, ``guided`` False asking for the CFG-free velocity; a pixel-space policy's task token ids)."""
    return model.tokenize(prompts, guided)


def images_of(model: Policy, latents: torch.Tensor) -> torch.Tensor:
    """What the reward sees: images (B, 3, H, W) in [0, 1] of sampled latents (``Policy.decode_images``)."""
    return model.decode_images(latents)


def model_device(model: Policy) -> torch.device:
    """The device the model's weights are on (where sampling runs)."""
    return next(model.parameters()).device


def velocity_fn(model: Policy, tokens: torch.Tensor) -> VelocityFn:
    """Bind the prompts (once, `bind_prompts`) so the sampler sees ``v(x, sigma)``; chunks follow the latent batch."""
    cond = bind_prompts(model, tokens)

    def velocity(x: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        return model(x, sigma, cond)

    return velocity


def generate(
    model: Policy,
    prompts: Sequence[str],
    seeds: Sequence[int],
    plan: SamplingPlan,
    record: bool = True,
) -> Trajectory:
    """Sample one trajectory per (prompt, seed) pair, in chunks of ``plan.sample_batch`` rows to bound memory;
    a pure function of (weights, prompts, seeds, plan).

    The chunk size is the plan's, not the caller's: a row's float bits depend on the batch it is computed in,
    so every process that samples a rollout's rows (the trainer, its ranks, the spot devices) chunks them
    alike and the rows come out the same bits whoever sampled them.
    Per chunk the prompts are bound to the device once and the LoRA of a LoRA policy is folded into its
    base weights for the whole rollout where ``merge_lora`` asks for it (`sampling_weights`), so the
    denoising loop reads nothing back from the device; the trajectory comes to the CPU once at the end.
    """
    if len(prompts) != len(seeds):
        raise ValueError(f"need one seed per prompt (got {len(prompts)} prompts, {len(seeds)} seeds)")
    tokens = prompt_tokens(model, prompts)
    device = model_device(model)
    chunk_size = plan.sample_batch
    parts = []
    with sampling_weights(model):
        for start in range(0, len(prompts), chunk_size):
            stop = start + chunk_size
            parts.append(
                sample(velocity_fn(model, tokens[start:stop]), list(seeds[start:stop]), plan,
                       model.latent_shape, record=record, device=device)
            )
    return Trajectory(  # on the CPU, where the loop keeps samples (commits, rewards, checkpoints)
        latents=torch.cat([part.latents.cpu() for part in parts]),
        log_probs=torch.cat([part.log_probs.cpu() for part in parts]),
        start_step=0,
    )
