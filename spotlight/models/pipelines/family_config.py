"""Which diffusers transformer (SD3, FLUX, Qwen-Image) a policy wraps, and the LoRA trained on it.

Kept apart from the policy so that a config can be validated, stored in a checkpoint and sent to a
spot device without importing diffusers: the config alone rebuilds the base model (a folder, or
``tiny`` with ``init_seed``), which is why a LoRA checkpoint needs no base weights.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, model_validator

from spotlight.schema import Section

if TYPE_CHECKING:  # torch is imported where a dtype is asked for: reading a config needs none
    import torch

Family = Literal["sd3", "flux", "qwen-image", "wan"]
DTypeName = Literal["float32", "bfloat16", "float16"]
Finetune = Literal["lora", "full"]

TRANSFORMER_CLASSES: dict[str, str] = {
    "sd3": "SD3Transformer2DModel",
    "flux": "FluxTransformer2DModel",
    "qwen-image": "QwenImageTransformer2DModel",
    "wan": "WanTransformer3DModel",
}

# All three families name their joint-attention projections alike: image stream to_q/k/v/out.0,
# text stream add_q/k/v_proj and to_add_out (FLUX's single-stream blocks have attn.to_q/k/v too).
# Attention-only LoRA on these projections is what Flow-GRPO trains on SD3.5.
DEFAULT_LORA_TARGETS: tuple[str, ...] = (
    "attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0",
    "attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj", "attn.to_add_out",
)
# Wan's blocks name theirs attn1 (self-attention over the video tokens) and attn2 (cross-attention to the text)
FAMILY_LORA_TARGETS: dict[str, tuple[str, ...]] = {
    "wan": ("attn1.to_q", "attn1.to_k", "attn1.to_v", "attn1.to_out.0",
            "attn2.to_q", "attn2.to_k", "attn2.to_v", "attn2.to_out.0"),
}



def lora_targets(family: str, configured: tuple[str, ...] | None = None) -> tuple[str, ...]:
    """The module-name suffixes that get LoRA: ``configured`` (model.lora_target_modules) or the family's defaults."""
    return configured or FAMILY_LORA_TARGETS.get(family, DEFAULT_LORA_TARGETS)


# Random transformers small enough for a CPU test, with every code path of the real architectures:
# SD3.5's dual-attention block and QK-norm, FLUX's single-stream blocks and guidance embedding.
TINY_CONFIGS: dict[str, dict[str, Any]] = {
    "sd3": dict(sample_size=8, patch_size=2, in_channels=4, out_channels=4, num_layers=2, attention_head_dim=8,
                num_attention_heads=4, joint_attention_dim=32, caption_projection_dim=32, pooled_projection_dim=64,
                pos_embed_max_size=16, qk_norm="rms_norm", dual_attention_layers=(0,)),
    "flux": dict(patch_size=1, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=16,
                 num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=32, guidance_embeds=True,
                 axes_dims_rope=(4, 4, 8)),
    "qwen-image": dict(patch_size=2, in_channels=16, out_channels=4, num_layers=2, attention_head_dim=16,
                       num_attention_heads=2, joint_attention_dim=16, axes_dims_rope=(8, 4, 4)),
}
TINY_LATENT_SIZE = 8
PRETRAINED_LATENT_SIZE = 128  # 1024-pixel images through an 8x VAE, the resolution all three were trained at


