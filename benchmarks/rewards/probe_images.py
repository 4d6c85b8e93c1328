"""Probe images for a reward's benchmarks: degradations of rendered truth, and images with no answer.

A reward must stay right on truth that is blurred or noisy (as a generator's output is), and score
near zero on images that hold no answer to any prompt (its noise floor).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def empty_images(generator: torch.Generator, count: int, height: int, width: int) -> dict[str, torch.Tensor]:
    """Named batches (count, 3, height, width) in [0, 1]: noise of several kinds and flat colours.

    The untrained-generator batch is what a freshly initialised DiT decodes to, so a reward that
    scores it above zero would reward RL for learning nothing.
    """
    shape = (count, 3, height, width)
    return {
        "gaussian N(0,1) clamped": torch.randn(shape, generator=generator).clamp(0, 1),
        "untrained generator: (N(0,1)+1)/2": ((torch.randn(shape, generator=generator) + 1) / 2).clamp(0, 1),
        "uniform [0,1]": torch.rand(shape, generator=generator),
        "black": torch.zeros(shape),
        "grey 0.5": torch.full(shape, 0.5),
        "white": torch.ones(shape),
    }


def box_blur(images: torch.Tensor, width: int) -> torch.Tensor:
    """Mean over a width x width window, edges replicated; (B, 3, H, W) -> same."""
    pad = width // 2
    return F.avg_pool2d(F.pad(images, (pad, pad, pad, pad), mode="replicate"), width, stride=1)


def gaussian_blur(images: torch.Tensor, sigma: float) -> torch.Tensor:
    """Separable Gaussian blur with a 7-tap kernel, edges replicated; (B, 3, H, W) -> same."""
    taps = torch.arange(-3, 4, dtype=torch.float32)
    kernel = torch.exp(-(taps**2) / (2 * sigma**2))
    kernel = kernel / kernel.sum()
    rows = F.conv2d(F.pad(images, (3, 3, 0, 0), mode="replicate"), kernel.view(1, 1, 1, 7).repeat(3, 1, 1, 1),
                    groups=3)
    return F.conv2d(F.pad(rows, (0, 0, 3, 3), mode="replicate"), kernel.view(1, 1, 7, 1).repeat(3, 1, 1, 1),
                    groups=3)


def add_noise(images: torch.Tensor, sigma: float, generator: torch.Generator) -> torch.Tensor:
    """Gaussian pixel noise of std ``sigma``, clipped back to [0, 1]."""
    return (images + sigma * torch.randn(images.shape, generator=generator)).clamp(0, 1)
