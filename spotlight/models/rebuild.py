"""Rebuild a policy from its description: the half of a checkpoint or a broadcast that is not tensors.

A ``model.json`` (``Policy.describe()``) and the config a spot device receives both name the
architecture and its config; this module turns either into a policy whose trained tensors are then
loaded with ``load_broadcast_state``. For a LoRA policy the base weights come from the description
itself (a pretrained folder, or a tiny transformer drawn from ``init_seed``), never from the file.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from spotlight.models.pipelines.adapter import ARCHITECTURE as DIFFUSERS_ARCHITECTURE
from spotlight.models.pipelines.adapter import DiffusersPolicy
from spotlight.models.pipelines.family_config import DiffusersPolicyConfig
from spotlight.models.pipelines.policy import PipelinePolicy
from spotlight.models.policy import Policy
from spotlight.models.tinydit import ARCHITECTURE as TINYDIT_ARCHITECTURE
from spotlight.models.tinydit import TinyDiT, TinyDiTConfig

ModelConfig = TinyDiTConfig | DiffusersPolicyConfig


def policy_from_config(config: ModelConfig | Mapping[str, Any]) -> Policy:
    """A fresh policy of ``config`` (a policy's ``.config``; a plain mapping is a TinyDiT config).

    A TinyDiT comes with its own random initialisation, to be overwritten by ``load_broadcast_state``;
    a diffusers policy with its base (deterministic from the config, or its pipeline folder's weights)
    and zero-initialised LoRA B.
    """
    if isinstance(config, DiffusersPolicyConfig):
        return PipelinePolicy.from_config(config) if config.pipeline else DiffusersPolicy.from_config(config)
    if isinstance(config, TinyDiTConfig):
        return TinyDiT(config)
    return TinyDiT(TinyDiTConfig(**config))


def config_from_description(description: Mapping[str, Any]) -> ModelConfig:
    """The config recorded in a ``describe()`` mapping; ValueError naming the architectures otherwise."""
    architecture = description.get("architecture", TINYDIT_ARCHITECTURE)
    if architecture == TINYDIT_ARCHITECTURE:
        return TinyDiTConfig(**description["config"])
    if architecture == DIFFUSERS_ARCHITECTURE:
        return DiffusersPolicyConfig.model_validate(description["config"])
    raise ValueError(f"unknown architecture {architecture!r}: expected {TINYDIT_ARCHITECTURE!r} or "
                     f"{DIFFUSERS_ARCHITECTURE!r}")


def describe_config(config: ModelConfig) -> dict[str, Any]:
    """The ``architecture`` and ``config`` entries of a ``describe()`` mapping, from a policy's ``.config`` alone.

    What a process that builds the policy itself is sent: plain JSON, compared for equality to tell
    whether the architecture changed.
    """
    if isinstance(config, DiffusersPolicyConfig):
        return {"architecture": DIFFUSERS_ARCHITECTURE, "config": config.model_dump(mode="json")}
    return {"architecture": TINYDIT_ARCHITECTURE, "config": config.to_dict()}


def policy_from_description(description: Mapping[str, Any]) -> Policy:
    """A fresh policy of the architecture and config in ``description`` (``Policy.describe()``)."""
    return policy_from_config(config_from_description(description))
