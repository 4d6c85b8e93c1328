"""The attention kernel of Spotlight's DiTs, kept apart so that it can be swapped.

A model calls ``attention_fn(q, k, v, key_padding_mask)`` and never knows whether it runs on one
device or as a Ulysses sequence-parallel group (``spotlight.models.ulysses``), which replaces this
function from outside: the model definition stays free of parallelism.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

AttentionFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor]


def sdpa_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_padding_mask: torch.Tensor | None
) -> torch.Tensor:
    """Single-device attention. q, k, v: (B, H, N, Dh); mask: (B, N) bool, True = attend; -> (B, H, N, Dh)."""
    attn_mask = None if key_padding_mask is None else key_padding_mask[:, None, None, :]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
