"""Classifier-free guidance: how each family combines its conditional and unconditional velocities.

Pure tensor maths, kept apart from the policy so a test can pin it against the pipelines' formulas.
SD3 (and FLUX without a guidance embedding) take ``u + s (c - u)``. Qwen-Image's pipeline then rescales
each packed token (a 2x2 latent patch, all channels) of the combination back to the norm of the
conditional prediction, which keeps high scales from blowing up the latents; it is done here in the
same packed layout so the numbers match. FLUX.1-dev is guidance-distilled: its scale is an input of
the transformer (``guidance``), not a second forward, and never reaches this module. A scale may be one
number or one per row (B,): Wan2.2's two experts each have their own (``guidance_scale_2``), and a batch's
rows pick theirs on the device by noise level, with nothing read back to the host.
"""

from __future__ import annotations

import torch

from spotlight.models.pipelines.family_config import Family
from spotlight.models.pipelines.inputs import pack_latents, unpack_latents

__all__ = ["guided_velocity", "uses_true_cfg"]


def uses_true_cfg(family: Family, guidance_scale: float, guidance_embeds: bool) -> bool:
    """Whether sampling at ``guidance_scale`` needs the unconditional branch (a second batch half).

    Scale 1 is the conditional model itself; a guidance-distilled FLUX takes the scale as an input.
    """
    return guidance_scale > 1.0 and not (family == "flux" and guidance_embeds)


def guided_velocity(family: Family, conditional: torch.Tensor, unconditional: torch.Tensor,
                    guidance_scale: float | torch.Tensor) -> torch.Tensor:
    """The guided velocity (B, C, H, W) from conditional and unconditional ones of the same shape; a tensor
    ``guidance_scale`` (B,) guides each row at its own scale."""
    if isinstance(guidance_scale, torch.Tensor):
        guidance_scale = guidance_scale.to(conditional.dtype).view(-1, *([1] * (conditional.dim() - 1)))
    combined = unconditional + guidance_scale * (conditional - unconditional)
    if family != "qwen-image":
        return combined
    height, width = combined.shape[-2:]
    packed, packed_conditional = pack_latents(combined), pack_latents(conditional)
    scale = torch.norm(packed_conditional, dim=-1, keepdim=True) / torch.norm(packed, dim=-1, keepdim=True)
    return unpack_latents(packed * scale, height, width)
