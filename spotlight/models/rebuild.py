"""Rebuild a policy from its description: the half of a checkpoint or a broadcast that is not tensors.

A ``model.json`` (``Policy.describe()``) and the config a spot device receives both name the
architecture and its config; this module turns either into a policy whose trained tensors are then
loaded with ``load_broadcast_state``. For a LoRA policy the base weights come from the description
itself (a pretrained folder, or a tiny transformer drawn from ``init_seed``), never from the file.
Each kind's spec (`spotlight.models.spec`) says how it is built and described.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from spotlight.models.policy import Policy
from spotlight.models.spec import ModelConfig, config_from_description, spec_of
from spotlight.models.tinydit import TinyDiTConfig

__all__ = ["ModelConfig", "config_from_description", "describe_config", "policy_from_config",
           "policy_from_description"]


def policy_from_config(config: ModelConfig | Mapping[str, Any]) -> Policy:
    """A fresh policy of ``config`` (a policy's ``.config``; a plain mapping is a TinyDiT config).

    A TinyDiT comes with its own random initialisation, to be overwritten by ``load_broadcast_state``;
    a diffusers policy with its base (deterministic from the config, or its pipeline folder's weights)
    and zero-initialised LoRA B.
    """
    if not isinstance(config, ModelConfig):  # a plain mapping: what a TinyDiT's model.json holds
        config = TinyDiTConfig(**config)
    return spec_of(config).build(config)


def describe_config(config: ModelConfig) -> dict[str, Any]:
    """The ``architecture`` and ``config`` entries of a ``describe()`` mapping, from a policy's ``.config`` alone.

    What a process that builds the policy itself is sent: plain JSON, compared for equality to tell
    whether the architecture changed.
    """
    return spec_of(config).describe_config(config)


def policy_from_description(description: Mapping[str, Any]) -> Policy:
    """A fresh policy of the architecture and config in ``description`` (``Policy.describe()``)."""
    return policy_from_config(config_from_description(description))
