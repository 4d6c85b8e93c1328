"""Wan2.1 text-to-video's ``WanTransformer3DModel`` walked from its config.json numbers (trace.py says how).

A 3D patch convolution turns the video latents into ``image`` tokens (frames x patches); each block runs
self-attention over them (attn1), cross-attention from them to the ``text`` tokens (attn2) and an MLP of
``ffn_dim``, modulated by the timestep projection plus the block's own ``scale_shift_table`` (a trained
parameter under full fine-tuning, so the modulation needs a gradient then). Image-to-video configs
(``image_dim``, ``added_kv_proj_dim``) are not modelled: NotAnalytic, the meta-device count takes over.
"""

from __future__ import annotations

import math
from typing import Any

from spotlight.sim.planning.analytic.mmdit import _ff, _known, _two_layers, timestep_embedding
from spotlight.sim.planning.analytic.trace import NotAnalytic, Trace

__all__ = ["wan"]

WAN_KEYS = {"patch_size", "num_attention_heads", "attention_head_dim", "in_channels", "out_channels", "text_dim",
            "freq_dim", "ffn_dim", "num_layers", "cross_attn_norm", "qk_norm", "eps", "image_dim",
            "added_kv_proj_dim", "rope_max_seq_len", "pos_embed_seq_len"}


def _attention(trace: Trace, name: str, dim: int, heads: int, queries: int, keys: int, x: bool, context: bool) -> bool:
    b = trace.batch
    q = trace.linear(f"{name}.to_q", dim, dim, b * queries, x)
    k, v = (trace.linear(f"{name}.to_{p}", dim, dim, b * keys, context) for p in "kv")
    trace.param(f"{name}.norm_q.weight", dim)
    trace.param(f"{name}.norm_k.weight", dim)
    out = trace.attention(heads, queries, keys, dim // heads, q, k, v)
    return trace.linear(f"{name}.to_out.0", dim, dim, b * queries, out)


def wan(trace: Trace, config: dict[str, Any], image: int, text: int) -> None:
    """``WanTransformer3DModel`` (text-to-video) over ``image`` video tokens and ``text`` UMT5 tokens per sample."""
    _known(config, WAN_KEYS, "WanTransformer3DModel")
    for key in ("image_dim", "added_kv_proj_dim", "pos_embed_seq_len"):
        if config.get(key) is not None:
            raise NotAnalytic(f"WanTransformer3DModel {key}")
    if config.get("qk_norm", "rms_norm_across_heads") != "rms_norm_across_heads":
        raise NotAnalytic(f"qk_norm {config.get('qk_norm')!r}")
    heads, head_dim = int(config.get("num_attention_heads", 40)), int(config.get("attention_head_dim", 128))
    dim, b = heads * head_dim, trace.batch
    patch = tuple(int(p) for p in config.get("patch_size") or (1, 2, 2))
    channels_in = int(config.get("in_channels", 16))
    channels_out = int(config.get("out_channels") or channels_in)
    x = trace.conv("patch_embedding", channels_in, dim, patch, image, False)
    t = timestep_embedding(trace, "condition_embedder.time_embedder", dim, int(config.get("freq_dim", 256)))
    tp = trace.linear("condition_embedder.time_proj", dim, 6 * dim, b, t)
    c = _two_layers(trace, "condition_embedder.text_embedder", int(config.get("text_dim", 4096)), dim, dim, b * text,
                    False)
    for i in range(int(config.get("num_layers", 40))):
        name = f"blocks.{i}"
        m = trace.param(f"{name}.scale_shift_table", 1, 6, dim) or tp
        x = _attention(trace, f"{name}.attn1", dim, heads, image, image, x or m, x or m) or x or m
        if config.get("cross_attn_norm", True):
            trace.param(f"{name}.norm2.weight", dim)
            x = trace.param(f"{name}.norm2.bias", dim) or x
        x = _attention(trace, f"{name}.attn2", dim, heads, image, text, x, c) or x
        x = _ff(trace, f"{name}.ffn", dim, b * image, x or m, inner=int(config.get("ffn_dim", 13824))) or x or m
    out = trace.param("scale_shift_table", 1, 2, dim) or t
    trace.linear("proj_out", dim, channels_out * math.prod(patch), b * image, x or out)
