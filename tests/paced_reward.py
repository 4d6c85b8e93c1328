"""Reward functions for the stop and invalid-sample tests (`pkg.module:function` rewards, imported by name).

``paced``: each image's mean pixel value after a pause of ``PACE_S`` seconds (environment; 0 by default), so
that a test can land a signal inside an iteration; with ``PACE_MARK`` set, it first creates that file, so a
test knows a call is under way. ``nan_first``: NaN for each batch's first image.
"""

from __future__ import annotations

import os
import time

import torch


def paced(images: torch.Tensor, prompts: list[str], metadata: list[dict]) -> torch.Tensor:
    """Mean pixel value per image, after ``PACE_S`` seconds."""
    if os.environ.get("PACE_MARK"):
        open(os.environ["PACE_MARK"], "a").close()
    time.sleep(float(os.environ.get("PACE_S", "0")))
    return images.mean(dim=(1, 2, 3))




def nan_first(images: torch.Tensor, prompts: list[str], metadata: list[dict]) -> torch.Tensor:
    """Mean pixel value, but NaN for the batch's first image: a sample the reward cannot score."""
    rewards = images.mean(dim=(1, 2, 3))
    rewards[0] = float("nan")
    return rewards
