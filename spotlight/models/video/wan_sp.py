"""Ulysses sequence parallelism inside Wan2.1's ``WanTransformer3DModel``: its video tokens sharded over a group.

Wan differs from the joint-attention families (`spotlight.models.pipelines.sequence_parallel`) in where
its text goes: each block runs *self*-attention over the video tokens alone (with a 3D rotary table over
frame, row and column), then *cross*-attention from the video tokens to the UMT5 text tokens. So only
the video tokens are sharded:

    forward(...)                                hooks of `wan_sequence_parallel` on rank r of P
      patchify video (B, N, D), embed text      (whole, on every rank: per-token and cheap)
      rope (cos, sin) (1, N, 1, d)              -> rows of rank r's tokens only
      blocks[0] input (B, N, D)                 -> tokens [r·N/P, (r+1)·N/P)
      every block's attn1 (self-attention)      -> UlyssesAttention over the group (heads sharded)
      every block's attn2 (cross-attention)     unchanged: rank r's queries over the whole text,
                                                   a per-token operation that needs no collective
      proj_out output (B, N/P, C·p)             -> gathered to (B, N, C·p) on every rank

The text length therefore need not divide by the degree; the video token count (latent frames x
patches per frame) and the heads must. Every rank returns the whole velocity; the gather's backward
keeps this rank's slice, so summing parameter gradients over the group gives the one-device gradient.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed import ProcessGroup

from spotlight.models.attention import AttentionFn
from spotlight.models.ulysses import UlyssesAttention, check_sp_degree, gather_sequence, shard_sequence

__all__ = ["WanSelfAttentionProcessor", "check_wan_tokens", "wan_sequence_parallel", "wan_video_tokens"]


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Wan's rotary embedding of (B, N, H, Dh) with tables (1, N, 1, Dh), pairs interleaved as diffusers applies it."""
    x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
    cos, sin = cos[..., 0::2], sin[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = x1 * cos - x2 * sin
    out[..., 1::2] = x1 * sin + x2 * cos
    return out.type_as(x)


class WanSelfAttentionProcessor:
    """A processor for a Wan block's ``attn1`` that runs the attention itself through an ``AttentionFn``.

    It keeps Wan's projections, its QK-norm across heads and its rotary embedding, so with
    ``sdpa_attention`` it computes what ``WanAttnProcessor`` computes; with ``UlyssesAttention`` the
    block sees one rank's token shard and attends over the group's tokens. Cross-attention and
    Wan2.1 I2V's added image keys are refused: they keep diffusers' own processor.
    """

    def __init__(self, attention_fn: AttentionFn) -> None:
        self.attention_fn = attention_fn

    def __call__(self, attn: nn.Module, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor | None = None,
                 attention_mask: torch.Tensor | None = None,
                 rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        if encoder_hidden_states is not None or attention_mask is not None or attn.add_k_proj is not None:
            raise ValueError("WanSelfAttentionProcessor serves a block's attn1 (self-attention, no mask): leave attn2 "
                             "and I2V's image keys to diffusers' WanAttnProcessor")
        if getattr(attn, "fused_projections", False):
            query, key, value = attn.to_qkv(hidden_states).chunk(3, dim=-1)
        else:
            query, key, value = attn.to_q(hidden_states), attn.to_k(hidden_states), attn.to_v(hidden_states)
        query, key = attn.norm_q(query), attn.norm_k(key)
        query, key, value = (t.unflatten(2, (attn.heads, -1)) for t in (query, key, value))  # (B, N, H, Dh)
        if rotary_emb is not None:
            query, key = (_rotate(t, *rotary_emb) for t in (query, key))
        out = self.attention_fn(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), None)
        out = out.transpose(1, 2).flatten(2, 3).type_as(query)  # (B, N, H * Dh)
        return attn.to_out[1](attn.to_out[0](out))


def wan_video_tokens(latents_shape: torch.Size | tuple[int, ...], patch_size: tuple[int, int, int]) -> int:
    """The transformer's video tokens of latents (B, C, f, h, w): patches over frames, rows and columns."""
    frames, height, width = latents_shape[-3:]
    return (frames // patch_size[0]) * (height // patch_size[1]) * (width // patch_size[2])


def check_wan_tokens(sp_degree: int, video_tokens: int, shape: str) -> None:
    """ValueError in one line when ``sp_degree`` does not divide the video tokens (``shape`` says whose)."""
    if video_tokens % sp_degree:
        fits = [d for d in range(1, video_tokens + 1) if video_tokens % d == 0 and d <= 16]
        raise ValueError(f"sp_degree {sp_degree} does not divide the {video_tokens} video tokens of {shape}: choose "
                         f"a degree among {', '.join(map(str, fits))}, or frames / resolution whose latent frames x "
                         f"patches per frame divide by {sp_degree}")


@contextlib.contextmanager
def wan_sequence_parallel(transformer: nn.Module, group: ProcessGroup | None) -> Iterator[None]:
    """Inside the block, ``transformer``'s calls run with their video tokens sharded over ``group`` (module docstring).

    Every rank must make the same calls with the same inputs; each gets the whole output. On exit
    the attention processors are restored and the hooks removed. Wan2.2's two experts
    (`spotlight.models.video.experts`) are hooked each: every rank routes the same rows to the same expert.
    """
    experts = getattr(transformer, "experts", None)
    if isinstance(experts, nn.ModuleList):
        with contextlib.ExitStack() as stack:
            for expert in experts:
                stack.enter_context(_one_transformer(expert, group))
            yield
        return
    with _one_transformer(transformer, group):
        yield


@contextlib.contextmanager
def _one_transformer(transformer: nn.Module, group: ProcessGroup | None) -> Iterator[None]:
    rank = 0 if group is None else dist.get_rank(group)
    world = 1 if group is None else dist.get_world_size(group)
    check_sp_degree(world, num_heads=int(transformer.config.num_attention_heads))
    patch = tuple(int(p) for p in transformer.config.patch_size)

    def check_tokens(_module: Any, args: tuple, kwargs: dict[str, Any]) -> None:
        latents = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
        check_wan_tokens(world, wan_video_tokens(latents.shape, patch), f"latents {tuple(latents.shape[1:])}")

    def shard_rotary(_module: Any, _args: tuple, tables: tuple[torch.Tensor, torch.Tensor]) -> tuple:
        return tuple(shard_sequence(table, rank, world, dim=1) for table in tables)  # (1, N, 1, d) each

    def shard_video(_module: Any, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
        if "hidden_states" in kwargs:
            return args, {**kwargs, "hidden_states": shard_sequence(kwargs["hidden_states"], rank, world, dim=1)}
        return (shard_sequence(args[0], rank, world, dim=1), *args[1:]), kwargs

    def gather_video(_module: Any, _args: tuple, output: torch.Tensor) -> torch.Tensor:
        return gather_sequence(output, group, dim=1)

    self_attention = [block.attn1 for block in transformer.blocks]
    previous = [attn.processor for attn in self_attention]
    handles = [
        transformer.register_forward_pre_hook(check_tokens, with_kwargs=True),
        transformer.rope.register_forward_hook(shard_rotary),
        transformer.blocks[0].register_forward_pre_hook(shard_video, with_kwargs=True),
        transformer.proj_out.register_forward_hook(gather_video),
    ]
    processor = WanSelfAttentionProcessor(UlyssesAttention(group))
    for attn in self_attention:
        attn.set_processor(processor)
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
        for attn, old in zip(self_attention, previous, strict=True):
            attn.set_processor(old)
