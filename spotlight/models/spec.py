"""One spec per model kind: everything the loop, the spot workers and sequence parallelism need of it.

Spotlight trains four kinds of model, each described by a config that travels (``model.json``, a
broadcast to spot devices):

    tinydit             a TinyDiT (`TinyDiTConfig`), trained in full
    tiny-diffusers      a small random SD3 / FLUX / Qwen-Image transformer drawn from ``init_seed``
    pretrained          a diffusers transformer alone, from a folder or Hub id
    pipeline            a whole pipeline folder: its text encoders, VAE and scheduler around the transformer

A `ModelSpec` names what each kind provides: how a policy is built from its config, how the config
is described again, its attention heads and latent shape (read from the config alone, so the
controller never builds a model), the SP degrees it allows, a policy built around broadcast weights,
and one sequence-parallel denoising step. `spec_of` is the one place that asks which kind a config
is: callers elsewhere hold a spec, or call a policy's own methods (`spotlight.models.policy`).

A policy an SP device process serves is built *around* the node's weights. TinyDiT broadcasts every
weight and is sharded between its stages (`tinydit_sp`); a diffusers transformer broadcasts only its
LoRA matrices: the frozen base is rebuilt once per process from the config and kept across attaches
(``PolicyCache``), and the LoRA parameters are pointed at the shared tensors, so weights the agent
replaces in place reach every process without a message. Its step runs token- and head-sharded
through the hooks of `pipelines.sequence_parallel` (FLUX, Qwen-Image, Wan). A pipeline folder's heads,
latents and tokens are read from its config files (`pipelines.folder`), which every node reads at the
same path; its device processes load the folder and encode their prompts with its text encoders.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch.distributed import ProcessGroup

from spotlight.diffusion.sampler import SamplingPlan, sample
from spotlight.models.pipelines.adapter import ARCHITECTURE as DIFFUSERS_ARCHITECTURE
from spotlight.models.pipelines.adapter import DiffusersPolicy
from spotlight.models.pipelines.family_config import TINY_CONFIGS, DiffusersPolicyConfig
from spotlight.models.pipelines.folder import PipelineFolderError, read_pipeline_folder
from spotlight.models.pipelines.inputs import channels_of
from spotlight.models.pipelines.policy import PipelinePolicy
from spotlight.models.pipelines.sequence_parallel import TOKEN_SHARDED_FAMILIES, sequence_parallel
from spotlight.models.policy import Policy
from spotlight.models.tinydit import ARCHITECTURE as TINYDIT_ARCHITECTURE
from spotlight.models.tinydit import TinyDiT, TinyDiTConfig
from spotlight.models.tinydit_sp import model_on_weights, sequence_parallel_step
from spotlight.models.ulysses import check_sp_degree
from spotlight.models.video.two_experts_policy import TwoExpertsPolicy

__all__ = ["ModelConfig", "ModelSpec", "PolicyCache", "attention_heads", "check_sp_policy", "config_from_description",
           "latent_shape_of", "policy_on_weights", "prepare_policy", "sp_denoise_step", "spec_of", "warm_up"]

ModelConfig = TinyDiTConfig | DiffusersPolicyConfig

PolicyCache = dict[str, DiffusersPolicy]
"""A device process's diffusers policies by description: the base is built once, LoRA re-pointed per attach."""

SPStep = Callable[[Policy, ProcessGroup | None, torch.Tensor, Sequence[int], SamplingPlan, torch.Tensor, int],
                  torch.Tensor]


@dataclass(frozen=True)
class ModelSpec:
    """What one model kind provides (module docstring); every member takes the kind's own config."""

    kind: str
    architecture: str  # what ``model.json`` names
    build: Callable[[Any], Policy]  # a fresh policy (random or pretrained base, zero-initialised LoRA B)
    describe_config: Callable[[Any], dict[str, Any]]  # plain JSON that rebuilds it without its state
    attention_heads: Callable[[Any], int]
    latent_shape: Callable[[Any], tuple[int, ...]]  # (C, H, W); a video's (C, f, h, w)
    check_sp: Callable[[Any, int], None]  # ValueError naming the degrees that fit
    on_weights: Callable[[Mapping[str, Any], Any, Mapping[str, torch.Tensor], bool, PolicyCache], Policy]
    prepare: Callable[[Mapping[str, Any], Any, PolicyCache], None]  # a warm spare builds its base ahead
    sp_step: SPStep


