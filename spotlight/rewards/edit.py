"""Rewards for instruction-based edits: follow the instruction, keep the rest of the source image.

An edit dataset's row carries its source image (``metadata["image"]``, an absolute path, and the
instruction as ``metadata["instruction"]``; `spotlight.data.prompt_dataset.edit_row`), so an edit reward
is a metadata reward. Two built-ins:

- ``edit-preserve``: source preservation alone, ``1 - mean |edit - source|`` over pixels in [0, 1] (1: the
  source unchanged); no model, so it runs anywhere (it rewards doing nothing, so train on it only beside
  an instruction score, or to test a run's plumbing);
- ``edit``: ``weight * CLIPScore(edit, instruction) + (1 - weight) * preservation`` with ``weight`` 0.5
  and CLIP from ``reward.models.clip``: the instruction score alone is maximised by a new image that
  ignores the source, preservation alone by the source itself; their sum by an edit. Both terms are
  logged on its own.

A user's function reward gets the same source images: `source_images(metadata, size)`, or the
``source_image`` tensor `spotlight.rewards.function` puts in each edit row's record.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import torch
import torch.nn.functional as F

from spotlight.rewards.base import Metadata, Reward, RewardContractError, RewardOutput

__all__ = ["EditReward", "load_source_image", "preservation", "source_images"]

DEFAULT_WEIGHT = 0.5


@lru_cache(maxsize=1024)
def load_source_image(path: str) -> torch.Tensor:
    """The image at ``path`` as float (3, H, W) in [0, 1] (read once per process and kept: rows repeat)."""
    import numpy as np
    from PIL import Image

    try:
        with Image.open(path) as image:
            array = np.asarray(image.convert("RGB"), dtype=np.float32) / 255.0
    except OSError as error:
        raise RewardContractError(f"edit source image {path} cannot be read ({error}): check the dataset row's "
                                  "\"image\"") from None
    return torch.from_numpy(array).permute(2, 0, 1).contiguous()


def source_images(metadata: Sequence[Metadata] | None, size: tuple[int, int]) -> torch.Tensor:
    """The rows' source images (B, 3, H, W) in [0, 1] at ``size`` (bilinear, as the edits are compared)."""
    if metadata is None or any(not isinstance(record.get("image"), str) for record in metadata):
        raise RewardContractError("an edit reward needs each row's source image (metadata \"image\"): train on an "
                                  "edit dataset (rows with \"prompt\" and \"image\", e.g. data.dataset shapes-edit)")
    images = [load_source_image(str(record["image"])) for record in metadata]
    return torch.stack([F.interpolate(image[None], size=size, mode="bilinear", align_corners=False)[0]
                        if tuple(image.shape[-2:]) != tuple(size) else image for image in images])


def preservation(images: torch.Tensor, prompts: Sequence[str], metadata: Sequence[Metadata]) -> torch.Tensor:
    """``1 - mean |image - source|`` per image, in [0, 1]; also a function reward
    (``reward.name: spotlight.rewards.edit:preservation``)."""
    del prompts
    sources = source_images(metadata, tuple(images.shape[-2:]))
    return 1.0 - (images.float().cpu() - sources).abs().flatten(1).mean(dim=1)


class EditReward:
    """``weight * instruction score + (1 - weight) * preservation``; ``instruction`` None: preservation alone."""

    uses_metadata = True
    requires_metadata = True
    has_strict = False

    def __init__(self, instruction: Reward | None = None, weight: float = DEFAULT_WEIGHT) -> None:
        if not 0.0 <= weight <= 1.0:
            raise ValueError(f"the edit reward's instruction weight must be in [0, 1] (got {weight})")
        self.instruction = instruction
        self.weight = weight if instruction is not None else 0.0
        self.name = "edit" if instruction is not None else "edit-preserve"

    def score(self, images: torch.Tensor, prompts: Sequence[str],
              metadata: Sequence[Metadata] | None = None) -> RewardOutput:
        from spotlight.rewards.base import call_score

        batch = len(prompts)
        keep = preservation(images, prompts, metadata or [])
        valid = torch.ones(batch, dtype=torch.bool)
        if self.instruction is None:
            return RewardOutput(keep, torch.zeros(batch, dtype=torch.bool), valid)
        assert metadata is not None  # preservation refused a batch without it
        instructions = [str(record.get("instruction") or prompt) for record, prompt in zip(metadata, prompts,
                                                                                              strict=True)]
        follow = call_score(self.instruction, images, instructions, metadata)
        rewards = self.weight * follow.rewards + (1.0 - self.weight) * keep
        return RewardOutput(torch.where(follow.valid, rewards, 0.0), torch.zeros(batch, dtype=torch.bool),
                            follow.valid, errors=follow.errors,
                            terms={self.instruction.name: follow.rewards, "preservation": keep})
