"""Group-relative advantages (GRPO): each sample is judged against the other samples of its prompt."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

import torch

StdMode = Literal["group", "global"]


def group_advantages(
    rewards: torch.Tensor,
    valid: torch.Tensor | None = None,
    std_mode: StdMode = "group",
    clip: float = 5.0,
    eps: float = 1e-4,
) -> torch.Tensor:
    """Advantages (P, G) from rewards (P, G) of P prompts with G samples each.

    ``(r - mean_group) / (std + eps)``, with the std taken per group (GRPO) or over the whole batch
    (``"global"``: keeps near-uniform groups from having their noise blown up to unit scale), then
    clipped to ``[-clip, clip]``. Samples marked invalid (a reward that failed) get advantage 0 and
    are left out of every mean and std, so one failed reward never skews its group.
    """
    if rewards.ndim != 2:
        raise ValueError(f"rewards must be (num_prompts, group_size), got shape {tuple(rewards.shape)}")
    valid = torch.isfinite(rewards) if valid is None else valid & torch.isfinite(rewards)
    weights = valid.to(rewards.dtype)
    clean = torch.where(valid, rewards, torch.zeros_like(rewards))
    counts = weights.sum(1, keepdim=True).clamp(min=1)
    mean = (clean * weights).sum(1, keepdim=True) / counts
    centred = (clean - mean) * weights
    if std_mode == "group":
        std = (centred.pow(2).sum(1, keepdim=True) / counts).sqrt()
    elif std_mode == "global":
        std = (centred.pow(2).sum() / weights.sum().clamp(min=1)).sqrt().expand_as(mean)
    else:
        raise ValueError(f"train.adv_std must be 'group' or 'global' (got {std_mode!r})")
    advantages = centred / (std + eps)
    return advantages.clamp(-clip, clip) * weights


def per_term_advantages(
    terms: Mapping[str, torch.Tensor],
    weights: Mapping[str, float],
    valid: torch.Tensor | None = None,
    std_mode: StdMode = "group",
    clip: float = 5.0,
) -> torch.Tensor:
    """Advantages (P, G) of a weighted mix of rewards, each term normalised on its own (`reward.normalize: per_term`).

    ``sum_k weight_k * group_advantages(term_k)``, clipped to ``[-clip, clip]``. With one joint normalisation
    of the weighted sum, the term of the widest spread within a group (HPS's ~100 x cosine beside a [0, 1]
    OCR score) decides the ranking whatever its weight; normalising each term first makes the weights say
    how much each term counts. Invalid samples get advantage 0, as in `group_advantages`.
    """
    missing = sorted(set(weights) - set(terms))
    if missing:
        raise ValueError(f"per-term advantages need every weighted term's rewards; missing {missing} of "
                         f"{sorted(terms)}")
    total = None
    for term, weight in weights.items():
        advantage = weight * group_advantages(terms[term], valid, std_mode, clip)
        total = advantage if total is None else total + advantage
    if total is None:
        raise ValueError("per-term advantages need at least one weighted term")
    return total.clamp(-clip, clip)