class DiffusersPolicyConfig(Section):
    """Which diffusers transformer to wrap and the LoRA trained on it.

    Exactly one of ``pretrained`` (a local diffusers folder, pipeline or transformer, or a Hub id) and
    ``tiny: true`` (a random transformer from ``TINY_CONFIGS`` updated by ``tiny_overrides``).
    ``latent_size`` is the latent height = width; None means 8 for tiny models and 128 (1024-pixel
    images) for pretrained ones. ``guidance_scale`` is used only by guidance-distilled FLUX checkpoints.

    A tiny model with ``init_seed`` draws its weights (transformer, LoRA, text encoder) from that seed
    alone, so every process that builds it from this config holds the same base. With ``task`` set,
    prompts come as token ids of that task's tokenizer (``vocab_size`` ids, ``max_text_len`` long)
    through a small frozen text encoder of the same seed, which is what ``spotlight train`` runs.
    """

    family: Family
    pretrained: str | None = None
    tiny: bool = False
    tiny_overrides: dict[str, Any] = Field(default_factory=dict)
    latent_size: int | None = Field(None, ge=2)
    lora_rank: int = Field(32, ge=1)
    lora_alpha: float = Field(64.0, gt=0)
    lora_target_modules: tuple[str, ...] | None = None
    dtype: DTypeName = "bfloat16"
    guidance_scale: float = Field(3.5, ge=0)
    init_seed: int | None = None
    task: str | None = None
    vocab_size: int | None = Field(None, ge=2)
    max_text_len: int = Field(12, ge=1)
    # what is trained: LoRA on the attention projections (the base frozen), or every transformer weight
    # (kept in float32, the forward in ``dtype`` under autocast when that is lower)
    finetune: Finetune = "lora"
    gradient_checkpointing: bool = False  # the transformer's enable_gradient_checkpointing(): memory for compute
    autocast: bool = False  # run the forward under torch.autocast(dtype) (LoRA: the float32 adapters too)
    # sample with the LoRA folded into the base weights once per rollout (spotlight.models.lora_merge);
    # None: on CUDA only, so CPU runs keep the adapter math bit for bit
    merge_lora: bool | None = None
    compile: bool = False  # torch.compile each transformer block (spotlight.models.pipelines.adapter.compile_blocks)
    # --- a whole pipeline folder (``pipeline: true``, ``pretrained`` its folder): its text encoders
    # condition (prompt ids, spotlight.models.pipelines.prompts), its VAE decodes, its scheduler sets the
    # schedule; ``resolution`` (pixels, height x width) sets the latents
    pipeline: bool = False
    resolution: tuple[int, int] | None = None
    negative_prompt: str = ""  # the unconditional branch of classifier-free guidance
    # a two-expert Wan2.2 folder only: the low-noise expert's scale (WanPipeline's guidance_scale_2; guidance runs
    # when guidance_scale > 1, as there); None: guidance_scale for both experts
    guidance_scale_2: float | None = Field(None, ge=0)
    max_sequence_length: int | None = Field(None, ge=1)  # None: the family pipeline's default
    num_frames: int | None = Field(None, ge=1)  # a video pipeline's frames per sample (None: its default)

    @model_validator(mode="after")
    def _pipeline_fields(self) -> DiffusersPolicyConfig:
        if self.pipeline and self.pretrained is None:
            raise ValueError("pipeline: true reads a pipeline folder: set pretrained to it")
        if not self.pipeline and self.resolution is not None:
            raise ValueError("resolution applies to a pipeline folder (pipeline: true); a transformer alone takes "
                             "latent_size")
        return self

    @model_validator(mode="after")
    def _one_source(self) -> DiffusersPolicyConfig:
        if (self.pretrained is None) == (not self.tiny):
            raise ValueError(
                "set exactly one of pretrained (a local diffusers folder or Hub id) and tiny: true "
                f"(got pretrained={self.pretrained!r}, tiny={self.tiny})"
            )
        if self.tiny_overrides and not self.tiny:
            raise ValueError("tiny_overrides only apply with tiny: true; remove them or set tiny: true")
        if self.latent_size is not None and self.latent_size % 2:
            raise ValueError(f"latent_size must be even: latents are packed in 2x2 patches (got {self.latent_size})")
        if self.lora_target_modules is not None and not self.lora_target_modules:
            raise ValueError("lora_target_modules is empty: list module names, or leave it out for the defaults")
        if not self.tiny and (self.init_seed is not None or self.vocab_size is not None):
            raise ValueError("init_seed and vocab_size (a random text encoder) apply to tiny: true only: a pretrained "
                             "transformer brings its weights and takes its own text encoder's embeddings")
        if self.task is not None and not (self.tiny or self.pipeline):
            raise ValueError("task names the token vocabulary of a tiny model, or the prompt set of a pipeline "
                             "(pipeline: true): remove it for a pretrained transformer alone")
        if self.tiny and (self.task is None) != (self.vocab_size is None):
            raise ValueError("set task and vocab_size together: the text encoder embeds that task's token ids")
        return self

    @property
    def target_modules(self) -> tuple[str, ...]:
        """The module-name suffixes that get LoRA: the configured ones or the family's defaults."""
        return lora_targets(self.family, self.lora_target_modules)

    @property
    def resolved_latent_size(self) -> int:
        if self.latent_size is not None:
            return self.latent_size
        return TINY_LATENT_SIZE if self.tiny else PRETRAINED_LATENT_SIZE

    @property
    def torch_dtype(self) -> torch.dtype:
        import torch

        return getattr(torch, self.dtype)
