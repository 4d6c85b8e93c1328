"""A reward bound to a dataset's metadata, so every caller scores with (images, prompts) alone.

Prompts travel as strings through the loop, the Ray devices, the generators and validation, and each
of them scores with ``guarded_score(reward, images, prompts)``. A reward that judges a prompt by its
metadata record (GenEval's objects, counts, colours) gets that record here, looked up by the prompt's
text in the run's dataset, instead of every caller carrying a metadata list beside its prompts. The
binding is a small picklable object (the dataset's lookup table travels with it to Ray devices).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from spotlight.data.prompt_dataset import DatasetError, PromptDataset
from spotlight.rewards.base import Reward, RewardOutput, call_score, uses_metadata


class MetadataBoundReward:
    """``reward`` with each prompt's metadata record from ``dataset`` passed on; other attributes are the reward's."""

    uses_metadata = False  # it supplies the metadata itself

    def __init__(self, reward: Reward, dataset: PromptDataset) -> None:
        self.reward, self.dataset = reward, dataset
        self.name = reward.name

    def score(self, images: torch.Tensor, prompts: Sequence[str]) -> RewardOutput:
        """The reward's output for (images, prompts), with the prompts' records as its metadata."""
        return call_score(self.reward, images, prompts, self.dataset.metadata_for(prompts))

    def __getattr__(self, name: str) -> Any:  # has_strict, device, ...: what callers ask of the reward
        if name in ("reward", "dataset"):  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.reward, name)


def bind_metadata(reward: Reward, dataset: PromptDataset) -> Reward:
    """``reward`` itself when it reads no metadata, else bound to ``dataset``'s records.

    A reward that requires metadata (``requires_metadata``, e.g. GenEval) with a dataset that has none
    is refused here, at start-up, rather than at the first rollout.
    """
    if not uses_metadata(reward):
        return reward
    if getattr(reward, "requires_metadata", True) and not dataset.has_metadata:
        raise DatasetError(f"reward {reward.name!r} judges each prompt by its metadata, but dataset {dataset.name} "
                           "has none: use a dataset folder with train_metadata.jsonl / test_metadata.jsonl "
                           "(e.g. data.dataset=geneval), or another reward")
    return MetadataBoundReward(reward, dataset)
