"""The type of the model the training loop trains, named once.

The loop, its backends and the rollout helpers are typed to ``LoopModel``; switching them to the
`spotlight.models.policy.Policy` protocol (diffusers transformers with LoRA) is this one line.
"""

from __future__ import annotations

from typing import TypeAlias

from spotlight.models.policy import Policy

__all__ = ["LoopModel"]

LoopModel: TypeAlias = Policy
