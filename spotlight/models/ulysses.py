"""Ulysses sequence-parallel attention: shard tokens across an SP group, attend over all of them.

A sequence-parallel (SP) group of P ranks splits a sample's N tokens contiguously: rank r holds
tokens [r·N/P, (r+1)·N/P). Everything in a DiT block except attention is per-token, so it runs on
the local shard untouched; only attention needs every token. Around it, two all-to-alls move data:

    q, k, v  (B, H, N/P, Dh)   split along tokens: each rank has all heads of its own tokens
        │ all-to-all #1: rank r sends head group j (H/P heads) of its tokens to rank j
        ▼
    q, k, v  (B, H/P, N, Dh)   split along heads: each rank has every token of its own heads
        │ local attention over the full sequence (any single-device kernel; the mask is the full one)
        ▼
    out      (B, H/P, N, Dh)
        │ all-to-all #2: rank r sends token shard j of its heads back to rank j
        ▼
    out      (B, H, N/P, Dh)   split along tokens again

Why Ulysses rather than ring attention: each all-to-all moves (P-1)/P of a rank's activations, so a
device sends and receives O(N·H·Dh/P) per layer: the per-device volume falls as P grows (and stays
constant when the sequence grows with P), and the attention itself is the unmodified single-device
kernel (exact softmax, masks, flash kernels).
Ring attention instead passes every K/V shard around the ring (O(N·H·Dh) per device regardless of P)
and needs an online-softmax merge of partial results. Ulysses' price is that P must divide the head
count (each rank owns whole heads), which is why the SP degrees a model allows are the divisors of
its heads (and of its token count); this module refuses the others with a message listing them.

Autograd: both collectives are ``torch.autograd.Function``s over the public ``dist`` API. With equal
splits an all-to-all is its own adjoint, so its backward is the same all-to-all applied to the
gradient. (``torch.distributed._functional_collectives.all_to_all_single_autograd`` also gives
exact gradients with gloo in torch 2.13, but it lives in a private module whose autograd entry
points are already being renamed, and its all-gather's backward *sums* gradients across ranks, which
is wrong for a loss every rank computes identically; see ``gather_sequence``.)
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from spotlight.models.attention import AttentionFn, sdpa_attention

__all__ = [
    "UlyssesAttention",
    "check_sp_degree",
    "gather_sequence",
    "shard_sequence",
    "ulysses_attention",
    "valid_sp_degrees",
]


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def valid_sp_degrees(num_heads: int, num_tokens: int | None = None) -> list[int]:
    """The SP degrees (ascending) that split both the heads and, if given, the tokens evenly.

    An elastic runtime picks its group sizes from this list when devices come and go.
    """
    degrees = _divisors(num_heads)
    if num_tokens is not None:
        degrees = [d for d in degrees if num_tokens % d == 0]
    return degrees


def check_sp_degree(sp_degree: int, *, num_heads: int | None = None, num_tokens: int | None = None) -> None:
    """Raise ``ValueError`` naming the allowed degrees if ``sp_degree`` cannot shard heads or tokens."""
    if sp_degree < 1:
        raise ValueError(f"sp_degree must be ≥ 1 (got {sp_degree})")
    if num_heads is not None and num_heads % sp_degree != 0:
        allowed = ", ".join(map(str, _divisors(num_heads)))
        raise ValueError(
            f"sp_degree {sp_degree} does not divide num_heads {num_heads}: "
            f"choose an SP degree among {allowed}"
        )
    if num_tokens is not None and num_tokens % sp_degree != 0:
        allowed = ", ".join(map(str, _divisors(num_tokens)))
        raise ValueError(
            f"sp_degree {sp_degree} does not divide the sequence length {num_tokens}: "
            f"choose an SP degree among {allowed} (or pad the sequence to a multiple of {sp_degree})"
        )


def _group_size(group: ProcessGroup | None) -> int:
    return 1 if group is None else dist.get_world_size(group)


class _AllToAll(torch.autograd.Function):
    """Equal-split all-to-all along dim 0; its backward is the same all-to-all on the gradient."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: ProcessGroup) -> torch.Tensor:  # type: ignore[override]
        ctx.group = group
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
        dist.all_to_all_single(out, x.contiguous(), group=group)
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        grad_in = torch.empty_like(grad_out, memory_format=torch.contiguous_format)
        dist.all_to_all_single(grad_in, grad_out.contiguous(), group=ctx.group)
        return grad_in, None


