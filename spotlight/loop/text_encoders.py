"""Where a training run keeps a pipeline's text encoders: chosen once at start, so none moves inside the loop.

The text encoders (T5-XXL + two CLIPs ~10 GB, Qwen2.5-VL-7B ~17 GB in bfloat16) used to come to the GPU
and go back whenever an iteration brought a prompt not yet cached: with the OCR recipe's ~800 training
prompts at 16 per iteration, most of the first hundred iterations moved them both ways. ``model.text_encoders``
picks one of two placements instead (`spotlight.models.pipelines.prompts`):

- ``resident``: the encoders on the device for the whole run; each iteration's new prompts are encoded
  there in one batched call. Costs their memory throughout, saves nothing at start.
- ``precompute``: every training and validation prompt (and the negative prompt) encoded before the
  first iteration, in batches, with the encoders on the device once; then they leave it for good.
  Costs the start-up encoding (all prompts, once) and frees their memory for the update.
- ``auto`` (the default): ``resident`` when the start-up memory estimate with the encoders held
  throughout fits 90% of the GPU (`run_memory_estimate`: its parts, the encoders, and the largest other
  phase), else ``precompute``; on the CPU ``resident`` (they are on the CPU already: nothing crosses).

The choice is one line at start (`TextEncoderPlan.line`), printed with the memory estimate and logged.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from spotlight.models.pipelines.memory_estimate import GIB, cuda_memory_bytes, run_memory_estimate

__all__ = ["TEXT_ENCODER_HEADROOM", "TextEncoderPlan", "TextEncoders", "place_text_encoders", "plan_text_encoders",
           "resident_bytes"]

logger = logging.getLogger(__name__)

TextEncoders = Literal["auto", "resident", "precompute"]
TEXT_ENCODER_HEADROOM = 0.9  # the share of the GPU a resident placement may fill (as the micro-batch choice)


@dataclass(frozen=True)
class TextEncoderPlan:
    """The placement a run uses (``resident`` or ``precompute``) and the one line that says why."""

    placement: Literal["resident", "precompute"]
    line: str


def resident_bytes(estimate: Any) -> int:
    """The estimate's peak with the text encoders held throughout: its parts, the encoders, the largest other
    phase (never below the estimate itself, whose other peaks still apply)."""
    phases = dict(estimate.phases)
    encoders = phases.pop("text encoders", 0)
    return max(int(estimate.total), sum(estimate.parts.values()) + encoders + max(phases.values(), default=0))


def plan_text_encoders(config: Any, device_bytes: int | None = None) -> TextEncoderPlan | None:
    """The run's text-encoder placement (module docstring); None for a model without pipeline text encoders.

    ``device_bytes``: the GPU's memory (None: read from CUDA when the run is on it).
    """
    if config.model.pretrained is None:
        return None
    chosen: TextEncoders = config.model.text_encoders
    on_cpu = config.device == "cpu"
    if chosen != "auto":
        reason = "model.text_encoders " + chosen
    elif on_cpu:
        chosen, reason = "resident", "auto: a CPU run, nothing crosses to a device"
    else:
        estimate = run_memory_estimate(config)
        device_bytes = device_bytes if device_bytes is not None else cuda_memory_bytes(config.device)
        if estimate is None or device_bytes is None:
            chosen, reason = "precompute", "auto: no memory estimate to keep them by"
        else:
            needed = resident_bytes(estimate)
            fits = needed <= TEXT_ENCODER_HEADROOM * device_bytes
            chosen = "resident" if fits else "precompute"
            reason = (f"auto: the estimate with them held, {needed / GIB:.1f} GiB, "
                      f"{'fits' if fits else 'exceeds'} {TEXT_ENCODER_HEADROOM:.0%} of the GPU's "
                      f"{device_bytes / GIB:.1f} GiB")
    if chosen == "resident":
        where = "on the CPU" if on_cpu else f"on {config.device}"
        line = (f"text encoders: resident {where} for the whole run, each iteration's new prompts encoded there "
                f"in one batch ({reason})")
    else:
        line = ("text encoders: precompute, every training and validation prompt encoded in batches before the "
                f"first iteration, then the encoders leave the device ({reason})")
    return TextEncoderPlan(placement=chosen, line=line)


def place_text_encoders(model: Any, config: Any, prompts: Sequence[str]) -> TextEncoderPlan | None:
    """Place ``model``'s text encoders as the run's plan says (logged in its one line), ``prompts`` being every
    prompt the run will see (training and validation); None, doing nothing, for a policy without them.

    Call it once at start, before the loop: after it no encoder weight moves between host and device.
    """
    plan = plan_text_encoders(config)
    place = getattr(model, "place_text_encoders", None)
    if plan is None or place is None:
        return None
    logger.info(plan.line)
    place(plan.placement, prompts)
    return plan
