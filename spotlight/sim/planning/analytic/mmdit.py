"""SD3 / SD3.5, FLUX.1 (and Kontext) and Qwen-Image transformers walked from their config.json numbers.

Each function follows its diffusers class's forward (``SD3Transformer2DModel``, ``FluxTransformer2DModel``,
``QwenImageTransformer2DModel``) block by block: the Linears each stream passes through, with the rows
they see (``batch x image tokens``, ``batch x text tokens``, or ``batch`` for the adaLN modulations read
from the timestep embedding), and one joint attention per block over image and text tokens together. The
``g`` flags say whether a stream needs a gradient (`spotlight.sim.planning.analytic.trace`): the timestep
embedding needs one only when its weights are trained, a stream after its first adapter always does.
A config key the walk does not model (an IP-adapter, Qwen-Image-Edit's ``zero_cond_t``) raises NotAnalytic,
and the meta-device count takes over.
"""

from __future__ import annotations

from typing import Any

from spotlight.sim.planning.analytic.trace import NotAnalytic, Trace

__all__ = ["flux", "qwen_image", "sd3", "timestep_embedding"]


def timestep_embedding(trace: Trace, name: str, dim: int, channels: int = 256) -> bool:
    """diffusers' ``TimestepEmbedding``: Linear(channels, dim), SiLU, Linear(dim, dim) over ``batch`` rows."""
    hidden = trace.linear(f"{name}.linear_1", channels, dim, trace.batch, False)
    return trace.linear(f"{name}.linear_2", dim, dim, trace.batch, hidden)


def _two_layers(trace: Trace, name: str, fan_in: int, hidden: int, fan_out: int, rows: int, g: bool,
                first: str = "linear_1", second: str = "linear_2", live: bool = True) -> bool:
    """Linear, activation, Linear (``PixArtAlphaTextProjection``, a ``FeedForward``'s ``net.0.proj`` and ``net.2``)."""
    g = trace.linear(f"{name}.{first}", fan_in, hidden, rows, g, live=live)
    return trace.linear(f"{name}.{second}", hidden, fan_out, rows, g, live=live)


def _ff(trace: Trace, name: str, dim: int, rows: int, g: bool, inner: int | None = None, live: bool = True) -> bool:
    """diffusers' ``FeedForward(dim, dim_out=dim, activation_fn="gelu-approximate")`` (4 x dim inside by default)."""
    return _two_layers(trace, name, dim, inner or 4 * dim, dim, rows, g, "net.0.proj", "net.2", live)


def _qk_norms(trace: Trace, name: str, head_dim: int, qk_norm: Any, added: bool) -> None:
    if qk_norm is None:
        return
    if qk_norm != "rms_norm":
        raise NotAnalytic(f"qk_norm {qk_norm!r}")
    for norm in ("norm_q", "norm_k", *(("norm_added_q", "norm_added_k") if added else ())):
        trace.param(f"{name}.{norm}.weight", head_dim)


