"""A reward that disagrees with brightness on purpose, for the held-out reward test (``held_out_reward:darkness``)."""

from __future__ import annotations

import torch


def darkness(images: torch.Tensor, prompts: list[str], metadata: list[dict]) -> torch.Tensor:
    """One minus the mean pixel value: whatever brightness ranks first, this ranks last."""
    return 1.0 - images.mean(dim=(1, 2, 3))
