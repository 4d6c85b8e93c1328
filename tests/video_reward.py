"""Function rewards (``reward.name: video_reward:<name>``) for the video tests: they need no model.

Each checks that it receives the videos themselves, (N, F, 3, H, W) in [0, 1], as the issue asks of a
function reward, and records the shape it saw so a test can look.
"""

from __future__ import annotations

import torch

SEEN: list[tuple[int, ...]] = []


def brightness(images: torch.Tensor, prompts: list[str], metadata: list[dict]) -> torch.Tensor:
    """Each video's mean pixel value."""
    if images.dim() != 5 or images.shape[2] != 3 or images.shape[0] != len(prompts):
        raise ValueError(f"expected videos (N, F, 3, H, W) for {len(prompts)} prompts, got {tuple(images.shape)}")
    SEEN.append(tuple(images.shape))
    return images.flatten(1).mean(dim=1)
