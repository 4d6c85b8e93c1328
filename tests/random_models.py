"""Randomised TinyDiTs for tests: adaLN-Zero initialises every block to the identity, which would hide
a wrong attention, sampler or gradient path; random weights make every path carry signal."""

from __future__ import annotations

import torch

from spotlight.models.tinydit import TinyDiT, TinyDiTConfig
from spotlight.tasks.shapes import VOCAB

# The smallest TinyDiT that reads shapes prompts: 8x8 RGB, 2x2 patches of 4 px, one block.
TINY_SHAPES_CONFIG = TinyDiTConfig(image_size=8, in_channels=3, patch_size=4, dim=32, depth=1, num_heads=2,
                                   vocab_size=len(VOCAB), max_text_len=8)


def randomised_tinydit(config: TinyDiTConfig, seed: int, std: float, dtype: torch.dtype = torch.float32) -> TinyDiT:
    """A TinyDiT of ``config`` (in ``dtype``) with every parameter drawn from N(0, std²) after seeding ``seed``."""
    torch.manual_seed(seed)
    model = TinyDiT(config).to(dtype)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, std)
    return model.eval()