def _joint_attention(trace: Trace, name: str, dim: int, heads: int, image: int, text: int, x: bool, c: bool,
                     context_out: bool = True, live_context: bool = True) -> tuple[bool, bool]:
    """Image projections to_q/k/v, text projections add_q/k/v_proj, one attention over both, to_out.0 for the
    image tokens and (``context_out``) to_add_out for the text tokens; whether each output needs a gradient."""
    b = trace.batch
    q, k, v = (trace.linear(f"{name}.to_{p}", dim, dim, b * image, x) for p in "qkv")
    cq, ck, cv = (trace.linear(f"{name}.add_{p}_proj", dim, dim, b * text, c) for p in "qkv")
    out = trace.attention(heads, image + text, image + text, dim // heads, q or cq, k or ck, v or cv)
    image_out = trace.linear(f"{name}.to_out.0", dim, dim, b * image, out)
    if not context_out:
        return image_out, False
    return image_out, trace.linear(f"{name}.to_add_out", dim, dim, b * text, out, live=live_context)


def _known(config: dict[str, Any], known: set[str], cls: str) -> None:
    unknown = sorted(key for key in config if not key.startswith("_") and key not in known)
    if unknown:
        raise NotAnalytic(f"{cls} keys {unknown}")


SD3_KEYS = {"sample_size", "patch_size", "in_channels", "num_layers", "attention_head_dim", "num_attention_heads",
            "joint_attention_dim", "caption_projection_dim", "pooled_projection_dim", "out_channels",
            "pos_embed_max_size", "dual_attention_layers", "qk_norm"}


def sd3(trace: Trace, config: dict[str, Any], image: int, text: int) -> None:
    """``SD3Transformer2DModel``: patch convolution, 2 timestep/pooled MLPs, joint blocks (SD3.5's first ones
    with a second, image-only attention), the last block's text stream ending after its attention."""
    _known(config, SD3_KEYS, "SD3Transformer2DModel")
    heads, head_dim = int(config["num_attention_heads"]), int(config["attention_head_dim"])
    dim, layers, patch = heads * head_dim, int(config["num_layers"]), int(config["patch_size"])
    if int(config["caption_projection_dim"]) != dim:
        raise NotAnalytic("caption_projection_dim differs from the width")
    channels_out = int(config.get("out_channels") or config["in_channels"])
    dual = {int(i) for i in config.get("dual_attention_layers") or ()}
    qk_norm = config.get("qk_norm")
    b = trace.batch
    x = trace.conv("pos_embed.proj", int(config["in_channels"]), dim, (patch, patch), image, False)
    t = timestep_embedding(trace, "time_text_embed.timestep_embedder", dim)
    t = _two_layers(trace, "time_text_embed.text_embedder", int(config["pooled_projection_dim"]), dim, dim, b,
                    False) or t
    c = trace.linear("context_embedder", int(config["joint_attention_dim"]), dim, b * text, False)
    for i in range(layers):
        name, last, two = f"transformer_blocks.{i}", i == layers - 1, i in dual
        m = trace.linear(f"{name}.norm1.linear", dim, (9 if two else 6) * dim, b, t)
        mc = trace.linear(f"{name}.norm1_context.linear", dim, (2 if last else 6) * dim, b, t)
        _qk_norms(trace, f"{name}.attn", head_dim, qk_norm, added=True)
        out, c_out = _joint_attention(trace, f"{name}.attn", dim, heads, image, text, x or m, c or mc,
                                      context_out=not last)
        x_in = x
        x = x or m or out
        if two:
            _qk_norms(trace, f"{name}.attn2", head_dim, qk_norm, added=False)
            n2 = x_in or m
            q, k, v = (trace.linear(f"{name}.attn2.to_{p}", dim, dim, b * image, n2) for p in "qkv")
            a2 = trace.attention(heads, image, image, head_dim, q, k, v)
            x = trace.linear(f"{name}.attn2.to_out.0", dim, dim, b * image, a2) or x
        x = _ff(trace, f"{name}.ff", dim, b * image, x or m) or x
        if not last:
            c = c or mc or c_out
            c = _ff(trace, f"{name}.ff_context", dim, b * text, c or mc) or c
    out = trace.linear("norm_out.linear", dim, 2 * dim, b, t)
    trace.linear("proj_out", dim, patch * patch * channels_out, b * image, x or out)


FLUX_KEYS = {"patch_size", "in_channels", "out_channels", "num_layers", "num_single_layers", "attention_head_dim",
             "num_attention_heads", "joint_attention_dim", "pooled_projection_dim", "guidance_embeds",
             "axes_dims_rope"}


def flux(trace: Trace, config: dict[str, Any], image: int, text: int) -> None:
    """``FluxTransformer2DModel``: dual-stream blocks, then single-stream blocks over text and image tokens
    together (attention and MLP side by side into one proj_out). Kontext's source tokens count as image tokens."""
    _known(config, FLUX_KEYS, "FluxTransformer2DModel")
    heads, head_dim = int(config["num_attention_heads"]), int(config["attention_head_dim"])
    dim, patch, b = heads * head_dim, int(config["patch_size"]), trace.batch
    channels_in = int(config["in_channels"])
    channels_out = int(config.get("out_channels") or channels_in)
    x = trace.linear("x_embedder", channels_in, dim, b * image, False)
    t = timestep_embedding(trace, "time_text_embed.timestep_embedder", dim)
    if config.get("guidance_embeds"):
        t = timestep_embedding(trace, "time_text_embed.guidance_embedder", dim) or t
    t = _two_layers(trace, "time_text_embed.text_embedder", int(config["pooled_projection_dim"]), dim, dim, b,
                    False) or t
    c = trace.linear("context_embedder", int(config["joint_attention_dim"]), dim, b * text, False)
    for i in range(int(config["num_layers"])):
        name = f"transformer_blocks.{i}"
        m = trace.linear(f"{name}.norm1.linear", dim, 6 * dim, b, t)
        mc = trace.linear(f"{name}.norm1_context.linear", dim, 6 * dim, b, t)
        _qk_norms(trace, f"{name}.attn", head_dim, "rms_norm", added=True)
        out, c_out = _joint_attention(trace, f"{name}.attn", dim, heads, image, text, x or m, c or mc)
        x = x or m or out
        x = _ff(trace, f"{name}.ff", dim, b * image, x or m) or x
        c = c or mc or c_out
        c = _ff(trace, f"{name}.ff_context", dim, b * text, c or mc) or c
    h, rows = x or c, b * (image + text)
    for i in range(int(config["num_single_layers"])):
        name = f"single_transformer_blocks.{i}"
        m = trace.linear(f"{name}.norm.linear", dim, 3 * dim, b, t)
        n = h or m
        mlp = trace.linear(f"{name}.proj_mlp", dim, 4 * dim, rows, n)
        _qk_norms(trace, f"{name}.attn", head_dim, "rms_norm", added=False)
        q, k, v = (trace.linear(f"{name}.attn.to_{p}", dim, dim, rows, n) for p in "qkv")
        a = trace.attention(heads, image + text, image + text, head_dim, q, k, v)
        h = trace.linear(f"{name}.proj_out", 5 * dim, dim, rows, a or mlp) or h or m
    out = trace.linear("norm_out.linear", dim, 2 * dim, b, t)
    trace.linear("proj_out", dim, patch * patch * channels_out, b * image, h or out)


QWEN_KEYS = {"patch_size", "in_channels", "out_channels", "num_layers", "attention_head_dim", "num_attention_heads",
             "joint_attention_dim", "guidance_embeds", "axes_dims_rope", "zero_cond_t", "use_additional_t_cond",
             "use_layer3d_rope"}


def qwen_image(trace: Trace, config: dict[str, Any], image: int, text: int) -> None:
    """``QwenImageTransformer2DModel``: RMS-normed text input, 60 dual-stream blocks whose text modulation and MLP
    mirror the image's; the last block's text stream after its attention feeds nothing (no backward)."""
    _known(config, QWEN_KEYS, "QwenImageTransformer2DModel")
    for flag in ("guidance_embeds", "zero_cond_t", "use_additional_t_cond", "use_layer3d_rope"):
        if config.get(flag):
            raise NotAnalytic(f"QwenImageTransformer2DModel {flag}")
    heads, head_dim = int(config["num_attention_heads"]), int(config["attention_head_dim"])
    dim, patch, b, layers = heads * head_dim, int(config["patch_size"]), trace.batch, int(config["num_layers"])
    channels_out = int(config.get("out_channels") or config["in_channels"])
    width = int(config["joint_attention_dim"])
    x = trace.linear("img_in", int(config["in_channels"]), dim, b * image, False)
    trace.param("txt_norm.weight", width)
    c = trace.linear("txt_in", width, dim, b * text, trace.full)
    t = timestep_embedding(trace, "time_text_embed.timestep_embedder", dim)
    for i in range(layers):
        name, live = f"transformer_blocks.{i}", i < layers - 1
        m = trace.linear(f"{name}.img_mod.1", dim, 6 * dim, b, t)
        mc = trace.linear(f"{name}.txt_mod.1", dim, 6 * dim, b, t)
        _qk_norms(trace, f"{name}.attn", head_dim, "rms_norm", added=True)
        out, c_out = _joint_attention(trace, f"{name}.attn", dim, heads, image, text, x or m, c or mc,
                                      live_context=live)
        x = x or m or out
        x = _ff(trace, f"{name}.img_mlp", dim, b * image, x or m) or x
        c = c or mc or c_out
        c = _ff(trace, f"{name}.txt_mlp", dim, b * text, c or mc, live=live) or c
    out = trace.linear("norm_out.linear", dim, 2 * dim, b, t)
    trace.linear("proj_out", dim, patch * patch * channels_out, b * image, x or out)