class _GatherSequence(torch.autograd.Function):
    """All-gather along ``dim``; the backward keeps this rank's slice of the (replicated) gradient."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: ProcessGroup, dim: int) -> torch.Tensor:  # type: ignore[override]
        world = dist.get_world_size(group)
        ctx.rank, ctx.length, ctx.dim = dist.get_rank(group), x.shape[dim], dim
        shards = [torch.empty_like(x, memory_format=torch.contiguous_format) for _ in range(world)]
        dist.all_gather(shards, x.contiguous(), group=group)
        return torch.cat(shards, dim=dim)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor) -> tuple[torch.Tensor, None, None]:  # type: ignore[override]
        return grad_out.narrow(ctx.dim, ctx.rank * ctx.length, ctx.length), None, None


def shard_sequence(x: torch.Tensor, rank: int, world: int, dim: int = 1) -> torch.Tensor:
    """This rank's contiguous token shard of ``x``: tokens [rank·N/world, (rank+1)·N/world) along ``dim``.

    ``x`` is e.g. (B, N, C) -> (B, N/world, C). Returns a view (no copy), so gradients flow back into
    the full tensor. ``rank`` and ``world`` are the rank and size *within the SP group*.
    """
    num_tokens = x.shape[dim]
    check_sp_degree(world, num_tokens=num_tokens)
    if not 0 <= rank < world:
        raise ValueError(
            f"rank {rank} is outside an SP group of {world} ranks: pass the rank within the group"
        )
    length = num_tokens // world
    return x.narrow(dim, rank * length, length)


def gather_sequence(x_local: torch.Tensor, group: ProcessGroup | None, dim: int = 1) -> torch.Tensor:
    """The full sequence from every rank's shard, concatenated in rank order along ``dim``.

    (B, N/P, C) -> (B, N, C) on every rank. Differentiable: the backward returns this rank's slice
    of the incoming gradient, not the sum over ranks, because after the gather every rank computes
    the same loss on the same full tensor; summing would count that replicated loss P times. With
    this choice, all-reducing (sum) parameter gradients over the SP group gives exactly the gradient
    of one device running the whole sequence. ``group`` None (or of size 1) returns ``x_local``.
    """
    if _group_size(group) == 1:
        return x_local
    return _GatherSequence.apply(x_local, group, dim)


def _heads_to_front(x: torch.Tensor, sp_degree: int) -> torch.Tensor:
    """(B, H, n, Dh) -> (P, B, H/P, n, Dh): the head groups become dim 0, the all-to-all's split dim."""
    batch, heads, tokens, head_dim = x.shape
    return x.view(batch, sp_degree, heads // sp_degree, tokens, head_dim).transpose(0, 1)


def ulysses_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_padding_mask: torch.Tensor | None,
    group: ProcessGroup | None,
    local_attention: AttentionFn = sdpa_attention,
) -> torch.Tensor:
    """Attention of this rank's token shard over the whole sequence of the SP ``group``.

    q, k, v: (B, H, N/P, Dh), this rank's contiguous token shard; key_padding_mask: (B, N) bool,
    True = a real token, the *full* mask (every rank passes the same one), or None. Returns
    (B, H, N/P, Dh), equal to rows [r·N/P, (r+1)·N/P) of single-device attention.

    q, k and v travel in one all-to-all (stacked) rather than three: each collective has a fixed
    latency, and the stack costs no extra copy since the all-to-all needs a contiguous buffer anyway.
    ``group`` None means no sequence parallelism (not the default world group); a group of size 1
    is the same: ``local_attention`` runs directly, with no communication.
    """
    if not (q.shape == k.shape == v.shape and q.dim() == 4):
        raise ValueError(
            f"q, k, v must share one (B, H, N_local, Dh) shape (got {tuple(q.shape)}, {tuple(k.shape)}, "
            f"{tuple(v.shape)}): split heads before calling attention"
        )
    batch, num_heads, local_tokens, head_dim = q.shape
    sp_degree = _group_size(group)
    check_sp_degree(sp_degree, num_heads=num_heads)
    if key_padding_mask is not None and tuple(key_padding_mask.shape) != (batch, local_tokens * sp_degree):
        raise ValueError(
            f"key_padding_mask has shape {tuple(key_padding_mask.shape)} but the SP group holds "
            f"(B, N) = ({batch}, {sp_degree} × {local_tokens}): pass the full (B, N_total) mask on every "
            f"rank and shard q, k, v with shard_sequence"
        )
    if sp_degree == 1:
        return local_attention(q, k, v, key_padding_mask)

    heads_per_rank, num_tokens = num_heads // sp_degree, local_tokens * sp_degree
    # (P, 3, B, H/P, N/P, Dh): dim 0 = destination rank (head group); one copy into the send buffer.
    send = torch.stack([_heads_to_front(t, sp_degree) for t in (q, k, v)], dim=1)
    recv = _AllToAll.apply(send, group)  # dim 0 now = source rank = token shard
    # -> (3, B, H/P, P, N/P, Dh) -> (3, B, H/P, N, Dh): token shards in rank order = the full sequence.
    qkv = recv.permute(1, 2, 3, 0, 4, 5).reshape(3, batch, heads_per_rank, num_tokens, head_dim)
    out = local_attention(qkv[0], qkv[1], qkv[2], key_padding_mask)  # (B, H/P, N, Dh)

    # (B, H/P, P, N/P, Dh) -> (P, B, H/P, N/P, Dh): dim 0 = destination rank (token shard).
    send = out.reshape(batch, heads_per_rank, sp_degree, local_tokens, head_dim).permute(2, 0, 1, 3, 4)
    recv = _AllToAll.apply(send, group)  # dim 0 now = source rank = head group
    return recv.transpose(0, 1).reshape(batch, num_heads, local_tokens, head_dim)


class UlyssesAttention:
    """An ``AttentionFn`` that runs Ulysses sequence parallelism over ``group``.

    Swap it in for the model's attention function, shard the token sequence with ``shard_sequence``
    and gather the output with ``gather_sequence``; the model itself does not change.
    ``local_attention`` is the single-device kernel run on the head shards (default: SDPA).
    """

    def __init__(self, group: ProcessGroup | None, local_attention: AttentionFn = sdpa_attention) -> None:
        self.group = group
        self.local_attention = local_attention

    @property
    def sp_degree(self) -> int:
        """Number of ranks the sequence is sharded over (1 when ``group`` is None)."""
        return _group_size(self.group)

    def __call__(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_padding_mask: torch.Tensor | None
    ) -> torch.Tensor:
        """(B, H, N/P, Dh) shards -> (B, H, N/P, Dh); see ``ulysses_attention``."""
        return ulysses_attention(q, k, v, key_padding_mask, self.group, self.local_attention)

    def __repr__(self) -> str:
        return f"UlyssesAttention(sp_degree={self.sp_degree})"
