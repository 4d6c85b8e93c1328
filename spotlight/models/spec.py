"""The policy an SP device process serves, whichever kind it is: built around the node's weights, one SP step.

The elastic SP runtime (`agent`, `sp_process`, `elastic_sp`) sends a policy's *description*
(``architecture`` + ``config``, `spotlight.models.rebuild.describe_config`) and its broadcast state,
and asks for single denoising steps. This module is the one place that knows how each kind is
built and sharded:

- TinyDiT: every weight is broadcast; the model is built *around* the shared tensors
  (`sp_denoise.model_on_weights`) and sharded between its stages (`sp_denoise.sequence_parallel_step`).
- a diffusers transformer with LoRA: only the LoRA matrices are broadcast. The frozen base and its
  text encoder are rebuilt from the config (deterministic from ``init_seed``) once per process and
  kept across attaches; the LoRA parameters are then pointed at the shared tensors, so weights the
  agent replaces in place reach every process without a message, as TinyDiT's do. The step runs
  token- and head-sharded through the hooks of `diffusers_sp.sequence_parallel` (FLUX, Qwen-Image).

The SP degrees a policy allows follow from its attention heads and token counts
(`check_sp_policy`), read from the config alone so the controller never builds a model.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch.distributed import ProcessGroup

from spotlight.diffusion.sampler import SamplingPlan, sample
from spotlight.models.pipelines.adapter import DiffusersPolicy
from spotlight.models.pipelines.family_config import TINY_CONFIGS, DiffusersPolicyConfig
from spotlight.models.pipelines.inputs import channels_of
from spotlight.models.policy import Policy
from spotlight.models.rebuild import ModelConfig, config_from_description
from spotlight.models.tinydit import TinyDiT
from spotlight.runtime.sp.diffusers_denoise import TOKEN_SHARDED_FAMILIES, sequence_parallel
from spotlight.runtime.sp.denoise import model_on_weights, sequence_parallel_step
from spotlight.runtime.sp.ulysses import check_sp_degree

__all__ = ["attention_heads", "check_sp_policy", "latent_shape_of", "policy_on_weights", "prepare_policy",
           "sp_denoise_step"]

PolicyCache = dict[str, DiffusersPolicy]
"""A device process's diffusers policies by description: the base is built once, LoRA re-pointed per attach."""


def _tiny_architecture(config: DiffusersPolicyConfig) -> dict[str, Any]:
    """The transformer arguments of a tiny diffusers config; a pretrained one is refused in one line."""
    if not config.tiny:
        raise ValueError(f"elastic SP reads a diffusers policy's heads and latents from its config, which a pretrained "
                         f"transformer ({config.pretrained}) keeps in its folder: use a tiny config (model.family with "
                         "the tiny transformer) or runtime.sp_degree=1")
    return {**TINY_CONFIGS[config.family], **config.tiny_overrides}


def attention_heads(config: ModelConfig) -> int:
    """The attention heads of the policy ``config`` builds: every SP degree must divide them (Ulysses)."""
    if isinstance(config, DiffusersPolicyConfig):
        return int(_tiny_architecture(config)["num_attention_heads"])
    return config.num_heads


def latent_shape_of(config: ModelConfig) -> tuple[int, int, int]:
    """(C, H, W) of the latents the policy of ``config`` denoises, without building it."""
    if isinstance(config, DiffusersPolicyConfig):
        size = config.resolved_latent_size
        return (channels_of(config.family, int(_tiny_architecture(config)["in_channels"])), size, size)
    return config.latent_shape


