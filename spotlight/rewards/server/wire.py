"""The reward service's wire format: one JSON body each way, images as base64 uint8.

Images travel as uint8 (what any saved image is, and what the OCR model reads anyway): 4x smaller
than float32 and exact to 1/255 against the trainer's own scoring. A request may carry the prompts'
metadata (one JSON object per prompt, for rewards such as GenEval); a response carries a composite
reward's terms.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from spotlight.rewards.base import RewardOutput


class WireError(ValueError):
    """A request or response body that does not follow the wire format."""


def encode_request(images: torch.Tensor, prompts: Sequence[str],
                   metadata: Sequence[Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """Images (B, 3, H, W) or videos (B, F, 3, H, W) in [0, 1], their prompts and (optionally) metadata as a
    JSON-ready request body."""
    pixels = (images.detach().float().clamp(0, 1) * 255).round().to(torch.uint8).cpu().numpy()
    body = {"shape": list(pixels.shape), "pixels": base64.b64encode(pixels.tobytes()).decode("ascii"),
            "prompts": list(prompts)}
    if metadata is not None:
        body["metadata"] = [dict(record) for record in metadata]
    return body


def decode_metadata(body: dict[str, Any], batch: int) -> list[dict[str, Any]] | None:
    """The request's metadata (one object per prompt), None when it has none; WireError when malformed."""
    metadata = body.get("metadata")
    if metadata is None:
        return None
    if not isinstance(metadata, list) or len(metadata) != batch or not all(isinstance(m, dict) for m in metadata):
        raise WireError(f"reward request metadata must be a list of {batch} JSON objects, one per prompt")
    return metadata


def decode_request(body: dict[str, Any]) -> tuple[torch.Tensor, list[str]]:
    """The images float32 (B, 3, H, W) or videos (B, F, 3, H, W) in [0, 1] and prompts of a request body; WireError
    when malformed."""
    try:
        shape = body["shape"]
        if not isinstance(shape, list) or not all(type(size) is int and size > 0 for size in shape):
            raise ValueError(f"shape {str(shape)[:80]} must be a list of positive integers")
        prompts = body["prompts"]
        if not isinstance(prompts, list) or not all(isinstance(prompt, str) for prompt in prompts):
            raise TypeError("prompts must be a list of strings")
        pixels = np.frombuffer(base64.b64decode(body["pixels"], validate=True), dtype=np.uint8)
    except (KeyError, TypeError, ValueError) as error:
        raise WireError(f"malformed reward request ({type(error).__name__}: {' '.join(str(error).split())[:160]}); "
                        "send {'shape': [B, 3, H, W], 'pixels': base64 uint8, 'prompts': [...]}") from None
    # math.prod on Python ints: a numpy product of huge sizes wraps around and could match by accident
    if len(shape) not in (4, 5) or shape[-3] != 3 or math.prod(shape) != pixels.size or shape[0] != len(prompts):
        raise WireError(f"reward request shape {shape} does not match {pixels.size} pixels and {len(prompts)} "
                        "prompts; send images (B, 3, H, W) and B prompts")
    images = torch.from_numpy(pixels.reshape(shape).astype(np.float32) / 255.0)
    return images, prompts


def encode_output(out: RewardOutput) -> dict[str, Any]:
    """A RewardOutput as a JSON-ready response body."""
    body = {"rewards": out.rewards.tolist(), "strict": out.strict.tolist(), "valid": out.valid.tolist(),
            "errors": list(out.errors)}
    if out.terms:
        body["terms"] = {term: values.tolist() for term, values in out.terms.items()}
    return body


def decode_output(body: dict[str, Any], batch: int) -> RewardOutput:
    """The RewardOutput of a response body for a request of `batch` samples; WireError when it does not fit."""
    try:
        out = RewardOutput(torch.tensor(body["rewards"], dtype=torch.float32),
                           torch.tensor(body["strict"], dtype=torch.bool),
                           torch.tensor(body["valid"], dtype=torch.bool),
                           [str(error) for error in body.get("errors", [])],
                           {str(term): torch.tensor(values, dtype=torch.float32)
                            for term, values in body.get("terms", {}).items()})
    except (KeyError, TypeError, ValueError) as error:
        raise WireError(f"malformed reward response ({type(error).__name__}: {error})") from None
    if out.rewards.shape != (batch,):
        raise WireError(f"reward response has {out.rewards.shape[0]} rewards for {batch} samples")
    return out
