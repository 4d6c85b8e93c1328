"""θ and its versions on one of K ranks under FSDP2: every version sharded alike, and one whole copy that samples.

The training state of a full fine-tune is what outgrows a device: fp32 weights, their gradients and
Adam's two moments are 16 bytes a parameter (a 20 B Qwen-Image: ~330 GB). Under ``trainer.sharding:
fsdp`` each rank keeps 1/K of it, and of every other version the loop holds:

    model       θ: FSDP2 units per transformer block (`spotlight.ranks.data_parallel.sharded`), trained
    previous    θ_old,i, what drew the rollout: NFT's ``v_old`` in the update, sharded the same way
    reference   the frozen base of a KL or trust term, sharded
    ema         what validation scores, sharded
    trailing    θ_old when ``train.old_policy_decay`` makes it trail θ, sharded (else θ's shards are θ_old's)

Every version's parameters are DTensors with the same placements as θ's, so the updates between
versions (the EMA's lerp, the hand-over θ_old → previous, a soft update) are elementwise on each
rank's local shard: no collective, no whole copy.

Sampling is the one thing that needs whole weights: a rank samples its share of the groups by itself,
with no collective per denoising step, so each rank holds ``sampler``: a plain, unsharded policy
holding θ_old, gathered once per iteration (`refresh`, an all-gather after the update). It is what
the backend samples and explores with, what spot devices are sent, and (between `begin_evaluation`
and `end_evaluation`) what validation scores. So a rank holds 1/K of the training state and one
whole copy of the weights, as verl's hybrid engine does for its rollout.

Every method here that gathers is a collective: all K ranks call it at once (`spotlight.ranks.mirrored`
does that for the driver). The rest touch only local shards.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, distribute_tensor

from spotlight.components.sharded_checkpoint import checkpointed_versions
from spotlight.loop.policy_versions import old_policy_decay_at
from spotlight.loop.pretrain import ema_decay_at, update_ema
from spotlight.models.loop_model import LoopModel
from spotlight.ranks.data_parallel import full_state, sharded
from spotlight.rl.rollout_update import uses_reference

__all__ = ["ShardedVersions", "load_whole"]


def load_whole(policy: LoopModel, state: Mapping[str, torch.Tensor]) -> None:
    """Copy whole tensors (a `broadcast_state`) into a sharded policy: each rank keeps its own chunk, no collective."""
    with torch.no_grad():
        for name, value in policy.shard_root.state_dict().items():
            whole = torch.as_tensor(state[name])
            if isinstance(value, DTensor):
                local = distribute_tensor(whole.to(value.device, value.dtype), value.device_mesh, value.placements,
                                          src_data_rank=None).to_local()
                value.to_local().copy_(local)
            else:
                value.copy_(whole)


def copy_shards(target: LoopModel, source: LoopModel) -> None:
    """``target`` ← ``source``, two policies sharded alike: each rank copies its local shards."""
    with torch.no_grad():
        for into, value in zip(target.shard_root.state_dict().values(), source.shard_root.state_dict().values(),
                               strict=True):
            into.copy_(value)


class ShardedVersions:
    """θ and its versions on this rank, sharded by FSDP2, and the whole copy that samples (module docstring).

    ``whole``: the policy this rank built; it becomes ``sampler`` (frozen), and θ and every other
    version are sharded copies of it.
    """

    def __init__(self, whole: LoopModel, section: Any, trainer: Any) -> None:
        whole_dtype = None if trainer.whole_dtype is None else getattr(torch, trainer.whole_dtype)

        def shard(policy: LoopModel, trained: bool = False) -> LoopModel:
            return sharded(policy, trainer.cpu_offload, trainer.activation_checkpointing and trained, whole_dtype)

        self.model = shard(copy.deepcopy(whole), trained=True)
        frozen = copy.deepcopy(whole).requires_grad_(False)
        self.reference = shard(copy.deepcopy(frozen)) if uses_reference(section) else None
        self.ema = shard(copy.deepcopy(frozen)) if section.ema_decay else None
        self.trailing = shard(copy.deepcopy(frozen)) if section.old_policy_decay else None
        self.previous = shard(frozen)
        self.sampler = whole.requires_grad_(False)
        self.whole_dtype = whole_dtype
        self._sampler_holds: LoopModel = self._sampling_shards

    @property
    def _sampling_shards(self) -> LoopModel:
        """θ_old's shards: the trailing copy, or θ's own."""
        return self.trailing if self.trailing is not None else self.model

    @property
    def sampler_trails(self) -> bool:
        return self.trailing is not None

    @property
    def evaluated(self) -> LoopModel:
        """What validation scores (the EMA, or θ), sharded; `begin_evaluation` gathers it into ``sampler``."""
        return self.ema if self.ema is not None else self.model

    def hold(self, policy: LoopModel) -> None:
        """The whole sampler holds ``policy``'s weights: all-gathered (a collective) unless it holds them already."""
        if policy is not self._sampler_holds:
            self.refresh(policy)

    def refresh(self, policy: LoopModel | None = None) -> None:
        """All-gather ``policy``'s shards (θ_old's by default; a collective) into the whole sampler: after an
        update or a load, where its weights changed even if the sampler held that version."""
        policy = self._sampling_shards if policy is None else policy
        self.sampler.load_broadcast_state(full_state(policy.shard_root))
        self._sampler_holds = policy

    # -- what the loop calls, on every rank at once -------------------------------------------------
    def hand_over(self) -> None:
        """Before an update: θ_old (which drew this rollout) becomes ``previous``; local shards only."""
        copy_shards(self.previous, self._sampling_shards)

    def after_update(self, iteration: int, section: Any) -> None:
        """Move the EMA and a trailing θ_old towards θ_{i+1} (local), then gather θ_old into the sampler."""
        if self.ema is not None:
            update_ema(self.ema, self.model, ema_decay_at(iteration, section.ema_decay))
        if self.trailing is not None:
            update_ema(self.trailing, self.model, old_policy_decay_at(iteration, section))
        self.refresh()

    def begin_evaluation(self, raw: bool = False) -> None:
        """The sampler holds the evaluated version (the EMA, or θ), θ if ``raw``: for validation, or an export."""
        self.hold(self.model if raw else self.evaluated)

    def end_evaluation(self) -> None:
        """The sampler holds θ_old again (a collective unless it never stopped)."""
        self.hold(self._sampling_shards)

    def _cast_sampler(self) -> None:
        """The whole copy in ``trainer.whole_dtype`` (bf16: half the bytes; each load casts what it gathers)."""
        if self.whole_dtype is not None:
            self.sampler.shard_root.to(self.whole_dtype)

    def start(self) -> None:
        """Every version, the reference too, from rank 0's starting weights (a broadcast, then each rank keeps its
        chunks): one start on every rank, whatever each built."""
        state = self.sampler.shard_root.state_dict()
        for tensor in state.values():
            dist.broadcast(tensor, src=0)
        for policy in (self.model, self.trailing, self.previous, self.ema, self.reference):
            if policy is not None:
                load_whole(policy, state)
        self._cast_sampler()
        self.refresh()

    def reset_to(self, state: Mapping[str, torch.Tensor]) -> None:
        """One set of whole weights (a ``checkpoints/best``) into θ, θ_old, θ_{i-1} and the EMA: a guard rollback."""
        for policy in (self.model, self.trailing, self.previous, self.ema):
            if policy is not None:
                load_whole(policy, state)
        self.refresh()

    def load(self, model_state: Mapping[str, torch.Tensor], ema_state: Mapping[str, torch.Tensor] | None,
             extra: Mapping[str, Any]) -> None:
        """Resume every version from a consolidated checkpoint's whole tensors (each rank keeps its chunks)."""
        load_whole(self.model, model_state)
        if self.ema is not None and ema_state is not None:
            load_whole(self.ema, ema_state)
        load_whole(self.previous, extra["previous"])
        if self.trailing is not None:
            load_whole(self.trailing, extra["sampler"])
        self.refresh()

    def named(self) -> dict[str, LoopModel]:
        """The sharded versions a checkpoint keeps, by the names it keeps them under (as `PolicyVersions.named`)."""
        return checkpointed_versions(self.model, self.previous, self.ema, self.trailing)

    def save_shards(self, staging: Path, optimizer: torch.optim.Optimizer) -> None:
        """This rank's shards into ``staging/dcp`` (a collective), and θ into the sampler for rank 0's export."""
        from spotlight.components.sharded_checkpoint import save_shards, versions_state

        save_shards(staging, versions_state(self.named(), optimizer))
        self.begin_evaluation(raw=True)  # θ, for rank 0's consolidated files

    def restore(self, checkpoint: Path, optimizer: torch.optim.Optimizer, state: Any) -> None:
        """Resume from a checkpoint of any K: its shards resharded to this K, or its whole tensors chunked."""
        from spotlight.components.checkpoint import load_model_state
        from spotlight.components.sharded_checkpoint import is_sharded, load_optimizer_whole, load_shards

        self._cast_sampler()
        if is_sharded(checkpoint):
            load_shards(checkpoint, self.named(), optimizer)
            self.refresh()
        else:
            self.load(load_model_state(checkpoint), state.ema, state.extra)  # (it refreshes)
            load_optimizer_whole(self.model, optimizer, state.optimizer)
