"""What a diffusers transformer is handed: prompt embeddings, packed latents, RoPE ids and the timestep.

`transformer_velocity` is the one place that knows each family's calling convention (see the table
in `spotlight.models.pipelines.adapter`) and returns the velocity in Spotlight's convention.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn as nn

from spotlight.models.pipelines.family_config import Family


@dataclass(frozen=True)
class PromptEmbeddings:
    """Encoded prompts, the ``cond`` of a diffusers policy; rows index like a tensor (``cond[rows]``).

    ``embeds`` (B, L, D): the text encoder's hidden states (T5/CLIP for SD3 and FLUX, Qwen2.5-VL for
    Qwen-Image); ``pooled`` (B, P): the pooled CLIP vector that SD3 and FLUX need; ``mask`` (B, L)
    bool, True = a real token, used by Qwen-Image (SD3 and FLUX attend to their padding embeddings,
    as their pipelines do). ``image`` (B, C, h, w): an edit pipeline's condition image, as latents (the
    source image each row edits; `spotlight.models.editing`), None for text-to-image.
    """

    embeds: torch.Tensor
    pooled: torch.Tensor | None = None
    mask: torch.Tensor | None = None
    image: torch.Tensor | None = None

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
        if self.image is not None and (self.image.dim() != 4 or self.image.shape[0] != batch):
            raise ValueError(f"image must be (B, C, h, w) latents with B = {batch} (got {tuple(self.image.shape)})")

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
            image=None if self.image is None else self.image[rows],
        )

    def to(self, device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> PromptEmbeddings:
        """A copy on ``device`` with floating tensors in ``dtype`` (the mask stays bool)."""
        return PromptEmbeddings(
            embeds=self.embeds.to(device=device, dtype=dtype),
            pooled=None if self.pooled is None else self.pooled.to(device=device, dtype=dtype),
            mask=None if self.mask is None else self.mask.to(device=device, dtype=torch.bool),
            image=None if self.image is None else self.image.to(device=device, dtype=dtype),
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
    """FLUX's RoPE positions of the packed image tokens, (h*w, 3) = (0, row, column) in row-major order.

    Built once per grid and device, on that device, and kept: every FLUX forward needs them, and building
    them on the CPU and copying them over at each denoising step was a blocking host-to-device copy.
    Treat the result as read-only (it is shared by every forward at that grid).
    """
    device = torch.device("cpu") if device is None else torch.device(device)
    key = (grid_height, grid_width, device.type, device.index)
    ids = _LATENT_IMAGE_IDS.get(key)
    if ids is None:
        rows, columns = torch.meshgrid(torch.arange(grid_height, device=device, dtype=torch.float32),
                                       torch.arange(grid_width, device=device, dtype=torch.float32), indexing="ij")
        ids = torch.stack([torch.zeros_like(rows), rows, columns], dim=-1).reshape(-1, 3)
        _LATENT_IMAGE_IDS[key] = ids
    return ids


_LATENT_IMAGE_IDS: dict[tuple[int, int, str, int | None], torch.Tensor] = {}


def with_condition_tokens(tokens: torch.Tensor, ids: torch.Tensor,
                          image: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """FLUX.1 Kontext's input: the packed condition latents ``image`` (B, C, h', w') appended to the target's
    ``tokens`` along the sequence, and their RoPE ids (first channel 1, then row and column) after ``ids``."""
    grid_height, grid_width = image.shape[-2] // 2, image.shape[-1] // 2
    condition_ids = latent_image_ids(grid_height, grid_width, tokens.device).clone()
    condition_ids[:, 0] = 1.0
    return (torch.cat([tokens, pack_latents(image.to(tokens.dtype))], dim=1),
            torch.cat([ids, condition_ids], dim=0))


def moved_to(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``tensor`` on ``device``: itself, with no call at all, when it is there already (the loop's tensors are),
    else a (blocking) copy, as a caller's CPU tensors need."""
    here = tensor.device
    if here.type == device.type and (here.index or 0) == (device.index or 0):
        return tensor
    return tensor.to(device)


def latent_channels(family: Family, transformer: nn.Module) -> int:
    """The channels C of the (B, C, H, W) latents a transformer of ``family`` denoises."""
    return channels_of(family, int(transformer.config.in_channels))


def channels_of(family: Family, in_channels: int) -> int:
    """Latent channels C of a ``family`` transformer with ``in_channels`` (FLUX / Qwen-Image take 2x2-packed 4C)."""
    if family in ("sd3", "wan"):
        return in_channels
    if in_channels % 4:
        raise ValueError(f"{family} in_channels must be 4 x latent channels (packed 2x2), got {in_channels}")
    return in_channels // 4


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
    batch, (height, width) = x.shape[0], x.shape[-2:]  # a video family's latents are (B, C, f, h, w)
    if len(cond) != batch:
        raise ValueError(f"got {len(cond)} prompt embeddings for {batch} latents: pass one row per latent")
    cond = PromptEmbeddings(  # the loop's conditioning is on x's device already: a dtype cast at most
        embeds=moved_to(cond.embeds, x.device).to(dtype=model_dtype),
        pooled=None if cond.pooled is None else moved_to(cond.pooled, x.device).to(dtype=model_dtype),
        mask=None if cond.mask is None else moved_to(cond.mask, x.device),
        image=None if cond.image is None else moved_to(cond.image, x.device).to(dtype=model_dtype))
    if cond.image is not None and family not in ("flux", "qwen-image"):
        raise ValueError(f"a condition image (PromptEmbeddings.image) is an input of FLUX.1 Kontext and "
                         f"Qwen-Image-Edit; the {family} transformer takes none: drop it, or load an edit pipeline")
    sigma = moved_to(sigma, x.device).to(dtype=torch.float32).expand(batch)
    if family in ("sd3", "flux") and cond.pooled is None:
        raise ValueError(f"{family} needs pooled prompt embeddings (PromptEmbeddings.pooled, (B, P)): "
                         "take them from the pipeline's encode_prompt")
    if family == "wan":  # patchified inside; the timestep is WanPipeline's t = 1000 sigma (float32)
        out = transformer(hidden_states=x.to(model_dtype), encoder_hidden_states=cond.embeds,
                          timestep=1000.0 * sigma, return_dict=False)[0]
        return out.to(x.dtype)
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
        image_ids = latent_image_ids(height // 2, width // 2, x.device)
        if cond.image is not None:  # Kontext: the source image's tokens after the target's, their ids marked 1
            tokens, image_ids = with_condition_tokens(tokens, image_ids, cond.image)
        out = transformer(hidden_states=tokens, encoder_hidden_states=cond.embeds, pooled_projections=cond.pooled,
                          timestep=sigma, img_ids=image_ids, txt_ids=text_ids, guidance=guidance,
                          return_dict=False)[0][:, :(height // 2) * (width // 2)]
    else:
        img_shapes = [[(1, height // 2, width // 2)]] * batch
        if cond.image is not None:  # Qwen-Image-Edit: the source's tokens after the target's, a second image shape
            tokens = torch.cat([tokens, pack_latents(cond.image)], dim=1)
            img_shapes = [[(1, height // 2, width // 2), (1, cond.image.shape[-2] // 2, cond.image.shape[-1] // 2)]
                          ] * batch
        out = transformer(hidden_states=tokens, encoder_hidden_states=cond.embeds,
                          encoder_hidden_states_mask=cond.mask, timestep=sigma, img_shapes=img_shapes,
                          return_dict=False)[0][:, :(height // 2) * (width // 2)]
    return unpack_latents(out, height, width).to(x.dtype)

