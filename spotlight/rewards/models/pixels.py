"""CLIP-style preprocessing on the reward's device: resize the short side, centre-crop, normalise.

The policy's images are already float tensors on its device; sending them through a PIL processor would
copy each batch to the host and back. This does the same steps as CLIP's processors in torch: bicubic
resize of the shorter side (antialiased, like PIL's), a centre crop, then (x - mean) / std. PIL rounds
to uint8 and its bicubic kernel differs slightly, so scores agree with the authors' PIL pipelines to
about 1e-2 of a unit-norm cosine, not bit for bit; an image already at the crop size is not resampled.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)  # the mean and std every CLIP release here uses
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


def clip_pixels(images: torch.Tensor, size: int, mean: Sequence[float] = OPENAI_CLIP_MEAN,
                std: Sequence[float] = OPENAI_CLIP_STD, device: str | torch.device = "cpu",
                dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Images (B, 3, H, W) in [0, 1] -> normalised (B, 3, size, size) on `device` in `dtype`."""
    if images.dim() != 4 or images.shape[1] != 3:
        raise ValueError(f"expected images (B, 3, H, W) (got shape {tuple(images.shape)})")
    x = images.to(device=device, dtype=torch.float32)
    height, width = x.shape[-2:]
    if min(height, width) != size:
        scale = size / min(height, width)
        height, width = max(size, round(height * scale)), max(size, round(width * scale))
        x = torch.nn.functional.interpolate(x, size=(height, width), mode="bicubic", antialias=True,
                                            align_corners=False).clamp(0, 1)
    top, left = (height - size) // 2, (width - size) // 2
    x = x[..., top : top + size, left : left + size]
    mean_t = torch.tensor(mean, device=x.device).view(1, 3, 1, 1)
    std_t = torch.tensor(std, device=x.device).view(1, 3, 1, 1)
    return ((x - mean_t) / std_t).to(dtype)


def reward_dtype(device: str) -> torch.dtype:
    """bf16 for a backbone on CUDA (what these models run in on a GPU), float32 elsewhere."""
    return torch.bfloat16 if str(device).startswith("cuda") else torch.float32
