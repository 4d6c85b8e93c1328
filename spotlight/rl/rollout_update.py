"""The one-shot update of a scored rollout: NFT or Flow-GRPO by ``train.algorithm``, on one rank or K."""

from __future__ import annotations

import torch

from spotlight.models.policy import Policy
from spotlight.rl.grpo import RolloutBatch, grpo_update
from spotlight.rl.nft import nft_update

__all__ = ["build_optimizer", "rollout_update", "uses_reference"]


def rollout_update(model: torch.nn.Module, previous: Policy, reference: Policy | None, optimizer: torch.optim.Optimizer,
                   batch: RolloutBatch, section, generator: torch.Generator) -> dict[str, float]:
    """θ_i → θ_{i+1} on ``batch``: `nft_update` (``previous`` drew the rollout: NFT's v_old) or `grpo_update`
    (``previous`` re-scores the old log-probs of a rollout sampled with the LoRA merged).

    ``model`` is the policy, or its DDP wrapper on one of K ranks (``section`` is then a `RankShare`);
    the loop (`spotlight.trainer.Trainer.update`) and the other trainer ranks (`spotlight.ranks.group`)
    both call this, so one rank's update is the loop's.
    """
    if section.algorithm == "nft":
        return nft_update(model, previous, optimizer, batch, section, generator, reference)
    return grpo_update(model, reference, optimizer, batch, section, generator, previous)  # θ_old re-scores merged


def build_optimizer(model: torch.nn.Module, section) -> torch.optim.Optimizer:
    """The update's optimizer: AdamW, or SGD with momentum (``train.optimizer``)."""
    if section.optimizer == "sgd":
        return torch.optim.SGD(model.parameters(), lr=section.learning_rate, momentum=section.momentum,
                               weight_decay=section.weight_decay)
    return torch.optim.AdamW(model.parameters(), lr=section.learning_rate, weight_decay=section.weight_decay)


def uses_reference(section) -> bool:
    """Whether the update needs the frozen base: Flow-GRPO with a KL term, NFT with a trust term."""
    return section.kl_beta > 0 if section.algorithm == "flow-grpo" else section.nft_kl_beta > 0
