"""diffusers transformers (SD3, FLUX, Qwen-Image) behind TinyDiT's policy interface, trained through LoRA.

``DiffusersPolicy(x, sigma, cond) -> velocity`` takes latents (B, C, H, W), noise levels sigma (B,) and
prompt embeddings, and returns the velocity (B, C, H, W) in Spotlight's convention
(``x_sigma = (1 - sigma) x0 + sigma noise``, ``v = noise - x0``, sampling runs sigma 1 -> 0), so the
sampler and the GRPO update use it exactly as they use a TinyDiT. All three families were trained with
that same rectified-flow target and all three embed the noise level as the DDPM-style timestep
``1000 * sigma``; they differ only in how that number and the latents are handed over, which is
what this module hides:

============  ==========================  ===========================  ==================================
family        latents the model takes     ``timestep`` argument        extra inputs
============  ==========================  ===========================  ==================================
sd3           (B, C, H, W), patchified    ``1000 * sigma``             pooled prompt vector
              inside the model
flux          2x2-packed (B, HW/4, 4C)    ``sigma`` (x1000 inside)     pooled vector, RoPE ids of text
                                                                       and image tokens, guidance scale
                                                                       (guidance-distilled checkpoints)
qwen-image    2x2-packed (B, HW/4, 4C)    ``sigma`` (x1000 inside)     text mask, packed grid size
============  ==========================  ===========================  ==================================

(The FLUX and Qwen-Image pipelines likewise pass ``timestep / 1000``, i.e. sigma.) Packing follows the
pipelines' ``_pack_latents``: token (i, j) holds the 2x2 patch of rows 2i..2i+1 and columns 2j..2j+1,
channel-major.

LoRA comes from peft through diffusers' ``add_adapter``; the base weights are frozen, LoRA's B
matrices start at zero (so the initial policy *is* the base model), and the reference policy of the
KL term is the same module with the adapter disabled: no second copy of a multi-billion-parameter model.
Checkpoints hold only the LoRA tensors (safetensors, with the LoRA shape in the file's metadata).

Sequence parallelism (Ulysses). ``policy.attention_fn = fn`` routes the joint (text + image)
attention of every block through ``fn(q, k, v, key_padding_mask)`` on (B, H, N, Dh), the interface of
``spotlight.models.attention`` that ``spotlight.runtime.ulysses.UlyssesAttention`` implements; with
plain SDPA it reproduces diffusers' own processors (tested). That is the head-sharding half of Ulysses.
The token-sharding half is not wired yet, for these precise reasons:

1. TinyDiT exposes ``embed`` / ``run_blocks`` / ``unpatchify``, so the runtime shards the sequence
   between them. A diffusers ``forward`` is one function that embeds, computes rotary embeddings
   for the *whole* sequence, runs the blocks and unpatchifies; sharding needs hooks that split the
   text and the image streams (two tensors in dual-stream blocks, split separately) before the first
   block and gather the image stream before ``norm_out``, as diffusers' ``_cp_plan`` hooks do.
2. The rotary embeddings must be sliced to the same shards (FLUX: cos/sin over the joint
   [text; image] ids; Qwen-Image: image and text frequencies separately), and so must Qwen-Image's
   text mask.
3. After the all-to-all a rank sees tokens in the order [text_0; image_0; text_1; image_1; ...], so
   the key padding mask handed to ``UlyssesAttention`` must be permuted to that order, and the text
   must be padded to a multiple of the SP degree with the padding masked; SD3 and FLUX pass no text
   mask to their processors, so the sharding hook would have to supply it.
4. diffusers' built-in context parallelism (``enable_parallelism(ContextParallelConfig(ulysses_degree=P))``)
   does 1-2, but in diffusers 0.42 it fails on a CPU before any work (it computes
   ``rank % torch.accelerator.device_count()``, which is 0 there), SD3's transformer has no ``_cp_plan``,
   and its device mesh is fixed when parallelism is enabled, whereas the elastic runtime re-forms
   groups of other sizes after a preemption.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch
import torch.nn as nn
from pydantic import Field, model_validator
from safetensors import safe_open
from safetensors.torch import save_file

from spotlight.config import Section
from spotlight.models.attention import AttentionFn

if TYPE_CHECKING:
    from diffusers.models.modeling_utils import ModelMixin

Family = Literal["sd3", "flux", "qwen-image"]
DTypeName = Literal["float32", "bfloat16", "float16"]

TRANSFORMER_CLASSES: dict[str, str] = {
    "sd3": "SD3Transformer2DModel",
    "flux": "FluxTransformer2DModel",
    "qwen-image": "QwenImageTransformer2DModel",
}

# All three families name their joint-attention projections alike: image stream to_q/k/v/out.0,
# text stream add_q/k/v_proj and to_add_out (FLUX's single-stream blocks have attn.to_q/k/v too).
# Attention-only LoRA on these projections is what Flow-GRPO trains on SD3.5.
DEFAULT_LORA_TARGETS: tuple[str, ...] = (
    "attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0",
    "attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj", "attn.to_add_out",
)

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

LORA_FORMAT = "spotlight-lora/1"
ADAPTER_NAME = "spotlight"


class DiffusersPolicyConfig(Section):
    """Which diffusers transformer to wrap and the LoRA trained on it.

    Exactly one of ``pretrained`` (a local diffusers folder, pipeline or transformer, or a Hub id) and
    ``tiny: true`` (a random transformer from ``TINY_CONFIGS`` updated by ``tiny_overrides``, for tests).
    ``latent_size`` is the latent height = width; None means 8 for tiny models and 128 (1024-pixel
    images) for pretrained ones. ``guidance_scale`` is used only by guidance-distilled FLUX checkpoints.
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
        return self

    @property
    def target_modules(self) -> tuple[str, ...]:
        """The module-name suffixes that get LoRA: the configured ones or ``DEFAULT_LORA_TARGETS``."""
        return self.lora_target_modules or DEFAULT_LORA_TARGETS

    @property
    def resolved_latent_size(self) -> int:
        if self.latent_size is not None:
            return self.latent_size
        return TINY_LATENT_SIZE if self.tiny else PRETRAINED_LATENT_SIZE

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)


