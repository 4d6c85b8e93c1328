"""A pipeline folder's transformer counted from its config.json: FLOPs, parameters and LoRA sizes, no model built.

`spotlight.sim.planning.forward_flops.count_forward_flops` asks here first; where the family's walk does
not model the config (`NotAnalytic`) it builds the model on the meta device instead, the reference these
counts equal exactly (tests/sim/planning/test_analytic_counts.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from spotlight.sim.planning.analytic.mmdit import flux, qwen_image, sd3
from spotlight.sim.planning.analytic.trace import NotAnalytic, Trace
from spotlight.sim.planning.analytic.wan import wan

__all__ = ["TransformerCount", "WALKS", "count_transformer"]

WALKS: dict[str, Callable[[Trace, dict[str, Any], int, int], None]] = {
    "sd3": sd3, "flux": flux, "qwen-image": qwen_image, "wan": wan}


@dataclass(frozen=True)
class TransformerCount:
    """`forward_flops.ForwardCount`'s counted fields (module docstring there)."""

    flops: float
    train_flops: float
    parameters: int
    lora_parameters: int
    lora_inputs: tuple[int, int, int]
    lora_weights: int
    shapes: dict[str, tuple[int, ...]]


def count_transformer(family: str, config: dict[str, Any], image_tokens: int, text_tokens: int, batch: int,
                      lora: tuple[int, tuple[str, ...]] | None) -> TransformerCount:
    """The family's transformer of ``config`` over ``batch`` samples of ``image_tokens`` and ``text_tokens``.
    Raises NotAnalytic where the walk does not model the config or the LoRA targets.
    """
    from spotlight.models.pipelines.memory_estimate import lora_input_features

    walk = WALKS.get(family)
    if walk is None:
        raise NotAnalytic(f"family {family}")
    trace = Trace(batch=batch, lora=lora)
    walk(trace, config, image_tokens, text_tokens)
    trace.check_targets()
    shapes = trace.shapes
    base = {name.replace(".base_layer", ""): shape for name, shape in shapes.items() if ".lora_" not in name}
    return TransformerCount(
        flops=float(trace.forward), train_flops=float(trace.forward + trace.backward),
        parameters=trace.parameters, lora_parameters=trace.lora_parameters,
        lora_inputs=lora_input_features(base, lora[1]) if lora is not None else (0, 0, 0),
        lora_weights=sum(s[0] * s[1] for name, s in shapes.items() if name.endswith(".base_layer.weight")
                         and len(s) == 2),
        shapes=shapes)
