"""User reward functions that hang or are slow, for the deadline tests (imported by `pkg.module:function` name)."""

from __future__ import annotations

import time

import torch


def hangs(images: torch.Tensor, prompts: list[str], metadata: list[dict]) -> torch.Tensor:
    """A reward stuck in user code (a lock never released, a server called without a timeout)."""
    time.sleep(3600)
    return images.mean(dim=(1, 2, 3))


def prompt_length(images: torch.Tensor, prompts: list[str], metadata: list[dict]) -> torch.Tensor:
    """Answers at once: the prompt's length."""
    return torch.tensor([float(len(prompt)) for prompt in prompts])
