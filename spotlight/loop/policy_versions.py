"""The trained policy θ and the versions of it the loop keeps: one object, with the updates between them.

Besides θ the loop samples, explores, anchors and validates with other versions of the same policy:

    sampler    θ_old: what samples, explores and anchors NFT's update (``v_old``); θ itself unless
               ``train.old_policy_decay`` makes it trail θ (a soft update after every iteration)
    previous   θ_old of the iteration before: what drew the rollout the update trains on, and what
               stale exploration ranks seeds with
    reference  the frozen base (adapter disabled), for a KL or trust term; None when no term uses it
    ema        what validation scores and ``checkpoints/best`` keeps; None without ``train.ema_decay``

For a LoRA policy every version is LoRA tensors over the one shared frozen base
(`spotlight.models.shadow`); a TinyDiT or a full fine-tune keeps deep copies. Keeping them in one
object means a rollback, a checkpoint and a resume touch all of them, in one place, and the trainer
reads as what it does rather than as five attributes to keep in step.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from spotlight.config import TrainSection
from spotlight.loop.pretrain import ema_decay_at, update_ema
from spotlight.models.loop_model import LoopModel
from spotlight.models.shadow import frozen_base, frozen_copy
from spotlight.models.weight_payload import copy_weights
from spotlight.rl.rollout_update import uses_reference

__all__ = ["PolicyVersions", "old_policy_decay_at"]


def old_policy_decay_at(iteration: int, section: TrainSection) -> float:
    """The soft update's decay after iteration ``iteration``: ramped from 0 to ``old_policy_decay``.

    A trailing θ_old slows the first iterations (the earlier measurement: 0.27 against 0.34 strict
    accuracy at iteration 25 with a fixed 0.5), when there is no walk yet to hold back; the ramp keeps
    that early speed and reaches the full decay before the walk compounds.
    """
    if section.old_policy_warmup == 0:
        return section.old_policy_decay
    return section.old_policy_decay * min(1.0, (iteration + 1) / section.old_policy_warmup)


@dataclass
class PolicyVersions:
    """θ (``model``) and its sampling, previous, reference and EMA versions (module docstring)."""

    model: LoopModel
    sampler: LoopModel
    previous: LoopModel
    reference: Any | None  # a frozen base: a policy, or a LoRA policy's adapter-disabled view
    ema: LoopModel | None

    @classmethod
    def of(cls, model: LoopModel, section: TrainSection) -> PolicyVersions:
        """The versions a run starting from ``model`` keeps under ``section`` (each as described above)."""
        return cls(
            model=model,
            reference=frozen_base(model) if uses_reference(section) else None,
            ema=frozen_copy(model) if section.ema_decay else None,
            sampler=frozen_copy(model) if section.old_policy_decay else model,
            previous=frozen_copy(model),
        )

    @classmethod
    def sampling_only(cls, model: LoopModel) -> PolicyVersions:
        """Only the whole policy that samples, as every version: a K-rank FSDP2 run's until its ranks have joined
        and shard the rest (`spotlight.ranks.mirrored`), so no whole copy of a version is ever made."""
        return cls(model=model, sampler=model, previous=model, reference=None, ema=None)

    @property
    def ships_sampler(self) -> bool:
        """Whether K-rank rollouts send the ranks θ_old's weights: a trailing θ_old only ranks 0 holds."""
        return self.sampler_trails

    @contextmanager
    def evaluating(self, raw: bool = False) -> Iterator[LoopModel]:
        """The whole version validation scores for the ``with`` block: the EMA (or θ without one); θ if ``raw``."""
        yield self.model if raw else self.evaluated

    @property
    def evaluated(self) -> LoopModel:
        """The version validation scores and ``checkpoints/best`` keeps: the EMA, or θ without one."""
        return self.ema if self.ema is not None else self.model

    @property
    def sampler_trails(self) -> bool:
        """Whether θ_old is its own copy that trails θ (``train.old_policy_decay`` > 0), not θ itself."""
        return self.sampler is not self.model

    def hand_over(self) -> None:
        """Before an update: the sampling policy that drew this rollout becomes ``previous`` (θ_old,i).

        A device-to-device copy of the trained tensors (`copy_weights`), inside the timed update: no host read.
        """
        copy_weights(self.previous, self.sampler)

    def after_update(self, iteration: int, section: TrainSection) -> None:
        """Move the EMA and a trailing θ_old towards θ_{i+1}, each by its own decay schedule."""
        if self.ema is not None:
            update_ema(self.ema, self.model, ema_decay_at(iteration, section.ema_decay))
        if self.sampler_trails:
            update_ema(self.sampler, self.model, old_policy_decay_at(iteration, section))

    def reset_to(self, state: Mapping[str, torch.Tensor]) -> None:
        """Put one set of weights (a ``checkpoints/best``) into θ, θ_old, θ_{i-1} and the EMA: a guard rollback."""
        for policy in {id(p): p for p in (self.model, self.sampler, self.previous, self.ema) if p is not None}.values():
            policy.load_broadcast_state(state)

    def extra_state(self) -> dict[str, Any]:
        """What a training checkpoint keeps of the versions besides θ and the EMA (saved on their own)."""
        return {"previous": self.previous.broadcast_state(),
                **({"sampler": self.sampler.broadcast_state()} if self.sampler_trails else {})}

    def named(self) -> dict[str, LoopModel]:
        """The versions a checkpoint keeps, by the names it keeps them under (θ is ``model``)."""
        from spotlight.components.sharded_checkpoint import checkpointed_versions

        return checkpointed_versions(self.model, self.previous, self.ema, self.sampler if self.sampler_trails else None)

    def save_checkpoint(self, run_dir: Path, done: int, optimizer: torch.optim.Optimizer,
                        loop_state: dict[str, Any]) -> None:
        """Write the training checkpoint after ``done`` iterations: θ, the EMA, the versions and ``loop_state``."""
        from spotlight.components.checkpoint import save_training_checkpoint

        save_training_checkpoint(run_dir, done, self.model, optimizer, self.ema, {**self.extra_state(), **loop_state})

    def restore(self, checkpoint: Path, optimizer: torch.optim.Optimizer, state: Any) -> None:
        """Resume θ, every version and ``optimizer`` from a checkpoint (``state``: its `TrainingState`); one written
        by K FSDP2 ranks is read whole from its shards (`spotlight.components.sharded_checkpoint`)."""
        from spotlight.components.checkpoint import load_model_state
        from spotlight.components.sharded_checkpoint import is_sharded, load_shards

        if is_sharded(checkpoint):
            load_shards(checkpoint, self.named(), optimizer)
            return
        self.load(load_model_state(checkpoint), state.ema, state.extra)
        optimizer.load_state_dict(state.optimizer)

    def load(self, model_state: Mapping[str, torch.Tensor], ema_state: Mapping[str, torch.Tensor] | None,
             extra: Mapping[str, Any]) -> None:
        """Resume every version from a checkpoint's tensors (``extra``: what `extra_state` wrote)."""
        self.model.load_broadcast_state(model_state)
        if self.ema is not None and ema_state is not None:
            self.ema.load_broadcast_state(ema_state)
        self.previous.load_broadcast_state(extra["previous"])
        if self.sampler_trails:
            self.sampler.load_broadcast_state(extra["sampler"])
