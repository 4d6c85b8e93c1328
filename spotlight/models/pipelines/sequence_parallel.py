"""Ulysses sequence parallelism inside a diffusers transformer (FLUX, Qwen-Image, Wan): the token-sharding half.

TinyDiT exposes ``embed`` / ``run_blocks`` / ``unpatchify``, so `sp_denoise` shards its sequence
between them. A diffusers ``forward`` is one function that embeds, computes the rotary tables for
the whole sequence, runs the blocks and projects out, so the sharding is applied around its parts
with forward hooks, from outside the model (the idea of diffusers' ``_cp_plan``, over Spotlight's
gloo-capable `ulysses` collectives, since diffusers' own context parallelism needs an accelerator):

    forward(...)                               hooks of `sequence_parallel` on rank r of P
      embed text (B, L, D), image (B, N, D)    (whole, on every rank: per-token and cheap)
      rotary tables                            -> rows of rank r's tokens only
      transformer_blocks[0] inputs             -> text[:, r·L/P : (r+1)·L/P], image[:, r·N/P : (r+1)·N/P]
      every block's joint attention            -> UlyssesAttention over the group, tokens in the order
                                                  [text_0; image_0; text_1; image_1; ...], with the
                                                  key padding mask assembled in that order
      proj_out output (B, N/P, C)              -> gathered to (B, N, C) on every rank

Rotary tables: FLUX has one table over the joint [text; image] ids, so rank r's rows are its text
rows followed by its image rows (the order of its local sequence, which FLUX's single-stream blocks
concatenate as [text; image]); Qwen-Image has an image table and a text table, each cut like its stream.

Every rank returns the whole velocity. Gradients: the gather's backward keeps this rank's slice,
so summing parameter gradients over the group (an all-reduce) gives the one-device gradient.
SD3 is left out: it puts its image tokens first and has no rotary table; it runs with head sharding only.
Wan (text-to-video) attends to its text by cross-attention, so only its video tokens are sharded
(`spotlight.models.video.wan_sp`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from spotlight.models.pipelines.adapter import DiffusersPolicy
from spotlight.models.ulysses import UlyssesAttention, check_sp_degree, gather_sequence, shard_sequence
from spotlight.models.video.wan_sp import wan_sequence_parallel

__all__ = ["TOKEN_SHARDED_FAMILIES", "sequence_parallel"]

TOKEN_SHARDED_FAMILIES = ("flux", "qwen-image", "wan")


def _rank_rows(table: torch.Tensor, rank: int, world: int, text_tokens: int) -> torch.Tensor:
    """Rank ``rank``'s rows of a joint [text; image] table (L + N, ...): its text rows, then its image rows."""
    text, image = table[:text_tokens], table[text_tokens:]
    return torch.cat([shard_sequence(text, rank, world, dim=0), shard_sequence(image, rank, world, dim=0)])


@contextlib.contextmanager
def sequence_parallel(policy: DiffusersPolicy, group: ProcessGroup | None) -> Iterator[None]:
    """Inside the block, ``policy(x, sigma, cond)`` runs token- and head-sharded over ``group`` (None: one rank).

    Every rank of the group must make the same calls with the same inputs; each gets the whole
    velocity. The text and the image token counts must both divide by the group's size (Wan: its video
    tokens), and so must the attention heads: a ValueError names the degrees that fit. On exit the
    policy's previous attention routing is restored and the hooks removed.
    """
    rank = 0 if group is None else dist.get_rank(group)
    world = 1 if group is None else dist.get_world_size(group)
    transformer = policy.transformer
    if policy.family not in TOKEN_SHARDED_FAMILIES:
        raise ValueError(f"token sharding covers {', '.join(TOKEN_SHARDED_FAMILIES)}, not {policy.family}: "
                         "route its attention through UlyssesAttention alone (head sharding) or use sp_degree 1")
    if policy.family == "wan":  # self-attention over the video, cross-attention to the text: its own hooks
        with wan_sequence_parallel(transformer, group):
            yield
        return
    check_sp_degree(world, num_heads=int(transformer.config.num_attention_heads))
    text_tokens = 0

    def check_lengths(_module: Any, args: tuple, kwargs: dict[str, Any]) -> None:
        nonlocal text_tokens
        text_tokens = kwargs["encoder_hidden_states"].shape[1]
        image_tokens = kwargs["hidden_states"].shape[1]
        for name, count in (("prompt tokens", text_tokens), ("image tokens", image_tokens)):
            if count % world:
                raise ValueError(f"sp_degree {world} does not divide the {count} {name}: choose a degree that "
                                 f"divides both {text_tokens} and {image_tokens} (or pad the prompt)")

    def shard_rotary(_module: Any, _args: tuple, tables: tuple[torch.Tensor, torch.Tensor]) -> tuple:
        if policy.family == "qwen-image":  # (image table (N, d), text table (L, d))
            image_table, text_table = tables
            return shard_sequence(image_table, rank, world, dim=0), shard_sequence(text_table, rank, world, dim=0)
        return tuple(_rank_rows(table, rank, world, text_tokens) for table in tables)  # FLUX (cos, sin)

    def shard_streams(_module: Any, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
        kwargs = dict(kwargs)
        for name in ("hidden_states", "encoder_hidden_states"):
            kwargs[name] = shard_sequence(kwargs[name], rank, world, dim=1)
        return args, kwargs

    def gather_image(_module: Any, _args: tuple, output: torch.Tensor) -> torch.Tensor:
        return gather_sequence(output, group, dim=1)

    previous = policy.attention_fn
    handles = [
        transformer.register_forward_pre_hook(check_lengths, with_kwargs=True),
        transformer.pos_embed.register_forward_hook(shard_rotary),
        transformer.transformer_blocks[0].register_forward_pre_hook(shard_streams, with_kwargs=True),
        transformer.proj_out.register_forward_hook(gather_image),
    ]
    policy.route_attention(UlyssesAttention(group), sequence_shards=world)
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
        policy.route_attention(previous)
