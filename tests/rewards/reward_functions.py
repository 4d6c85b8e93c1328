"""User reward functions of the kind `reward.name: pkg.module:function` names (real, tiny)."""

import torch


def brightness(images: torch.Tensor, prompts: list[str], metadata: list[dict]) -> list[float]:
    """The mean pixel of each image, plus 1 when the metadata says so: reads all three arguments."""
    return [float(image.mean()) + float(record.get("bonus", 0)) for image, record in zip(images, metadata, strict=True)]


def one_short(images: torch.Tensor, prompts: list[str], metadata: list[dict]) -> list[float]:
    """One score too few: the bug the registry must name."""
    return [0.5] * (len(prompts) - 1)


NOT_A_FUNCTION = 3