# --- TinyDiT ---------------------------------------------------------------------------------------------

def _tinydit_check_sp(config: TinyDiTConfig, sp_degree: int) -> None:
    """TinyDiT shards its joint [prompt; image] sequence as one: the degree divides its heads and all its tokens."""
    check_sp_degree(sp_degree, num_heads=config.num_heads)
    check_sp_degree(sp_degree, num_tokens=config.num_image_tokens + config.max_text_len)


def _tinydit_step(policy: Policy, group: ProcessGroup | None, tokens: torch.Tensor, seeds: Sequence[int],
                  plan: SamplingPlan, latents: torch.Tensor, step: int) -> torch.Tensor:
    assert isinstance(policy, TinyDiT)
    return sequence_parallel_step(policy, group, tokens, seeds, plan, latents, step)


TINYDIT = ModelSpec(
    kind="tinydit", architecture=TINYDIT_ARCHITECTURE, build=TinyDiT,
    describe_config=lambda config: {"architecture": TINYDIT_ARCHITECTURE, "config": config.to_dict()},
    attention_heads=lambda config: config.num_heads,
    latent_shape=lambda config: config.latent_shape,
    check_sp=_tinydit_check_sp,
    on_weights=lambda description, config, weights, copy, cache: model_on_weights(config, weights, copy=copy),
    prepare=lambda description, config, cache: None,  # nothing to build ahead: every weight comes with the attach
    sp_step=_tinydit_step,
)


# --- diffusers transformers (tiny, pretrained, pipeline folder) --------------------------------------------

def _tiny_architecture(config: DiffusersPolicyConfig) -> dict[str, Any]:
    """The transformer arguments of a tiny diffusers config; a pretrained one is refused in one line."""
    if not config.tiny:
        raise ValueError(f"elastic SP reads a diffusers policy's heads and latents from its config, which a pretrained "
                         f"transformer ({config.pretrained}) keeps in its folder: use a tiny config (model.family with "
                         "the tiny transformer) or runtime.sp_degree=1")
    return {**TINY_CONFIGS[config.family], **config.tiny_overrides}


def _diffusers_heads(config: DiffusersPolicyConfig) -> int:
    return int(_tiny_architecture(config)["num_attention_heads"])


def _diffusers_latent_shape(config: DiffusersPolicyConfig) -> tuple[int, int, int]:
    size = config.resolved_latent_size
    return (channels_of(config.family, int(_tiny_architecture(config)["in_channels"])), size, size)