def check_sp_policy(config: ModelConfig, sp_degree: int) -> None:
    """ValueError naming the degrees that fit if ``sp_degree`` cannot shard this policy's heads and tokens.

    TinyDiT shards its joint [prompt; image] sequence as one; a diffusers transformer shards its text and
    its image tokens separately (each must divide), and only the families whose rotary tables
    `diffusers_sp` slices (FLUX, Qwen-Image) shard tokens at all.
    """
    check_sp_degree(sp_degree, num_heads=attention_heads(config))
    if not isinstance(config, DiffusersPolicyConfig):
        check_sp_degree(sp_degree, num_tokens=config.num_image_tokens + config.max_text_len)
        return
    if sp_degree > 1 and config.family not in TOKEN_SHARDED_FAMILIES:
        raise ValueError(f"elastic SP shards the tokens of {', '.join(TOKEN_SHARDED_FAMILIES)} transformers, not "
                         f"{config.family}: use model.family flux or qwen-image, or runtime.sp_degree=1")
    _, height, width = latent_shape_of(config)
    check_sp_degree(sp_degree, num_tokens=config.max_text_len)  # prompt tokens (model.max_text_len)
    check_sp_degree(sp_degree, num_tokens=(height // 2) * (width // 2))  # 2x2-packed image tokens


def policy_on_weights(description: Mapping[str, Any], weights: Mapping[str, torch.Tensor], copy: bool,
                      cache: PolicyCache) -> Policy:
    """The policy of ``description`` in eval mode whose trained tensors *are* ``weights`` (``copy``: copies).

    ``weights`` is the policy's broadcast state (every TinyDiT weight; a diffusers policy's LoRA
    matrices). ``cache`` keeps each diffusers base this process built, keyed by its description.
    """
    config = config_from_description(description)
    if not isinstance(config, DiffusersPolicyConfig):
        return model_on_weights(config, weights, copy=copy)
    key = json.dumps(description, sort_keys=True)
    if key not in cache:
        cache.clear()  # one architecture at a time: a new one replaces the old base
        cache[key] = DiffusersPolicy.from_config(config).eval()
    policy = cache[key]
    parameters = policy.lora_parameters()
    if parameters.keys() != weights.keys():
        missing, extra = sorted(parameters.keys() - weights.keys()), sorted(weights.keys() - parameters.keys())
        raise ValueError(f"the weights are not this policy's LoRA state ({len(missing)} missing, {len(extra)} "
                         f"unexpected, e.g. {(missing or extra)[0]}): send broadcast_state() of this config's policy")
    for name, parameter in parameters.items():
        tensor = weights[name]
        if tensor.shape != parameter.shape or tensor.dtype != parameter.dtype:
            raise ValueError(f"LoRA weight {name} is {tuple(tensor.shape)} {tensor.dtype}, the policy's "
                             f"{tuple(parameter.shape)} {parameter.dtype}: send broadcast_state() of this config")
        parameter.data = tensor.clone() if copy else tensor
    return policy


def prepare_policy(description: Mapping[str, Any], cache: PolicyCache) -> None:
    """Build (and cache) a diffusers base ahead of its weights: what a warm spare does, so standing in is an attach."""
    config = config_from_description(description)
    key = json.dumps(description, sort_keys=True)
    if isinstance(config, DiffusersPolicyConfig) and key not in cache:
        cache.clear()
        cache[key] = DiffusersPolicy.from_config(config).eval()


def sp_denoise_step(policy: Policy, group: ProcessGroup | None, tokens: torch.Tensor, seeds: Sequence[int],
                    plan: SamplingPlan, latents: torch.Tensor, step: int) -> torch.Tensor:
    """Latents (B, C, H, W) at schedule index ``step + 1`` from ``latents`` at ``step``, over the SP ``group``.

    Every rank returns the same latents. Step k's noise comes from stream (seed, k), so the result
    does not depend on which group (or which formation of it) takes the step.
    """
    if isinstance(policy, TinyDiT):
        return sequence_parallel_step(policy, group, tokens, seeds, plan, latents, step)
    if not isinstance(policy, DiffusersPolicy):
        raise TypeError(f"SP devices serve TinyDiT or DiffusersPolicy, not {type(policy).__name__}")
    sharded = contextlib.nullcontext() if group is None else sequence_parallel(policy, group)
    with torch.no_grad(), sharded:
        trajectory = sample(lambda x, sigma: policy(x, sigma, tokens), seeds, plan, policy.latent_shape,
                            start_latents=latents, start_step=step, stop_step=step + 1, record=False)
    return trajectory.final
