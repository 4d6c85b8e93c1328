"""Sampling with the LoRA folded into the base weights: one Linear per layer instead of the base plus two adapters.

peft runs a LoRA layer as ``W x + s B (A x)`` with A and B in float32 (the dtype they train in), so each
sampling forward of a bfloat16 model casts every targeted activation to float32 and back and launches
three matmuls where one would do. A rollout uses fixed weights for every forward, so `merged_lora` folds
``W + s B A`` into the base weights once (computed in float32, rounded once to the weights' dtype), runs
the block with the adapters disabled, and puts the original base tensors back afterwards.

The originals are restored by pointer, not by subtracting ``s B A`` again: in bfloat16 an unmerge leaves
rounding behind, which would accumulate in the frozen base over hundreds of iterations. The price is
memory: the merged copies of the targeted weights exist while the block runs.

What changes: the merged forward computes ``(W + s B A) x`` rounded to the weights' dtype instead of
``W x + s B (A x)``; in float32 the two agree to rounding (tests/models/pipelines/test_lora_merge.py
bounds it). Flow-GRPO's recorded log-probs come from the very forwards that drew each step, so they stay
consistent with what was sampled; the update recomputes them with the adapter math, and their gap is
that same rounding (a ratio within ~1e-3 of 1 in bfloat16 before the policy moves, ten times Flow-GRPO's
clip range of 1e-4). So when a rollout was sampled merged (`samples_merged`), `spotlight.rl.grpo` takes
the old log-probs from the sampling policy's own training forward instead of the recorded ones.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from spotlight.models.pipelines.adapter import ADAPTER_NAME, DiffusersPolicy

__all__ = ["merged_lora", "samples_merged", "sampling_weights"]


def _lora_layers(policy: DiffusersPolicy) -> list[Any]:
    from peft.tuners.lora import LoraLayer

    return [module for module in policy.transformer.modules()
            if isinstance(module, LoraLayer) and ADAPTER_NAME in module.lora_A]


@contextlib.contextmanager
def merged_lora(policy: DiffusersPolicy) -> Iterator[None]:
    """Inside the block ``policy``'s forward runs its base weights with the LoRA folded in (module docstring).

    No autograd: the merged tensors are not parameters anything trains. Refuses DoRA layers (their
    magnitude vector does not fold into a plain sum).
    """
    layers = _lora_layers(policy)
    swapped: list[tuple[torch.nn.Parameter, torch.Tensor]] = []
    try:
        with torch.no_grad():
            for layer in layers:
                if getattr(layer, "use_dora", {}).get(ADAPTER_NAME, False):
                    raise ValueError("merged sampling does not fold DoRA adapters: set model.merge_lora false")
                weight = layer.get_base_layer().weight
                down, up = layer.lora_A[ADAPTER_NAME].weight, layer.lora_B[ADAPTER_NAME].weight
                delta = (up.float() @ down.float()) * layer.scaling[ADAPTER_NAME]
                merged = (weight.float() + delta).to(weight.dtype)  # A and B live on the weight's device
                swapped.append((weight, weight.data))
                weight.data = merged
        with policy.adapter_disabled():
            yield
    finally:
        for weight, original in swapped:
            weight.data = original


def _merged_sampling(model: Any) -> tuple[DiffusersPolicy, Any] | None:
    """(the LoRA policy, its frozen `LoraShadow` version or None) when a rollout of ``model`` samples with the
    LoRA folded in (``merge_lora``; None: on CUDA, where the fused forward is the fast one); else None."""
    from spotlight.models.shadow import LoraShadow

    shadow = model if isinstance(model, LoraShadow) else None
    policy = model.policy if shadow is not None else model
    if not isinstance(policy, DiffusersPolicy) or policy.config.finetune != "lora":
        return None
    if shadow is not None and shadow.lora is None:  # the base itself: nothing to fold
        return None
    wanted = policy.config.merge_lora
    if wanted is None:
        wanted = next(policy.transformer.parameters()).device.type == "cuda"
    return (policy, shadow) if wanted else None


def samples_merged(model: Any) -> bool:
    """Whether ``model``'s rollouts sample with the LoRA folded in (`sampling_weights` merges), so that their
    recorded log-probs carry the merge's rounding (Flow-GRPO re-scores them: `spotlight.rl.grpo`)."""
    return _merged_sampling(getattr(model, "module", model)) is not None


def sampling_weights(model: Any) -> contextlib.AbstractContextManager[Any]:
    """What a rollout samples under: `merged_lora` for a LoRA policy (or its frozen `LoraShadow` version) when
    ``merge_lora`` asks for it (None: on CUDA, where the fused forward is the fast one), else nothing."""
    merging = _merged_sampling(model)
    if merging is None:
        return contextlib.nullcontext()
    policy, shadow = merging
    if shadow is None:
        return merged_lora(policy)
    stack = contextlib.ExitStack()
    stack.enter_context(shadow.swapped_in())
    stack.enter_context(merged_lora(policy))
    return stack
