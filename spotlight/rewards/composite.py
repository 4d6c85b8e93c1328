"""A weighted sum of rewards (`reward.weights`), each term kept for the logs.

Each term is scored through `guarded_score` on its own, so a term that fails on one sample marks that
sample invalid in the sum without hiding the other terms' values. The composite's `strict` is the
AND of the strict flags of the terms that define one (`has_strict`, default True): a preference
score has no notion of a correct image, and must not veto the OCR term's exact match.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from spotlight.rewards.base import Metadata, Reward, RewardOutput, guarded_score, uses_metadata


class CompositeReward:
    """sum_k weight_k * reward_k; `terms` of its output holds every reward_k unweighted."""

    uses_metadata = True
    requires_metadata = False

    def __init__(self, terms: dict[str, tuple[Reward, float]]) -> None:
        if not terms:
            raise ValueError("a composite reward needs at least one term")
        self.terms = terms
        self.name = "+".join(f"{weight:g}*{term}" for term, (_, weight) in terms.items())
        self.requires_metadata = any(uses_metadata(reward) and getattr(reward, "requires_metadata", True)
                                     for reward, _ in terms.values())
        self.has_strict = any(getattr(reward, "has_strict", True) for reward, _ in terms.values())

    def score(self, images: torch.Tensor, prompts: Sequence[str],
              metadata: Sequence[Metadata] | None = None) -> RewardOutput:
        batch = len(prompts)
        total = torch.zeros(batch, dtype=torch.float32)
        strict = torch.full((batch,), self.has_strict, dtype=torch.bool)
        valid = torch.ones(batch, dtype=torch.bool)
        terms: dict[str, torch.Tensor] = {}
        errors: list[str] = []
        for term, (reward, weight) in self.terms.items():
            out = guarded_score(reward, images, prompts, metadata)
            total += weight * out.rewards
            valid &= out.valid
            if getattr(reward, "has_strict", True):
                strict &= out.strict
            terms[term] = out.rewards
            errors += [f"{line} [{term}]" for line in out.errors]
        return RewardOutput(total, strict & valid, valid, errors, terms)


def term_metrics(out: RewardOutput, prefix: str = "rollout/reward/") -> dict[str, float]:
    """The mean of each term over the valid samples, as `prefix + term` (what metrics.jsonl logs); {} for one reward."""
    if not out.valid.any():
        return {}
    return {prefix + term: float(values[out.valid].mean()) for term, values in out.terms.items()}
