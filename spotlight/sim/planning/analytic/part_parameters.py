"""Parameters of a pipeline's text encoders and VAE from their config.json numbers, with no model built.

`spotlight plan` sizes a config-only folder's text encoders and VAE (memory, the report), and building them
on the meta device means importing transformers' and diffusers' model code, seconds of `plan`'s budget.
Each class below is its library's layout written out: the embedding tables, the per-layer projections and
norms, the convolutions of each resolution stage. A key the config leaves out reads as its class's default
(the ``DEFAULTS`` here, checked against the installed classes by tests/sim/planning/test_analytic_counts.py).
A class or config option not written out raises NotAnalytic, and the meta-device count takes over.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from spotlight.sim.planning.analytic.trace import NotAnalytic

__all__ = ["DEFAULTS", "PART_COUNTS", "part_parameters"]

# each class's defaults for the keys read here (transformers' config classes, diffusers' __init__ signatures)
DEFAULTS: dict[str, dict[str, Any]] = {
    "CLIPTextModel": {"vocab_size": 49408, "hidden_size": 512, "intermediate_size": 2048, "num_hidden_layers": 12,
                      "max_position_embeddings": 77, "projection_dim": 512},
    "T5EncoderModel": {"vocab_size": 32128, "d_model": 512, "d_kv": 64, "d_ff": 2048, "num_layers": 6, "num_heads": 8,
                       "relative_attention_num_buckets": 32, "feed_forward_proj": "relu"},
    "UMT5EncoderModel": {"vocab_size": 250112, "d_model": 512, "d_kv": 64, "d_ff": 1024, "num_layers": 8,
                         "num_heads": 6, "relative_attention_num_buckets": 32, "feed_forward_proj": "gated-gelu"},
    "Qwen2_5_VLForConditionalGeneration": {"tie_word_embeddings": False},
    "Qwen2_5_VLTextModel": {"vocab_size": 152064, "hidden_size": 8192, "intermediate_size": 29568,
                            "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8},
    "Qwen2_5_VLVisionModel": {"depth": 32, "hidden_size": 3584, "intermediate_size": 3420, "in_channels": 3,
                              "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2,
                              "out_hidden_size": 3584},
    "AutoencoderKL": {"in_channels": 3, "out_channels": 3, "down_block_types": ["DownEncoderBlock2D"],
                      "up_block_types": ["UpDecoderBlock2D"], "block_out_channels": [64], "layers_per_block": 1,
                      "latent_channels": 4, "use_quant_conv": True, "use_post_quant_conv": True,
                      "mid_block_add_attention": True},
    "AutoencoderKLWan": {"base_dim": 96, "decoder_base_dim": None, "z_dim": 16, "dim_mult": [1, 2, 4, 4],
                         "num_res_blocks": 2, "attn_scales": [], "temperal_downsample": [False, True, True],
                         "is_residual": False, "in_channels": 3, "out_channels": 3, "patch_size": None},
    "AutoencoderKLQwenImage": {"base_dim": 96, "z_dim": 16, "dim_mult": [1, 2, 4, 4], "num_res_blocks": 2,
                               "attn_scales": [], "temperal_downsample": [False, True, True], "input_channels": 3},
}
DEFAULTS["CLIPTextModelWithProjection"] = DEFAULTS["CLIPTextModel"]


def _read(cls: str, config: dict[str, Any]) -> dict[str, Any]:
    return {**DEFAULTS[cls], **{key: value for key, value in config.items() if key in DEFAULTS[cls]}}


def _linear(fan_in: int, fan_out: int, bias: bool = True) -> int:
    return fan_in * fan_out + (fan_out if bias else 0)


def _clip(config: dict[str, Any], projection: bool) -> int:
    c = _read("CLIPTextModel", config)
    h, inner = int(c["hidden_size"]), int(c["intermediate_size"])
    layer = 4 * _linear(h, h) + _linear(h, inner) + _linear(inner, h) + 2 * 2 * h
    total = (int(c["vocab_size"]) + int(c["max_position_embeddings"])) * h + int(c["num_hidden_layers"]) * layer
    return total + 2 * h + (int(c["projection_dim"]) * h if projection else 0)


def _t5(config: dict[str, Any], cls: str) -> int:
    """T5's encoder (one relative-position table, in the first block) or UMT5's (one in every block)."""
    c = _read(cls, config)
    d, inner, ff = int(c["d_model"]), int(c["num_heads"]) * int(c["d_kv"]), int(c["d_ff"])
    gated = str(c["feed_forward_proj"]).startswith("gated-")
    layer = 4 * d * inner + (3 if gated else 2) * d * ff + 2 * d
    bias_table = int(c["relative_attention_num_buckets"]) * int(c["num_heads"])
    layers = int(c["num_layers"])
    tables = layers if cls == "UMT5EncoderModel" else 1
    return int(c["vocab_size"]) * d + layers * layer + tables * bias_table + d


def _qwen25_vl(config: dict[str, Any]) -> int:
    """Qwen2.5-VL: the vision tower (patch convolution, blocks, patch merger), the language model and its head."""
    text = _read("Qwen2_5_VLTextModel", config.get("text_config") or config)
    vision = _read("Qwen2_5_VLVisionModel", config.get("vision_config") or {})
    tied = _read("Qwen2_5_VLForConditionalGeneration", config)["tie_word_embeddings"]
    h, heads, kv = int(text["hidden_size"]), int(text["num_attention_heads"]), int(text["num_key_value_heads"])
    head_dim, inner = h // heads, int(text["intermediate_size"])
    layer = (_linear(h, h) + 2 * _linear(h, kv * head_dim) + _linear(h, h, bias=False)
             + 3 * inner * h + 2 * h)
    vocab = int(text["vocab_size"])
    language = vocab * h + int(text["num_hidden_layers"]) * layer + h + (0 if tied else vocab * h)
    v, v_inner = int(vision["hidden_size"]), int(vision["intermediate_size"])
    patch = int(vision["in_channels"]) * int(vision["temporal_patch_size"]) * int(vision["patch_size"]) ** 2 * v
    block = 2 * v + _linear(v, 3 * v) + _linear(v, v) + 2 * _linear(v, v_inner) + _linear(v_inner, v)
    merged = v * int(vision["spatial_merge_size"]) ** 2
    merger = v + _linear(merged, merged) + _linear(merged, int(vision["out_hidden_size"]))
    return language + patch + int(vision["depth"]) * block + merger


def _conv(channels_in: int, channels_out: int, kernel: int, dims: int = 2) -> int:
    return channels_in * channels_out * kernel**dims + channels_out


def _kl_resnet(channels_in: int, channels_out: int) -> int:
    shortcut = _conv(channels_in, channels_out, 1) if channels_in != channels_out else 0
    return 2 * channels_in + _conv(channels_in, channels_out, 3) + 2 * channels_out + _conv(channels_out,
                                                                                            channels_out, 3) + shortcut


def _autoencoder_kl(config: dict[str, Any]) -> int:
    """diffusers' ``AutoencoderKL`` (SD3, FLUX): ResNet stages down and up, a mid block with one attention."""
    c = _read("AutoencoderKL", config)
    if set(c["down_block_types"]) != {"DownEncoderBlock2D"} or set(c["up_block_types"]) != {"UpDecoderBlock2D"}:
        raise NotAnalytic("AutoencoderKL block types")
    channels, layers, latent = [int(n) for n in c["block_out_channels"]], int(c["layers_per_block"]), int(
        c["latent_channels"])
    top = channels[-1]
    mid = 2 * _kl_resnet(top, top) + (2 * top + 4 * _linear(top, top) if c["mid_block_add_attention"] else 0)
    encoder = _conv(int(c["in_channels"]), channels[0], 3) + mid + 2 * top + _conv(top, 2 * latent, 3)
    previous = channels[0]
    for i, out in enumerate(channels):
        encoder += _kl_resnet(previous, out) + (layers - 1) * _kl_resnet(out, out)
        encoder += _conv(out, out, 3) if i < len(channels) - 1 else 0
        previous = out
    decoder = _conv(latent, top, 3) + mid + 2 * channels[0] + _conv(channels[0], int(c["out_channels"]), 3)
    previous = top
    for i, out in enumerate(reversed(channels)):
        decoder += _kl_resnet(previous, out) + layers * _kl_resnet(out, out)
        decoder += _conv(out, out, 3) if i < len(channels) - 1 else 0
        previous = out
    quant = (_conv(2 * latent, 2 * latent, 1) if c["use_quant_conv"] else 0) + (
        _conv(latent, latent, 1) if c["use_post_quant_conv"] else 0)
    return encoder + decoder + quant


