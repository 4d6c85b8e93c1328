"""A user's reward function, named `pkg.module:function` in `reward.name`, as a `Reward`.

The function takes (images float (N, 3, H, W) in [0, 1], prompts: list[str], metadata: list[dict])
and returns N numbers (a list, a numpy array or a tensor). This is the shape flow_grpo's reward
functions have, so one written for it needs only its images converted. Metadata is a list of empty
dicts when the prompt dataset has none, so a function that ignores metadata runs on any dataset. An
edit dataset's record also holds its row's ``instruction`` and ``source_image`` (float (3, H, W) in [0, 1]).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from typing import Any

import torch

from spotlight.rewards.base import Metadata, RewardContractError, RewardError, RewardOutput


def load_object(path: str, what: str) -> Any:
    """The object `pkg.module:attribute` names; RewardError in one line if it cannot be imported."""
    module_name, _, attribute = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise RewardError(f"{what} {path!r}: cannot import {module_name!r} ({error}); install it or put it on "
                          "PYTHONPATH") from None
    if not hasattr(module, attribute):
        raise RewardError(f"{what} {path!r}: module {module_name!r} has no {attribute!r}; check the name")
    return getattr(module, attribute)


class FunctionReward:
    """`pkg.module:function` as a Reward; strict is never set (a plain score has no notion of 'correct')."""

    uses_metadata = True
    requires_metadata = False
    has_strict = False

    def __init__(self, path: str) -> None:
        function = load_object(path, "reward.name")
        if not callable(function):
            raise RewardError(f"reward.name {path!r} is a {type(function).__name__}, not a function of "
                              "(images, prompts, metadata)")
        self.name = path
        self.function: Callable[..., Any] = function

    def score(self, images: torch.Tensor, prompts: Sequence[str],
              metadata: Sequence[Metadata] | None = None) -> RewardOutput:
        records = [dict(record) for record in metadata] if metadata is not None else [{} for _ in prompts]
        for record in records:  # an edit row's source image (spotlight.rewards.edit), as float (3, H, W) in [0, 1]
            if isinstance(record.get("image"), str) and "instruction" in record:
                from spotlight.rewards.edit import load_source_image

                record["source_image"] = load_source_image(record["image"])
        raw = self.function(images, list(prompts), records)
        try:
            rewards = torch.as_tensor(raw if isinstance(raw, torch.Tensor) else list(raw),
                                      dtype=torch.float32).detach().cpu().reshape(-1)
        except (TypeError, ValueError) as error:
            raise RewardContractError(f"reward {self.name!r} returned {type(raw).__name__} ({error}); return "
                                      f"{len(prompts)} numbers, one per image") from None
        if rewards.shape != (len(prompts),):
            raise RewardContractError(f"reward {self.name!r} returned {rewards.numel()} scores for {len(prompts)} "
                                      "images; it must return one number per image")
        batch = len(prompts)
        return RewardOutput(rewards, torch.zeros(batch, dtype=torch.bool), torch.ones(batch, dtype=torch.bool))
