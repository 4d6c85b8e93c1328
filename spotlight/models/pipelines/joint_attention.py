"""The joint (text + image) attention of SD3, FLUX and Qwen-Image blocks, routed through a Spotlight kernel.

diffusers computes attention inside per-family processors; this one replaces them so that the
attention itself is an ``AttentionFn`` (``spotlight.models.attention``): plain SDPA on one device, or
``spotlight.models.ulysses.UlyssesAttention`` over a sequence-parallel group. The model definition
stays free of parallelism: the runtime swaps the kernel and, for token sharding, slices the inputs
around the blocks (``spotlight.models.pipelines.sequence_parallel``).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn

from spotlight.models.attention import AttentionFn
from spotlight.models.pipelines.family_config import Family


class JointAttentionProcessor:
    """A diffusers attention processor that sends the joint attention of SD3, FLUX and Qwen-Image
    blocks through a Spotlight ``AttentionFn`` (q, k, v: (B, H, N, Dh); key_padding_mask: (B, N)).

    It keeps each family's projections, QK-norms, rotary embeddings and token order (SD3 puts the
    image tokens first, FLUX and Qwen-Image the text tokens), so with ``sdpa_attention`` it computes
    what diffusers' own processor computes. Qwen-Image's text mask becomes the key padding mask.

    ``sequence_shards`` = P > 1: each block sees one rank's contiguous shard of the text and of the
    image tokens (Ulysses token sharding, FLUX and Qwen-Image only), and ``attention_fn`` attends over
    the group's tokens in rank order, [text_0; image_0; text_1; image_1; ...]. The text mask still
    arrives whole, so the key padding mask is assembled in that order.
    """

    def __init__(self, family: Family, attention_fn: AttentionFn, sequence_shards: int = 1) -> None:
        if sequence_shards > 1 and family == "sd3":
            raise ValueError("token sharding covers flux and qwen-image (text tokens first); sd3 puts its image "
                             "tokens first: use sequence_shards=1 (head sharding only) for sd3")
        self.family = family
        self.attention_fn = attention_fn
        self.sequence_shards = sequence_shards

    @staticmethod
    def _heads(projection: nn.Module, states: torch.Tensor, heads: int) -> torch.Tensor:
        out = projection(states)
        return out.unflatten(-1, (heads, out.shape[-1] // heads))  # (B, N, H, Dh)

    @staticmethod
    def _norm(norm: nn.Module | None, x: torch.Tensor) -> torch.Tensor:
        return x if norm is None else norm(x)

    def __call__(
        self,
        attn: nn.Module,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        image_rotary_emb: Any = None,
        encoder_hidden_states_mask: torch.Tensor | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Image-stream output (B, N_img, D), plus the text-stream output when a text stream is given."""
        if attention_mask is not None:
            raise ValueError("JointAttentionProcessor takes no attention_mask: Qwen-Image passes its text mask "
                             "as encoder_hidden_states_mask, SD3 and FLUX use none")
        heads = attn.heads
        query = self._norm(attn.norm_q, self._heads(attn.to_q, hidden_states, heads))
        key = self._norm(attn.norm_k, self._heads(attn.to_k, hidden_states, heads))
        value = self._heads(attn.to_v, hidden_states, heads)
        image_tokens, text_tokens = hidden_states.shape[1], 0
        if encoder_hidden_states is not None:
            text_tokens = encoder_hidden_states.shape[1]
            text_query = self._norm(getattr(attn, "norm_added_q", None),
                                    self._heads(attn.add_q_proj, encoder_hidden_states, heads))
            text_key = self._norm(getattr(attn, "norm_added_k", None),
                                  self._heads(attn.add_k_proj, encoder_hidden_states, heads))
            text_value = self._heads(attn.add_v_proj, encoder_hidden_states, heads)
            if self.family == "qwen-image" and image_rotary_emb is not None:
                from diffusers.models.transformers.transformer_qwenimage import apply_rotary_emb_qwen

                image_freqs, text_freqs = image_rotary_emb
                query, key = (apply_rotary_emb_qwen(t, image_freqs, use_real=False) for t in (query, key))
                text_query, text_key = (apply_rotary_emb_qwen(t, text_freqs, use_real=False)
                                        for t in (text_query, text_key))
            if self.family == "sd3":
                query, key, value = (torch.cat([i, t], dim=1) for i, t in
                                     ((query, text_query), (key, text_key), (value, text_value)))
            else:
                query, key, value = (torch.cat([t, i], dim=1) for i, t in
                                     ((query, text_query), (key, text_key), (value, text_value)))
        if self.family == "flux" and image_rotary_emb is not None:  # over the joint [text; image] ids
            from diffusers.models.embeddings import apply_rotary_emb

            query, key = (apply_rotary_emb(t, image_rotary_emb, sequence_dim=1) for t in (query, key))

        key_padding_mask = None
        if encoder_hidden_states_mask is not None and encoder_hidden_states is not None:
            key_padding_mask = self._key_padding_mask(encoder_hidden_states_mask, text_tokens, image_tokens)
        out = self.attention_fn(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), key_padding_mask)
        out = out.transpose(1, 2).flatten(2).to(query.dtype)  # (B, N, H * Dh)

        if encoder_hidden_states is None:
            if getattr(attn, "pre_only", False):  # FLUX single-stream block: its MLP projects the output
                return out
            return attn.to_out[1](attn.to_out[0](out))
        if self.family == "sd3":
            image_out, text_out = out[:, :image_tokens], out[:, image_tokens:]
        else:
            text_out, image_out = out[:, :text_tokens], out[:, text_tokens:]
        image_out = attn.to_out[0](image_out.contiguous())
        if len(attn.to_out) > 1:
            image_out = attn.to_out[1](image_out)
        if not getattr(attn, "context_pre_only", False):
            text_out = attn.to_add_out(text_out.contiguous())
        return image_out, text_out

    def _key_padding_mask(self, text_mask: torch.Tensor, text_tokens: int, image_tokens: int) -> torch.Tensor:
        """(B, P * (text_tokens + image_tokens)) bool, True = attend: the whole text mask (B, P * text_tokens)
        cut into the P ranks' shards, each followed by its (always real) image tokens."""
        shards, text_mask = self.sequence_shards, text_mask.to(torch.bool)
        if text_mask.shape[1] != shards * text_tokens:
            raise ValueError(f"the text mask covers {text_mask.shape[1]} tokens but {shards} shard(s) hold "
                             f"{shards} x {text_tokens}: pass the whole (B, L) mask to every rank")
        image_mask = torch.ones(text_mask.shape[0], image_tokens, dtype=torch.bool, device=text_mask.device)
        if self.family == "sd3":
            return torch.cat([image_mask, text_mask], dim=1)
        parts = []
        for shard in text_mask.split(text_tokens, dim=1):
            parts += [shard, image_mask]
        return torch.cat(parts, dim=1)