def _causal_resnet(channels_in: int, channels_out: int) -> int:
    shortcut = _conv(channels_in, channels_out, 1, 3) if channels_in != channels_out else 0
    return channels_in + _conv(channels_in, channels_out, 3, 3) + channels_out + _conv(channels_out, channels_out, 3,
                                                                                       3) + shortcut


def _causal_vae(base: int, decoder_base: int, z: int, mult: list[int], blocks: int, temporal: list[bool],
                channels_in: int, channels_out: int) -> int:
    """Wan2.1's (and Qwen-Image's copy of its) causal 3D VAE: RMS-normed residual blocks, 2D resamples with a
    temporal convolution where the stage changes the frame rate, one attention in each mid block."""
    def mid(dim: int) -> int:
        return 2 * _causal_resnet(dim, dim) + dim + _conv(dim, 3 * dim, 1) + _conv(dim, dim, 1)

    dims = [base * m for m in [1, *mult]]
    encoder = _conv(channels_in, dims[0], 3, 3)
    for i, (dim_in, dim_out) in enumerate(zip(dims[:-1], dims[1:], strict=True)):
        encoder += _causal_resnet(dim_in, dim_out) + (blocks - 1) * _causal_resnet(dim_out, dim_out)
        if i != len(mult) - 1:
            encoder += _conv(dim_out, dim_out, 3) + (dim_out * dim_out * 3 + dim_out if temporal[i] else 0)
    encoder += mid(dims[-1]) + dims[-1] + _conv(dims[-1], 2 * z, 3, 3)
    dims = [decoder_base * m for m in [mult[-1], *mult[::-1]]]
    upsample = temporal[::-1]
    decoder = _conv(z, dims[0], 3, 3) + mid(dims[0])
    for i, (dim_in, dim_out) in enumerate(zip(dims[:-1], dims[1:], strict=True)):
        dim_in = dim_in // 2 if i > 0 else dim_in
        decoder += _causal_resnet(dim_in, dim_out) + blocks * _causal_resnet(dim_out, dim_out)
        if i != len(mult) - 1:
            decoder += _conv(dim_out, dim_out // 2, 3) + (dim_out * 2 * dim_out * 3 + 2 * dim_out if upsample[i] else 0)
    decoder += dims[-1] + _conv(dims[-1], channels_out, 3, 3)
    return encoder + decoder + _conv(2 * z, 2 * z, 1, 3) + _conv(z, z, 1, 3)


def _wan_vae(config: dict[str, Any], cls: str) -> int:
    c = _read(cls, config)
    if c.get("attn_scales") or c.get("is_residual") or c.get("patch_size"):
        raise NotAnalytic(f"{cls} attn_scales / is_residual / patch_size")
    base = int(c["base_dim"])
    channels = int(c.get("in_channels") or c.get("input_channels"))
    return _causal_vae(base, int(c.get("decoder_base_dim") or base), int(c["z_dim"]), [int(m) for m in c["dim_mult"]],
                       int(c["num_res_blocks"]), [bool(t) for t in c["temperal_downsample"]], channels,
                       int(c.get("out_channels") or channels))


PART_COUNTS: dict[tuple[str, str], Callable[[dict[str, Any]], int]] = {
    ("transformers", "CLIPTextModel"): lambda config: _clip(config, projection=False),
    ("transformers", "CLIPTextModelWithProjection"): lambda config: _clip(config, projection=True),
    ("transformers", "T5EncoderModel"): lambda config: _t5(config, "T5EncoderModel"),
    ("transformers", "UMT5EncoderModel"): lambda config: _t5(config, "UMT5EncoderModel"),
    ("transformers", "Qwen2_5_VLForConditionalGeneration"): _qwen25_vl,
    ("diffusers", "AutoencoderKL"): _autoencoder_kl,
    ("diffusers", "AutoencoderKLWan"): lambda config: _wan_vae(config, "AutoencoderKLWan"),
    ("diffusers", "AutoencoderKLQwenImage"): lambda config: _wan_vae(config, "AutoencoderKLQwenImage"),
}


def part_parameters(library: str, class_name: str, config: dict[str, Any]) -> int:
    """Parameters of the ``library.class_name`` part built from ``config`` (NotAnalytic for one not written out)."""
    count = PART_COUNTS.get((library, class_name))
    if count is None:
        raise NotAnalytic(f"{library}.{class_name}")
    return int(count(config))
