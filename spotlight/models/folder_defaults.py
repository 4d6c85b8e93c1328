"""What a pipeline component's config means where it leaves a key out: the default of the class that reads it.

diffusers builds each component as ``cls(**config)`` and records every argument, so a key a config omits
is the class's ``__init__`` default (``scheduler.config.get("max_shift", 1.16)`` in the SD3 pipeline reads
the scheduler's 1.15, never the 1.16). Published folders write every key; a folder assembled by hand or
saved by another tool may not, and Spotlight must then read the value diffusers would use. These are
diffusers' defaults for the keys Spotlight reads (the geometry, the widths, the schedule), written out so
that reading a folder imports no diffusers; tests/models/test_folder_defaults.py checks them against the
installed classes' signatures.
"""

from __future__ import annotations

from typing import Any

__all__ = ["CLASS_DEFAULTS", "with_class_defaults"]

CLASS_DEFAULTS: dict[str, dict[str, Any]] = {
    "SD3Transformer2DModel": {
        "sample_size": 128, "patch_size": 2, "in_channels": 16, "num_layers": 18, "attention_head_dim": 64,
        "num_attention_heads": 18, "joint_attention_dim": 4096, "caption_projection_dim": 1152,
        "pooled_projection_dim": 2048, "out_channels": 16, "pos_embed_max_size": 96},
    "FluxTransformer2DModel": {
        "patch_size": 1, "in_channels": 64, "num_layers": 19, "num_single_layers": 38, "attention_head_dim": 128,
        "num_attention_heads": 24, "joint_attention_dim": 4096, "pooled_projection_dim": 768,
        "guidance_embeds": False},
    "QwenImageTransformer2DModel": {
        "patch_size": 2, "in_channels": 64, "out_channels": 16, "num_layers": 60, "attention_head_dim": 128,
        "num_attention_heads": 24, "joint_attention_dim": 3584, "guidance_embeds": False},
    "AutoencoderKL": {"block_out_channels": [64], "latent_channels": 4, "scaling_factor": 0.18215,
                      "shift_factor": None},
    "AutoencoderKLQwenImage": {"base_dim": 96, "z_dim": 16, "temperal_downsample": [False, True, True]},
    "FlowMatchEulerDiscreteScheduler": {
        "num_train_timesteps": 1000, "shift": 1.0, "use_dynamic_shifting": False, "base_shift": 0.5,
        "max_shift": 1.15, "base_image_seq_len": 256, "max_image_seq_len": 4096, "invert_sigmas": False,
        "shift_terminal": None, "use_karras_sigmas": False, "use_exponential_sigmas": False,
        "use_beta_sigmas": False, "time_shift_type": "exponential", "stochastic_sampling": False},
}


def with_class_defaults(class_name: str | None, config: dict[str, Any]) -> dict[str, Any]:
    """``config`` with the keys it leaves out filled with ``class_name``'s defaults (as unchanged for a class
    not listed here: Spotlight then reads only what the file says)."""
    return {**CLASS_DEFAULTS.get(class_name or "", {}), **config}