def _diffusers_check_sp(config: DiffusersPolicyConfig, sp_degree: int) -> None:
    """A diffusers transformer shards its text and its image tokens separately (each must divide), and only the
    families whose rotary tables `pipelines.sequence_parallel` slices (FLUX, Qwen-Image) shard tokens at all."""
    check_sp_degree(sp_degree, num_heads=_diffusers_heads(config))
    if sp_degree > 1 and config.family not in TOKEN_SHARDED_FAMILIES:
        raise ValueError(f"elastic SP shards the tokens of {', '.join(TOKEN_SHARDED_FAMILIES)} transformers, not "
                         f"{config.family}: use model.family flux or qwen-image, or runtime.sp_degree=1")
    _, height, width = _diffusers_latent_shape(config)
    check_sp_degree(sp_degree, num_tokens=config.max_text_len)  # prompt tokens (model.max_text_len)
    check_sp_degree(sp_degree, num_tokens=(height // 2) * (width // 2))  # 2x2-packed image tokens


def _cached_base(description: Mapping[str, Any], config: DiffusersPolicyConfig, cache: PolicyCache) -> DiffusersPolicy:
    """This process's base of ``description``, built once by its kind (a pipeline folder's with its text
    encoders and VAE): a new architecture replaces the old one."""
    key = json.dumps(description, sort_keys=True)
    if key not in cache:
        cache.clear()
        policy = spec_of(config).build(config)
        assert isinstance(policy, DiffusersPolicy)
        cache[key] = policy.eval()
    return cache[key]


def _diffusers_on_weights(description: Mapping[str, Any], config: DiffusersPolicyConfig,
                          weights: Mapping[str, torch.Tensor], copy: bool, cache: PolicyCache) -> Policy:
    policy = _cached_base(description, config, cache)
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


def _diffusers_prepare(description: Mapping[str, Any], config: DiffusersPolicyConfig, cache: PolicyCache) -> None:
    _cached_base(description, config, cache)


def _diffusers_step(policy: Policy, group: ProcessGroup | None, tokens: torch.Tensor, seeds: Sequence[int],
                    plan: SamplingPlan, latents: torch.Tensor, step: int) -> torch.Tensor:
    assert isinstance(policy, DiffusersPolicy)
    sharded = contextlib.nullcontext() if group is None else sequence_parallel(policy, group)
    with torch.no_grad(), sharded:
        trajectory = sample(lambda x, sigma: policy(x, sigma, tokens), seeds, plan, policy.latent_shape,
                            start_latents=latents, start_step=step, stop_step=step + 1, record=False)
    return trajectory.final


def _diffusers_spec(kind: str, build: Callable[[DiffusersPolicyConfig], Policy]) -> ModelSpec:
    return ModelSpec(
        kind=kind, architecture=DIFFUSERS_ARCHITECTURE, build=build,
        describe_config=lambda config: {"architecture": DIFFUSERS_ARCHITECTURE,
                                        "config": config.model_dump(mode="json")},
        attention_heads=_diffusers_heads, latent_shape=_diffusers_latent_shape, check_sp=_diffusers_check_sp,
        on_weights=_diffusers_on_weights,
        prepare=_diffusers_prepare,
        sp_step=_diffusers_step,
    )


# --- a pipeline folder: heads, latents and tokens from its config files -------------------------------------

def _pipeline_resolution(config: DiffusersPolicyConfig) -> tuple[int, int]:
    return config.resolution or read_pipeline_folder(config.pretrained or "").default_resolution


def _pipeline_heads(config: DiffusersPolicyConfig) -> int:
    return int(read_pipeline_folder(config.pretrained or "").transformer["num_attention_heads"])


def _pipeline_latent_shape(config: DiffusersPolicyConfig) -> tuple[int, ...]:
    return read_pipeline_folder(config.pretrained or "").latent_shape(_pipeline_resolution(config), config.num_frames)


# Pipeline families whose shards the folder alone decides: Wan shards its video tokens only (its text is
# cross-attended whole). FLUX and Qwen-Image folders shard their prompt tokens too, whose count is the text
# encoders' (Qwen-Image's varies with the prompt), so they are not served with SP from a folder yet.
FOLDER_SHARDED_FAMILIES = ("wan",)


def _pipeline_check_sp(config: DiffusersPolicyConfig, sp_degree: int) -> None:
    """The degree divides the folder transformer's heads and its video tokens (latent frames x patches)."""
    check_sp_degree(sp_degree, num_heads=_pipeline_heads(config))
    if sp_degree > 1 and config.family not in FOLDER_SHARDED_FAMILIES:
        raise ValueError(f"SP over a pipeline folder serves {', '.join(FOLDER_SHARDED_FAMILIES)} folders, not "
                         f"{config.family} (its prompt tokens are sharded too, and their count is known only once "
                         f"encoded): set runtime.sp_degree 1, or use the tiny {config.family} transformer "
                         "(model.family without model.pretrained)")
    folder = read_pipeline_folder(config.pretrained or "")
    check_sp_degree(sp_degree, num_tokens=folder.image_tokens(_pipeline_resolution(config), config.num_frames))


TINY_DIFFUSERS = _diffusers_spec("tiny-diffusers", DiffusersPolicy.from_config)
PRETRAINED = _diffusers_spec("pretrained", DiffusersPolicy.from_config)
PIPELINE = replace(_diffusers_spec("pipeline", PipelinePolicy.from_config), attention_heads=_pipeline_heads,
                   latent_shape=_pipeline_latent_shape, check_sp=_pipeline_check_sp)

# a Wan2.2 A14B folder: both experts, the pipeline's switch between them (spotlight.models.video.two_experts_policy)
TWO_EXPERTS_PIPELINE = replace(PIPELINE, kind="pipeline-two-experts", build=TwoExpertsPolicy.from_config)


def _has_two_experts(config: DiffusersPolicyConfig) -> bool:
    """Whether the folder holds two experts; a folder that cannot be read is the plain pipeline kind's to refuse."""
    try:
        return read_pipeline_folder(config.pretrained or "").boundary_ratio is not None
    except PipelineFolderError:
        return False


def spec_of(config: ModelConfig | Mapping[str, Any]) -> ModelSpec:
    """The spec of the kind ``config`` describes (a plain mapping is a TinyDiT config): the one kind branch."""
    if isinstance(config, DiffusersPolicyConfig):
        if config.pipeline:
            return TWO_EXPERTS_PIPELINE if _has_two_experts(config) else PIPELINE
        return TINY_DIFFUSERS if config.tiny else PRETRAINED
    return TINYDIT


def config_from_description(description: Mapping[str, Any]) -> ModelConfig:
    """The config recorded in a ``describe()`` mapping; ValueError naming the architectures otherwise."""
    architecture = description.get("architecture", TINYDIT_ARCHITECTURE)
    if architecture == TINYDIT_ARCHITECTURE:
        return TinyDiTConfig(**description["config"])
    if architecture == DIFFUSERS_ARCHITECTURE:
        return DiffusersPolicyConfig.model_validate(description["config"])
    raise ValueError(f"unknown architecture {architecture!r}: expected {TINYDIT_ARCHITECTURE!r} or "
                     f"{DIFFUSERS_ARCHITECTURE!r}")


# --- what the SP runtime calls: each asks the config's spec ------------------------------------------------

def attention_heads(config: ModelConfig) -> int:
    """The attention heads of the policy ``config`` builds: every SP degree must divide them (Ulysses)."""
    return spec_of(config).attention_heads(config)


def latent_shape_of(config: ModelConfig) -> tuple[int, ...]:
    """(C, H, W) of the latents the policy of ``config`` denoises (a video's (C, f, h, w)), without building it."""
    return spec_of(config).latent_shape(config)


def check_sp_policy(config: ModelConfig, sp_degree: int) -> None:
    """ValueError naming the degrees that fit if ``sp_degree`` cannot shard this policy's heads and tokens."""
    spec_of(config).check_sp(config, sp_degree)


def policy_on_weights(description: Mapping[str, Any], weights: Mapping[str, torch.Tensor], copy: bool,
                      cache: PolicyCache) -> Policy:
    """The policy of ``description`` in eval mode whose trained tensors *are* ``weights`` (``copy``: copies).

    ``weights`` is the policy's broadcast state (every TinyDiT weight; a diffusers policy's LoRA
    matrices). ``cache`` keeps each diffusers base this process built, keyed by its description.
    """
    config = config_from_description(description)
    return spec_of(config).on_weights(description, config, weights, copy, cache)


def prepare_policy(description: Mapping[str, Any], cache: PolicyCache) -> None:
    """Build (and cache) a base ahead of its weights: what a warm spare does, so standing in is an attach."""
    config = config_from_description(description)
    spec_of(config).prepare(description, config, cache)


def sp_denoise_step(policy: Policy, group: ProcessGroup | None, tokens: torch.Tensor, seeds: Sequence[int],
                    plan: SamplingPlan, latents: torch.Tensor, step: int) -> torch.Tensor:
    """Latents (B, C, H, W), a video's (B, C, f, h, w), at ``step + 1`` from ``latents`` at ``step`` over ``group``.

    Every rank returns the same latents. Step k's noise comes from stream (seed, k), so the result
    does not depend on which group (or which formation of it) takes the step.
    """
    return spec_of(policy.config).sp_step(policy, group, tokens, seeds, plan, latents, step)


def warm_up() -> None:
    """One SP step of a minute TinyDiT: pays a device process's first-call costs (lazy imports, kernel set-up)."""
    config = TinyDiTConfig(image_size=8, patch_size=4, dim=16, depth=1, num_heads=2, max_text_len=2)
    weights = {name: torch.zeros_like(tensor) for name, tensor in TinyDiT(config).state_dict().items()}
    model = policy_on_weights(TINYDIT.describe_config(config), weights, copy=False, cache={})
    sp_denoise_step(model, None, torch.ones(1, 2, dtype=torch.long), [0], SamplingPlan(num_steps=1),
                    torch.zeros(1, *config.latent_shape), 0)
