"""The type of the model the training loop trains, named once.

The loop, its backends and the rollout helpers are typed to ``LoopModel``: the `Policy` protocol, so
a TinyDiT and a diffusers transformer with LoRA run the same loop. Narrowing or widening what the
loop accepts is this one line.
"""

from __future__ import annotations

from typing import TypeAlias

from spotlight.models.policy import Policy

__all__ = ["LoopModel"]

LoopModel: TypeAlias = Policy
