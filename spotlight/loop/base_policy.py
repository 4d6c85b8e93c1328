"""The policy a training run starts from: what ``model`` and ``base_checkpoint`` of the config name.

One call for the loop, whatever the model: a TinyDiT loaded from its base checkpoint (every weight
trained), a diffusers transformer with LoRA rebuilt from the ``model`` section (base drawn from
``init_seed``, LoRA B at zero, so the policy starts as its base), or a diffusers pipeline folder
(``model.pretrained``, `spotlight.models.pipelines.policy`) at the rollout's resolution and guidance.
Called twice it returns two equal policies, which is how the loop gets its frozen reference. The
policy is placed on the config's ``device``; a bad folder, resolution or device is one line
(`ConfigError`, naming the field).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from spotlight.components.checkpoint import load_model
from spotlight.models.pipelines.family_config import DiffusersPolicyConfig
from spotlight.models.pipelines.folder import PipelineFolderError
from spotlight.models.policy import Policy
from spotlight.models.rebuild import policy_from_config
from spotlight.models.spec import check_sp_policy
from spotlight.schema import ConfigError
from spotlight.task_presets import get_task

if TYPE_CHECKING:
    from spotlight.config import TrainConfig

__all__ = ["build_policy", "check_device", "policy_config"]


def check_device(device: str) -> torch.device:
    """``device`` as a torch device; ConfigError in one line when it is cuda and this torch has no CUDA device."""
    if device == "cuda" and not torch.cuda.is_available():
        build = "a CPU-only build" if torch.version.cuda is None else f"CUDA {torch.version.cuda}, no device visible"
        raise ConfigError(f"device: cuda, but torch {torch.__version__} sees no CUDA device ({build}): "
                          "run on a machine with an NVIDIA GPU and a CUDA torch, or set device: cpu")
    return torch.device(device)


def policy_config(config: TrainConfig) -> DiffusersPolicyConfig | None:
    """The diffusers description of the run's policy (None for a TinyDiT); ConfigError naming the field."""
    section, rollout = config.model, config.rollout
    if section.pretrained is None:
        if (rollout.guidance_scale != 1.0 or rollout.guidance_scale_2 is not None or rollout.resolution is not None
                or rollout.num_frames is not None):
            field = ("guidance_scale" if rollout.guidance_scale != 1.0 else
                     "guidance_scale_2" if rollout.guidance_scale_2 is not None else
                     "resolution" if rollout.resolution is not None else "num_frames")
            raise ConfigError(f"rollout.{field} applies to a pipeline folder (model.pretrained); the {section.family} "
                              f"policy has no negative prompt or VAE: remove rollout.{field} or set model.pretrained")
        if section.family == "tinydit":
            return None
        task = get_task(config.task)
        return section.diffusers_config(task.name, task.vocab_size, task.image_size)
    try:
        description = section.pipeline_config(config.task, rollout.resolution_hw, rollout.guidance_scale,
                                              rollout.negative_prompt, config.dtype, rollout.num_frames,
                                              rollout.guidance_scale_2)
    except PipelineFolderError as error:
        raise ConfigError(str(error) if str(error).startswith(("model.", "rollout.")) else
                          f"model.pretrained: {error}") from None
    except ValueError as error:  # a family that contradicts the folder
        raise ConfigError(str(error)) from None
    if config.runtime.sp_degree > 1:  # the folder's heads and tokens must shard (its spec, models/spec.py)
        try:
            check_sp_policy(description, config.runtime.sp_degree)
        except ValueError as error:
            raise ConfigError(f"runtime.sp_degree={config.runtime.sp_degree}: {error}") from None
    return description


def build_policy(config: TrainConfig) -> Policy:
    """The run's initial policy on the config's device (see the module docstring)."""
    device = check_device(config.device)
    description = policy_config(config)
    if description is None:
        if device.type != "cpu":
            raise ConfigError("device: cuda trains diffusers policies (model.family sd3 / flux / qwen-image or "
                              "model.pretrained); the TinyDiT runs on the CPU: set device: cpu")
        return load_model(config.base_checkpoint)
    policy = policy_from_config(description)
    return policy.to(device) if device.type != "cpu" else policy