class DiffusersLoadError(OSError):
    """A transformer or LoRA file that cannot be loaded; the message names it and the fix."""


def _diffusers() -> Any:
    try:
        import diffusers
        import peft  # noqa: F401  (add_adapter needs it)
    except ImportError as error:
        raise ImportError(
            f"the diffusers adapter needs diffusers and peft ({error.name} is missing): "
            "pip install 'diffusers>=0.42.1,<0.43' 'peft>=0.21.2,<0.22'"
        ) from None
    return diffusers


@dataclass(frozen=True)
class PromptEmbeddings:
    """Encoded prompts, the ``cond`` of a diffusers policy; rows index like a tensor (``cond[rows]``).

    ``embeds`` (B, L, D): the text encoder's hidden states (T5/CLIP for SD3 and FLUX, Qwen2.5-VL for
    Qwen-Image); ``pooled`` (B, P): the pooled CLIP vector that SD3 and FLUX need; ``mask`` (B, L)
    bool, True = a real token, used by Qwen-Image (SD3 and FLUX attend to their padding embeddings,
    as their pipelines do).
    """

    embeds: torch.Tensor
    pooled: torch.Tensor | None = None
    mask: torch.Tensor | None = None

    def __post_init__(self) -> None:
        batch = self.embeds.shape[0]
        if self.embeds.dim() != 3:
            raise ValueError(f"embeds must be (B, L, D) (got shape {tuple(self.embeds.shape)})")
        if self.pooled is not None and (self.pooled.dim() != 2 or self.pooled.shape[0] != batch):
            raise ValueError(f"pooled must be (B, P) with B = {batch} (got shape {tuple(self.pooled.shape)})")
        if self.mask is not None and tuple(self.mask.shape) != tuple(self.embeds.shape[:2]):
            raise ValueError(
                f"mask must be (B, L) = {tuple(self.embeds.shape[:2])} like embeds (got {tuple(self.mask.shape)})"
            )

    def __len__(self) -> int:
        return self.embeds.shape[0]

    def __getitem__(self, rows: slice | Sequence[int] | torch.Tensor | int) -> PromptEmbeddings:
        """The embeddings of ``rows``; an int keeps the batch dimension (a batch of one)."""
        if isinstance(rows, int):
            rows = slice(rows, rows + 1 if rows != -1 else None)
        return PromptEmbeddings(
            embeds=self.embeds[rows],
            pooled=None if self.pooled is None else self.pooled[rows],
            mask=None if self.mask is None else self.mask[rows],
        )

    def to(self, device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> PromptEmbeddings:
        """A copy on ``device`` with floating tensors in ``dtype`` (the mask stays bool)."""
        return PromptEmbeddings(
            embeds=self.embeds.to(device=device, dtype=dtype),
            pooled=None if self.pooled is None else self.pooled.to(device=device, dtype=dtype),
            mask=None if self.mask is None else self.mask.to(device=device, dtype=torch.bool),
        )


def pack_latents(x: torch.Tensor) -> torch.Tensor:
    """(B, C, H, W) -> (B, H/2 * W/2, 4C): one token per 2x2 patch, channel-major (FLUX / Qwen-Image layout)."""
    batch, channels, height, width = x.shape
    if height % 2 or width % 2:
        raise ValueError(f"latent height and width must be even to pack 2x2 patches (got {height}x{width})")
    patches = x.view(batch, channels, height // 2, 2, width // 2, 2).permute(0, 2, 4, 1, 3, 5)
    return patches.reshape(batch, (height // 2) * (width // 2), channels * 4)


def unpack_latents(tokens: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """Inverse of :func:`pack_latents`: (B, H/2 * W/2, 4C) -> (B, C, H, W)."""
    batch, _, features = tokens.shape
    patches = tokens.view(batch, height // 2, width // 2, features // 4, 2, 2).permute(0, 3, 1, 4, 2, 5)
    return patches.reshape(batch, features // 4, height, width)


def latent_image_ids(grid_height: int, grid_width: int, device: torch.device | None = None) -> torch.Tensor:
    """FLUX's RoPE positions of the packed image tokens, (h*w, 3) = (0, row, column) in row-major order."""
    rows, columns = torch.meshgrid(torch.arange(grid_height), torch.arange(grid_width), indexing="ij")
    ids = torch.stack([torch.zeros_like(rows), rows, columns], dim=-1).reshape(-1, 3)
    return ids.to(device=device, dtype=torch.float32)


def latent_channels(family: Family, transformer: nn.Module) -> int:
    """The channels C of the (B, C, H, W) latents a transformer of ``family`` denoises."""
    config = transformer.config
    if family == "sd3":
        return int(config.in_channels)
    if config.in_channels % 4:
        raise ValueError(f"{family} in_channels must be 4 x latent channels (packed 2x2), got {config.in_channels}")
    return int(config.in_channels) // 4


def transformer_velocity(
    transformer: nn.Module,
    family: Family,
    x: torch.Tensor,
    sigma: torch.Tensor,
    cond: PromptEmbeddings,
    guidance_scale: float = 3.5,
) -> torch.Tensor:
    """Velocity (B, C, H, W) of a diffusers transformer of ``family`` at latents x (B, C, H, W), sigma (B,).

    The policy interface without LoRA: the transformer runs in its own dtype, the result comes back
    in ``x``'s dtype. The timestep goes in as float32, as SD3's pipeline passes it (1000 * sigma in
    bfloat16 would be rounded to steps of 4-8); FLUX and Qwen-Image cast it to their dtype inside.
    """
    model_dtype = next(transformer.parameters()).dtype
    batch, _, height, width = x.shape
    if len(cond) != batch:
        raise ValueError(f"got {len(cond)} prompt embeddings for {batch} latents: pass one row per latent")
    cond = cond.to(device=x.device, dtype=model_dtype)
    sigma = sigma.to(device=x.device, dtype=torch.float32).expand(batch)
    if family in ("sd3", "flux") and cond.pooled is None:
        raise ValueError(f"{family} needs pooled prompt embeddings (PromptEmbeddings.pooled, (B, P)): "
                         "take them from the pipeline's encode_prompt")
    if family == "sd3":
        out = transformer(hidden_states=x.to(model_dtype), encoder_hidden_states=cond.embeds,
                          pooled_projections=cond.pooled, timestep=1000.0 * sigma, return_dict=False)[0]
        return out.to(x.dtype)
    tokens = pack_latents(x.to(model_dtype))
    if family == "flux":
        guidance = None
        if transformer.config.guidance_embeds:
            guidance = torch.full((batch,), guidance_scale, dtype=torch.float32, device=x.device)
        text_ids = torch.zeros(cond.embeds.shape[1], 3, device=x.device)
        out = transformer(hidden_states=tokens, encoder_hidden_states=cond.embeds, pooled_projections=cond.pooled,
                          timestep=sigma, img_ids=latent_image_ids(height // 2, width // 2, x.device),
                          txt_ids=text_ids, guidance=guidance, return_dict=False)[0]
    else:
        img_shapes = [[(1, height // 2, width // 2)]] * batch
        out = transformer(hidden_states=tokens, encoder_hidden_states=cond.embeds,
                          encoder_hidden_states_mask=cond.mask, timestep=sigma, img_shapes=img_shapes,
                          return_dict=False)[0]
    return unpack_latents(out, height, width).to(x.dtype)


def build_tiny_transformer(family: Family, overrides: dict[str, Any] | None = None) -> ModelMixin:
    """A randomly initialised transformer of ``family`` from ``TINY_CONFIGS`` (no download), float32.

    Initialisation draws from torch's global RNG: seed it (``torch.manual_seed``) for a reproducible model.
    """
    diffusers = _diffusers()
    cls = getattr(diffusers, TRANSFORMER_CLASSES[family])
    arguments = {**TINY_CONFIGS[family], **(overrides or {})}
    try:
        return cls(**arguments)
    except TypeError as error:
        raise ValueError(f"tiny_overrides for {family} do not fit {cls.__name__} ({error})") from None


def _looks_like_path(name: str) -> bool:
    """A Hub id is ``name`` or ``org/name``; anything with more parts or a path prefix is a folder."""
    return name.startswith(("/", ".", "~")) or name.count("/") > 1 or os.sep != "/" and os.sep in name


def load_transformer(family: Family, path_or_id: str, dtype: torch.dtype = torch.bfloat16) -> ModelMixin:
    """The transformer of a diffusers pipeline folder (its ``transformer/``), a transformer folder, or a Hub id.

    A local folder never touches the network. A Hub id is downloaded when the Hub is reachable;
    otherwise the error says to download it elsewhere and pass the folder.
    """
    diffusers = _diffusers()
    cls = getattr(diffusers, TRANSFORMER_CLASSES[family])
    folder = Path(path_or_id).expanduser()
    if folder.is_dir():
        transformer_folder = folder / "transformer" if (folder / "transformer").is_dir() else folder
        config_path = transformer_folder / "config.json"
        if not config_path.is_file():
            raise DiffusersLoadError(
                f"{folder} has neither transformer/config.json nor config.json: pass a diffusers pipeline folder "
                f"or its transformer/ folder"
            )
        stored_class = json.loads(config_path.read_text()).get("_class_name", cls.__name__)
        if stored_class != cls.__name__:  # diffusers would fail later on a weight shape, naming no family
            families = {name: family for family, name in TRANSFORMER_CLASSES.items()}
            fix = f"set family: {families[stored_class]}" if stored_class in families else "pass another folder"
            raise DiffusersLoadError(f"{config_path} describes a {stored_class}, not the {cls.__name__} of family "
                                     f"{family}: {fix}")
        return cls.from_pretrained(str(transformer_folder), torch_dtype=dtype)
    if _looks_like_path(path_or_id):
        raise DiffusersLoadError(
            f"cannot load {path_or_id!r}: no such folder; pass an existing diffusers pipeline folder or a Hub id"
        )
    try:
        return cls.from_pretrained(path_or_id, subfolder="transformer", torch_dtype=dtype)
    except OSError as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise DiffusersLoadError(
            f"cannot load {path_or_id!r}: no local folder and the Hub is unreachable or did not serve it "
            f"({reason}); download it on a machine with access and pass the local folder"
        ) from None


class JointAttentionProcessor:
    """A diffusers attention processor that sends the joint attention of SD3, FLUX and Qwen-Image
    blocks through a Spotlight ``AttentionFn`` (q, k, v: (B, H, N, Dh); key_padding_mask: (B, N)).

    It keeps each family's projections, QK-norms, rotary embeddings and token order (SD3 puts the
    image tokens first, FLUX and Qwen-Image the text tokens), so with ``sdpa_attention`` it computes
    what diffusers' own processor computes. Qwen-Image's text mask becomes the key padding mask.
    """

    def __init__(self, family: Family, attention_fn: AttentionFn) -> None:
        self.family = family
        self.attention_fn = attention_fn

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
            image_mask = torch.ones(hidden_states.shape[0], image_tokens, dtype=torch.bool,
                                    device=hidden_states.device)
            key_padding_mask = torch.cat([encoder_hidden_states_mask.to(torch.bool), image_mask], dim=1)
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


class DiffusersPolicy(nn.Module):
    """A diffusers transformer with a LoRA adapter: ``forward(x, sigma, cond) -> velocity`` like TinyDiT.

    Only the LoRA weights are trainable, in float32 over a base of ``config.dtype``. ``reference()``
    is the frozen base model (the adapter disabled), for the KL term of the GRPO update.
    """

    def __init__(self, transformer: ModelMixin, config: DiffusersPolicyConfig) -> None:
        super().__init__()
        from peft import LoraConfig

        self.config = config
        self.family: Family = config.family
        self.transformer = transformer
        self._default_processors = dict(transformer.attn_processors)
        self._attention_fn: AttentionFn | None = None
        transformer.requires_grad_(False)
        lora = LoraConfig(r=config.lora_rank, lora_alpha=config.lora_alpha,
                          target_modules=list(config.target_modules), init_lora_weights=True)
        try:
            transformer.add_adapter(lora, adapter_name=ADAPTER_NAME)
        except ValueError as error:
            raise ValueError(
                f"lora_target_modules {list(config.target_modules)} match no layer of {type(transformer).__name__} "
                f"({str(error).splitlines()[0]}): name Linear layers such as attn.to_q"
            ) from None
        # LoRA trains in float32 whatever the base dtype: Adam's small updates vanish in bfloat16
        # weights. peft casts each LoRA input to the LoRA dtype and the sum back to the base dtype.
        for parameter in self.trainable_parameters():
            parameter.data = parameter.data.float()
        self.channels = latent_channels(self.family, transformer)

    @classmethod
    def from_config(cls, config: DiffusersPolicyConfig) -> DiffusersPolicy:
        """Build the transformer (tiny and random, or loaded) in ``config.dtype`` and add the LoRA adapter."""
        if config.tiny:
            transformer = build_tiny_transformer(config.family, config.tiny_overrides)
            if config.torch_dtype != torch.float32:
                transformer = transformer.to(config.torch_dtype)
        else:
            transformer = load_transformer(config.family, config.pretrained or "", config.torch_dtype)
        return cls(transformer, config)

    @classmethod
    def from_pretrained(cls, path_or_id: str, family: Family, **fields: Any) -> DiffusersPolicy:
        """``from_config`` for a local diffusers folder or Hub id; ``fields`` are other config fields."""
        return cls.from_config(DiffusersPolicyConfig(family=family, pretrained=path_or_id, **fields))

    @property
    def latent_shape(self) -> tuple[int, int, int]:
        """(C, H, W) of the latents this policy samples, for ``spotlight.diffusion.sampler.sample``."""
        size = self.config.resolved_latent_size
        return (self.channels, size, size)

    @property
    def prompt_dims(self) -> tuple[int, int | None]:
        """(D, P): the width of the prompt embeddings and of the pooled vector (None when unused)."""
        config = self.transformer.config
        pooled = None if self.family == "qwen-image" else int(config.pooled_projection_dim)
        return int(config.joint_attention_dim), pooled

    def forward(self, x: torch.Tensor, sigma: torch.Tensor, cond: PromptEmbeddings) -> torch.Tensor:
        """Predict the velocity (B, C, H, W) for latents x (B, C, H, W) at noise levels sigma (B,)."""
        return transformer_velocity(self.transformer, self.family, x, sigma, cond, self.config.guidance_scale)

    # --- the reference policy -------------------------------------------------------------------

    @contextlib.contextmanager
    def adapter_disabled(self) -> Iterator[None]:
        """Run the base model inside the block; requires_grad of the LoRA weights is restored after.

        (peft's enable/disable also toggles requires_grad, which would otherwise make a frozen adapter
        trainable again.)
        """
        flags = {name: parameter.requires_grad for name, parameter in self.named_parameters() if "lora_" in name}
        self.transformer.disable_adapters()
        try:
            yield
        finally:
            self.transformer.enable_adapters()
            for name, parameter in self.named_parameters():
                if name in flags:
                    parameter.requires_grad_(flags[name])

    def reference(self) -> ReferencePolicy:
        """The reference policy for the KL term: this model with the adapter disabled (shares weights)."""
        return ReferencePolicy(self)

    # --- LoRA weights ---------------------------------------------------------------------------

    def trainable_parameters(self) -> list[nn.Parameter]:
        """The parameters an optimizer should step: the LoRA A and B matrices, nothing of the base."""
        return [parameter for parameter in self.parameters() if parameter.requires_grad]

    def lora_state_dict(self) -> dict[str, torch.Tensor]:
        """The LoRA tensors in peft's adapter-name-free key format, detached CPU copies."""
        from peft import get_peft_model_state_dict

        state = get_peft_model_state_dict(self.transformer, adapter_name=ADAPTER_NAME)
        return {name: tensor.detach().cpu().contiguous().clone() for name, tensor in state.items()}

    def load_lora_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Copy LoRA tensors (as from :meth:`lora_state_dict`) into the adapter; keys and shapes must match."""
        from peft import set_peft_model_state_dict

        expected = {name: tuple(tensor.shape) for name, tensor in self.lora_state_dict().items()}
        given = {name: tuple(tensor.shape) for name, tensor in state.items()}
        if expected != given:
            missing, extra = sorted(set(expected) - set(given)), sorted(set(given) - set(expected))
            shapes = sorted(n for n in set(expected) & set(given) if expected[n] != given[n])
            first = (missing or extra or shapes)[0]
            raise ValueError(
                f"LoRA weights do not fit this policy ({len(missing)} missing, {len(extra)} unexpected, "
                f"{len(shapes)} of another shape, e.g. {first}): build the policy with the family, "
                f"lora_rank and lora_target_modules the weights were trained with"
            )
        result = set_peft_model_state_dict(self.transformer, state, adapter_name=ADAPTER_NAME)
        if result.unexpected_keys:
            raise ValueError(f"peft did not place LoRA weights {result.unexpected_keys[:3]}: report this as a bug")

    def lora_metadata(self) -> dict[str, str]:
        """What a LoRA file records about the policy it fits (safetensors metadata is str -> str)."""
        return {
            "format": LORA_FORMAT,
            "family": self.family,
            "lora_rank": str(self.config.lora_rank),
            "lora_alpha": str(self.config.lora_alpha),
            "lora_target_modules": json.dumps(list(self.config.target_modules)),
        }

    def save_lora(self, path: str | Path) -> Path:
        """Write the LoRA weights to one safetensors file, atomically (temp file + rename); returns the path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, staging = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        os.close(handle)
        try:
            save_file(self.lora_state_dict(), staging, metadata=self.lora_metadata())
            os.replace(staging, path)
        finally:
            if os.path.exists(staging):
                os.remove(staging)
        return path

    def load_lora(self, path: str | Path) -> None:
        """Load LoRA weights written by :meth:`save_lora`, refusing a file made for another policy shape."""
        path = Path(path)
        if not path.is_file():
            raise DiffusersLoadError(f"LoRA file {path} does not exist: pass a file written by save_lora")
        try:
            with safe_open(str(path), framework="pt") as handle:
                metadata = handle.metadata() or {}
                state = {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118
        except (OSError, ValueError, RuntimeError) as error:
            raise DiffusersLoadError(f"LoRA file {path} is unreadable ({type(error).__name__}: {error})") from None
        mine = self.lora_metadata()
        for field in ("family", "lora_rank", "lora_alpha", "lora_target_modules"):
            if field in metadata and metadata[field] != mine[field]:
                raise ValueError(
                    f"LoRA file {path} was trained with {field}={metadata[field]} but this policy has "
                    f"{field}={mine[field]}: build the policy with {field}={metadata[field]}"
                )
        self.load_lora_state_dict(state)

    # --- attention routing (sequence parallelism) -----------------------------------------------

    @property
    def attention_fn(self) -> AttentionFn | None:
        """The ``AttentionFn`` the joint attention runs through; None = diffusers' own processors."""
        return self._attention_fn

    @attention_fn.setter
    def attention_fn(self, attention_fn: AttentionFn | None) -> None:
        self._attention_fn = attention_fn
        if attention_fn is None:
            self.transformer.set_attn_processor(copy.copy(self._default_processors))
        else:
            self.transformer.set_attn_processor(JointAttentionProcessor(self.family, attention_fn))


class ReferencePolicy:
    """The base model of a :class:`DiffusersPolicy`: calls it with the adapter disabled.

    Not an ``nn.Module`` on purpose: it shares every weight with the policy and must not show up as
    a second copy in a state dict or an optimizer.
    """

    def __init__(self, policy: DiffusersPolicy) -> None:
        self.policy = policy

    def __call__(self, x: torch.Tensor, sigma: torch.Tensor, cond: PromptEmbeddings) -> torch.Tensor:
        """Velocity (B, C, H, W) of the base model."""
        with self.policy.adapter_disabled():
            return self.policy(x, sigma, cond)
