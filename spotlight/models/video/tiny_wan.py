"""Tiny random Wan text-to-video pipelines: the parts `spotlight.models.pipelines.tiny` saves for ``wan`` (Wan2.1)
and ``wan22`` (Wan2.2 A14B's two experts, ``transformer_2`` and ``boundary_ratio``).

Every part is Wan's real class (``WanTransformer3DModel``, ``AutoencoderKLWan``, ``UMT5EncoderModel``), a
few channels wide. The VAE has two resolution levels and one temporal downsample, so its scale factors
are 2 and 2 (``scale_factor_spatial`` / ``scale_factor_temporal`` are written into its config, as
``WanPipeline`` reads them from there): 5 frames of 32 x 32 pixels are 3 latent frames of 16 x 16.
The scheduler is ``FlowMatchEulerDiscreteScheduler`` (Wan2.1's folders ship UniPC, a multistep solver
that Spotlight's Euler / SDE sampler does not reproduce step for step), so ``WanPipeline(...)`` on this
folder is the reference the ODE sampler must equal.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["TINY_BOUNDARY_RATIO", "tiny_wan22_parts", "tiny_wan_parts", "umt5_encoder"]

TINY_BOUNDARY_RATIO = 0.875  # Wan2.2 T2V-A14B's model_index.json value

TEXT_WIDTH = 32


def umt5_encoder(width: int, vocab_size: int, layers: int = 2) -> Any:
    """A random UMT5 encoder ``width`` wide over ``vocab_size`` ids (Wan's text encoder class)."""
    from transformers import UMT5Config, UMT5EncoderModel

    config = UMT5Config(vocab_size=vocab_size, d_model=width, d_kv=8, d_ff=2 * width, num_layers=layers,
                        num_heads=2, relative_attention_num_buckets=8, pad_token_id=0, eos_token_id=3,
                        decoder_start_token_id=0)
    return UMT5EncoderModel(config)


def tiny_wan_parts(tokenizer: Any, vocab_size: int) -> dict[str, Any]:
    """The components of a tiny ``WanPipeline`` (random weights from torch's current RNG)."""
    from diffusers import AutoencoderKLWan, FlowMatchEulerDiscreteScheduler

    z_dim = 4
    generator = torch.Generator().manual_seed(0)
    latents_mean = (torch.randn(z_dim, generator=generator) * 0.5).tolist()
    latents_std = (1.0 + torch.rand(z_dim, generator=generator)).tolist()
    vae = AutoencoderKLWan(base_dim=8, z_dim=z_dim, dim_mult=[1, 2], num_res_blocks=1, temperal_downsample=[True],
                           latents_mean=latents_mean, latents_std=latents_std, scale_factor_spatial=2,
                           scale_factor_temporal=2)
    return dict(transformer=_tiny_transformer(z_dim), vae=vae, text_encoder=umt5_encoder(TEXT_WIDTH, vocab_size),
                tokenizer=tokenizer, scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0))


def _tiny_transformer(z_dim: int) -> Any:
    from diffusers import WanTransformer3DModel

    return WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=z_dim, out_channels=z_dim,
        text_dim=TEXT_WIDTH, freq_dim=16, ffn_dim=32, num_layers=2, cross_attn_norm=True,
        qk_norm="rms_norm_across_heads", rope_max_seq_len=32)


def tiny_wan22_parts(tokenizer: Any, vocab_size: int) -> dict[str, Any]:
    """A tiny two-expert Wan2.2 (A14B layout): Wan2.1's parts plus a second, independently drawn transformer
    (``transformer_2``, the low-noise expert) and A14B's ``boundary_ratio``."""
    parts = tiny_wan_parts(tokenizer, vocab_size)
    return {**parts, "transformer_2": _tiny_transformer(parts["transformer"].config.in_channels),
            "boundary_ratio": TINY_BOUNDARY_RATIO}
