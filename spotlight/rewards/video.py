"""Rewards of videos (B, F, 3, H, W): an image reward applied per frame, and a temporal-consistency term.

A video pipeline (Wan) hands the reward its decoded videos as they are. An image reward (the built-ins)
judges each frame: all B x F frames go to it as one batch of images, each frame with its video's prompt
and metadata, and a video's reward is the mean of its frames' or, with ``reward.frames: min``, the worst
frame's (a video is as good as its worst frame). A video is valid, or strict, only when every frame is.
Images (B, 3, H, W) pass through untouched, so wrapping a reward changes nothing for image models.

What no per-frame score sees is whether the frames agree: ``temporal`` scores that, as one minus the
mean absolute change between consecutive frames (1 for a still video, lower for flicker), to be mixed
with a per-frame term through ``reward.weights`` (e.g. ``{pickscore: 1.0, temporal: 0.5}``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import torch

from spotlight.rewards.base import Metadata, Reward, RewardOutput, call_score, uses_metadata

__all__ = ["FrameReduce", "PerFrameReward", "TemporalConsistency", "per_frame"]

FrameReduce = Literal["mean", "min"]


def _reduce(values: torch.Tensor, how: FrameReduce) -> torch.Tensor:
    """(B, F) -> (B,) by ``how``."""
    return values.amin(dim=1) if how == "min" else values.mean(dim=1)


class PerFrameReward:
    """An image reward over every frame of a video, reduced per video (module docstring)."""

    def __init__(self, reward: Reward, reduce: FrameReduce = "mean") -> None:
        self.reward = reward
        self.reduce = reduce
        self.name = reward.name
        self.uses_metadata = uses_metadata(reward)
        self.requires_metadata = bool(getattr(reward, "requires_metadata", True))
        self.has_strict = bool(getattr(reward, "has_strict", True))

    def __getattr__(self, name: str) -> Any:  # anything else callers ask of the reward (image_size, ...)
        if name == "reward":
            raise AttributeError(name)
        return getattr(self.reward, name)

    def score(self, images: torch.Tensor, prompts: Sequence[str],
              metadata: Sequence[Metadata] | None = None) -> RewardOutput:
        if images.dim() != 5:
            return call_score(self.reward, images, prompts, metadata)
        videos, frames = images.shape[:2]
        frame_prompts = [prompt for prompt in prompts for _ in range(frames)]
        frame_metadata = None if metadata is None else [record for record in metadata for _ in range(frames)]
        out = call_score(self.reward, images.flatten(0, 1), frame_prompts, frame_metadata)
        valid = out.valid.view(videos, frames).all(dim=1)
        rewards = torch.where(valid, _reduce(out.rewards.view(videos, frames).float(), self.reduce), 0.0)
        terms = {term: _reduce(values.view(videos, frames).float(), self.reduce) for term, values in out.terms.items()}
        errors = [f"video {index // frames} frame {index % frames}: {line}" for index, line in enumerate(out.errors)]
        return RewardOutput(rewards, out.strict.view(videos, frames).all(dim=1) & valid, valid, errors, terms)

    def close(self) -> None:
        close = getattr(self.reward, "close", None)
        if callable(close):
            close()


class TemporalConsistency:
    """``1 - mean |frame[t + 1] - frame[t]|`` per video, in [0, 1]; an image (no frames to compare) scores 1."""

    name = "temporal"
    has_strict = False
    accepts_video = True

    def score(self, images: torch.Tensor, prompts: Sequence[str]) -> RewardOutput:
        batch = images.shape[0]
        if images.dim() == 5 and images.shape[1] > 1:
            change = (images[:, 1:].float() - images[:, :-1].float()).abs().flatten(1).mean(dim=1)
            rewards = (1.0 - change).cpu()
        else:
            rewards = torch.ones(batch)
        return RewardOutput(rewards, torch.zeros(batch, dtype=torch.bool), torch.ones(batch, dtype=torch.bool))


def per_frame(reward: Reward, reduce: FrameReduce) -> Reward:
    """``reward`` scoring videos frame by frame; a reward that judges videos itself (``accepts_video``) as it is."""
    return reward if getattr(reward, "accepts_video", False) else PerFrameReward(reward, reduce)
