"""A reward of decoded images that needs no model: their mean pixel value, with no strict flag.

Shared by the pipeline-folder tests, which only need a reward every sample earns differently.
"""

from __future__ import annotations

import torch

from spotlight.rewards.base import RewardOutput


class Brightness:
    """Mean pixel value of each image in [0, 1]; never strict, always valid."""

    name = "brightness"

    def score(self, images: torch.Tensor, prompts) -> RewardOutput:
        count = len(prompts)
        return RewardOutput(rewards=images.mean(dim=(1, 2, 3)), strict=torch.zeros(count, dtype=torch.bool),
                            valid=torch.ones(count, dtype=torch.bool))
