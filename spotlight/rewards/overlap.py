"""Sampling a rollout chunk by chunk and handing each finished chunk to an overlapped reward (`reward.overlap`).

The sampler is passed in (`sample_chunk`), so this module knows nothing of models: it only decides
the chunks (whole groups, so a group's samples are scored together) and when each is handed over.
With a reward that cannot prefetch, the rollout is sampled in one call, as without overlap.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from spotlight.diffusion.sampler import Trajectory
from spotlight.rewards.base import Metadata, Reward


def sample_and_prefetch(prompts: Sequence[str], group_size: int, groups_per_chunk: int,
                        sample_chunk: Callable[[slice], Trajectory], to_images: Callable[[torch.Tensor], torch.Tensor],
                        reward: Reward, metadata: Sequence[Metadata] | None = None) -> Trajectory:
    """The whole rollout's trajectory (samples in `prompts` order), each chunk of `groups_per_chunk` groups
    handed to `reward.prefetch` as soon as it is sampled, so that scoring overlaps the next chunk (with the chunk's
    final latents as its key where the reward takes one: `BackgroundReward.collect` then needs no second decode)."""
    prefetch = getattr(reward, "prefetch", None)
    if prefetch is None:
        return sample_chunk(slice(0, len(prompts)))
    step = group_size * groups_per_chunk
    takes_key = callable(getattr(reward, "collect", None))
    parts = []
    for start in range(0, len(prompts), step):
        part = sample_chunk(slice(start, start + step))
        chunk_metadata = None if metadata is None else metadata[start : start + step]
        if takes_key:
            prefetch(to_images(part.final), prompts[start : start + step], chunk_metadata, key=part.final)
        else:
            prefetch(to_images(part.final), prompts[start : start + step], chunk_metadata)
        parts.append(part)
    return Trajectory(latents=torch.cat([p.latents for p in parts]), log_probs=torch.cat([p.log_probs for p in parts]),
                      start_step=parts[0].start_step)
