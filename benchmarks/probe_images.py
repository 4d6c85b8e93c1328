"""Images that hold no answer to any prompt: what a reward must score near zero (its noise floor)."""

from __future__ import annotations

import torch


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
