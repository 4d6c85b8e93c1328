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

No version is ever whole in float32 beside the loaded model. Each is built on the meta device (no
storage) and sharded per block (`_skeleton`); `start` (or `restore`) then walks the transformer one FSDP
unit at a time: rank 0's unit is broadcast into the loaded model, θ's local chunks are copied out of it,
every frozen copy copies θ's local shards, and the loaded unit is cast to ``trainer.whole_dtype`` (freeing
its float32 storage), so a rank's peak is the loaded float32 model or the bf16 sampler beside every
shard, whichever is larger (`spotlight.models.pipelines.memory_estimate`'s start-up figure). `refresh`
gathers θ_old one unit at a time, in ``trainer.whole_dtype`` (FSDP2's own ``unshard`` under the
mixed-precision policy), straight into the sampler's tensors.

Every method here that gathers is a collective: all K ranks call it at once (`spotlight.ranks.mirrored`
does that for the driver). The rest touch only local shards.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.tensor import DTensor, distribute_tensor

from spotlight.components.sharded_checkpoint import checkpointed_versions
from spotlight.loop.policy_versions import old_policy_decay_at
from spotlight.loop.pretrain import ema_decay_at, update_ema
from spotlight.models.loop_model import LoopModel
from spotlight.ranks.data_parallel import sharded
from spotlight.rl.rollout_update import uses_reference

__all__ = ["ShardUnit", "ShardedVersions", "load_whole", "shard_units"]


def _local_chunk(whole: torch.Tensor, value: DTensor) -> torch.Tensor:
    """This rank's chunk of ``whole`` as ``value`` (a DTensor shard) places it: no collective."""
    return distribute_tensor(whole.to(value.device, value.dtype), value.device_mesh, value.placements,
                             src_data_rank=None).to_local()


def load_whole(policy: LoopModel, state: Mapping[str, torch.Tensor]) -> None:
    """Copy whole tensors (a `broadcast_state`) into a sharded policy: each rank keeps its own chunk, no collective."""
    with torch.no_grad():
        for name, value in policy.shard_root.state_dict().items():
            whole = torch.as_tensor(state[name])
            if isinstance(value, DTensor):
                value.to_local().copy_(_local_chunk(whole, value))
            else:
                value.copy_(whole)


def copy_shards(target: LoopModel, source: LoopModel) -> None:
    """``target`` ← ``source``, two policies sharded alike: each rank copies its local shards."""
    with torch.no_grad():
        for into, value in zip(target.shard_root.state_dict().values(), source.shard_root.state_dict().values(),
                               strict=True):
            into.copy_(value)


@dataclass(frozen=True)
class ShardUnit:
    """One FSDP2 unit of a transformer, by module paths from its root: a block (one path, ``recurse``: with its
    children), or the root's own tensors (the embeddings, norms and output layers outside the blocks: every
    such module, each without its children, the root itself last)."""

    modules: tuple[str, ...]
    recurse: bool

    def submodules(self, root: nn.Module) -> Iterator[nn.Module]:
        return (root.get_submodule(name) for name in self.modules)

    def parameters(self, root: nn.Module) -> Iterator[tuple[str, nn.Parameter]]:
        """(path from ``root``, parameter) of the unit's parameters."""
        for name, module in zip(self.modules, self.submodules(root), strict=True):
            for leaf, parameter in module.named_parameters(recurse=self.recurse):
                yield (f"{name}.{leaf}" if name else leaf), parameter

    def tensors(self, root: nn.Module) -> Iterator[torch.Tensor]:
        """The unit's parameters and buffers (what rank 0 broadcasts at the start)."""
        for module in self.submodules(root):
            yield from module.parameters(recurse=self.recurse)
            yield from module.buffers(recurse=self.recurse)

    def fsdp_module(self, root: nn.Module) -> Any:
        """The FSDP2 module whose ``unshard`` gathers this unit: the block, or the root for its own tensors."""
        return root.get_submodule(self.modules[0]) if self.recurse else root

    def apply(self, root: nn.Module, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """``fn`` on the unit's tensors (``nn.Module._apply``; an FSDP2 module re-pads its shards after)."""
        for module in self.submodules(root):
            module._apply(fn, recurse=self.recurse)


def shard_units(root: nn.Module) -> list[ShardUnit]:
    """The FSDP2 units `spotlight.ranks.data_parallel.sharded` makes of ``root``: each block with parameters of
    its ``nn.ModuleList`` children, then the root's own tensors (its unit last: sharding it re-pads them all)."""
    blocks: list[str] = []
    for list_name, module in root.named_children():
        if isinstance(module, nn.ModuleList):
            blocks += [f"{list_name}.{index}" for index, block in enumerate(module)
                       if any(True for _ in block.parameters())]
    inside = tuple(f"{name}." for name in blocks)
    own = [name for name, _ in root.named_modules() if name and name not in blocks and not name.startswith(inside)]
    return [*(ShardUnit((name,), recurse=True) for name in blocks), ShardUnit((*own, ""), recurse=False)]


def _skeleton(whole: LoopModel, trained: bool) -> LoopModel:
    """A copy of ``whole`` whose transformer's parameters are on the meta device (no storage: FSDP2 shards it, and
    `ShardedVersions` allocates only the shards), trained as ``whole``'s are or (not ``trained``) frozen; its
    buffers are ``whole``'s own tensors, shared (never trained; a copy of SD3.5 Medium's position table is 0.9 GB)."""
    root = whole.shard_root
    memo: dict[int, Any] = {id(buffer): buffer for buffer in root.buffers()}
    memo.update({id(parameter): nn.Parameter(torch.empty_like(parameter, device="meta"),
                                             requires_grad=trained and parameter.requires_grad)
                 for parameter in root.parameters()})
    return copy.deepcopy(whole, memo)


def _allocate(device: torch.device) -> Callable[[torch.Tensor], torch.Tensor]:
    """``nn.Module._apply``'s function that gives a meta tensor storage on ``device`` (uninitialised), others kept."""
    return lambda tensor: torch.empty_like(tensor, device=device) if tensor.is_meta else tensor


class ShardedVersions:
    """θ and its versions on this rank, sharded by FSDP2, and the whole copy that samples (module docstring).

    ``whole``: the policy this rank built (its transformer loaded in float32); it becomes ``sampler`` (frozen,
    cast to ``trainer.whole_dtype`` one unit at a time by `start` or `restore`), and θ and every other version
    are sharded skeletons of it, given storage there. Building it is no collective: the ranks build theirs at
    different moments (rank 0 once ranks 1..K-1 have joined).
    """

    def __init__(self, whole: LoopModel, section: Any, trainer: Any) -> None:
        whole_dtype = None if trainer.whole_dtype is None else getattr(torch, trainer.whole_dtype)

        def shard(trained: bool = False) -> LoopModel:
            policy = _skeleton(whole, trained)
            return sharded(policy, trainer.cpu_offload, trainer.activation_checkpointing and trained, whole_dtype)

        self.model = shard(trained=True)
        self.reference = shard() if uses_reference(section) else None
        self.ema = shard() if section.ema_decay else None
        self.trailing = shard() if section.old_policy_decay else None
        self.previous = shard()
        self.sampler = whole.requires_grad_(False)
        self.whole_dtype = whole_dtype
        self.units = shard_units(whole.shard_root)
        device = next(whole.shard_root.parameters()).device
        self.shard_device = torch.device("cpu") if trainer.cpu_offload else device  # (FSDP2 offloads to the host)
        self._materialised = False
        self._sampler_holds: LoopModel = self._sampling_shards

    @property
    def _sampling_shards(self) -> LoopModel:
        """θ_old's shards: the trailing copy, or θ's own."""
        return self.trailing if self.trailing is not None else self.model

    @property
    def _frozen(self) -> list[LoopModel]:
        """Every version but θ (each a sharded copy of θ at the start)."""
        return [policy for policy in (self.previous, self.reference, self.ema, self.trailing) if policy is not None]

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
        """Gather ``policy``'s shards (θ_old's by default; a collective) into the whole sampler, one FSDP2 unit at
        a time in ``trainer.whole_dtype`` (its mixed-precision all-gather): after an update or a load, where its
        weights changed even if the sampler held that version. No whole float32 copy: one unit is gathered."""
        policy = self._sampling_shards if policy is None else policy
        source, target = policy.shard_root, self.sampler.shard_root
        with torch.no_grad():
            for unit in self.units:
                gathered = unit.fsdp_module(source)
                gathered.unshard()
                for name, parameter in unit.parameters(source):
                    target.get_parameter(name).copy_(parameter)
                gathered.reshard()
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

    def _materialise(self) -> None:
        """Give every version's shards storage and their starting weights, and cast the sampler to
        ``trainer.whole_dtype``, one unit at a time: rank 0's unit is broadcast into this rank's whole copy (a
        collective), θ's shards are its local chunks, every frozen copy copies θ's shards, and the loaded float32
        unit is freed as its ``whole_dtype`` copy replaces it. Once: at the start, or before a resume's load."""
        if self._materialised:
            return
        whole = self.sampler.shard_root
        allocate = _allocate(self.shard_device)
        with torch.no_grad():
            for unit in self.units:
                for tensor in unit.tensors(whole):
                    dist.broadcast(tensor, src=0)
                for policy in (self.model, *self._frozen):
                    unit.apply(policy.shard_root, allocate)
                self._fill(unit)
                if self.whole_dtype is not None:
                    unit.apply(whole, lambda tensor: tensor.to(self.whole_dtype) if tensor.is_floating_point()
                               else tensor)
        self._materialised = True

    def _fill(self, unit: ShardUnit) -> None:
        """θ's shards of ``unit`` from this rank's whole copy (still float32), and every frozen copy's from θ's."""
        whole = dict(unit.parameters(self.sampler.shard_root))
        for name, shard in unit.parameters(self.model.shard_root):
            shard.to_local().copy_(_local_chunk(whole[name], shard))
        for policy in self._frozen:
            for (_, into), (_, shard) in zip(unit.parameters(policy.shard_root), unit.parameters(self.model.shard_root),
                                             strict=True):
                into.to_local().copy_(shard.to_local())

    def start(self) -> None:
        """Every version, the reference too, from rank 0's starting weights (a broadcast, one unit at a time, then
        each rank keeps its chunks): one start on every rank, whatever each built. The sampler then holds θ."""
        self._materialise()
        self._sampler_holds = self._sampling_shards

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

        self._materialise()  # the reference is the start's weights: a checkpoint does not keep it
        if is_sharded(checkpoint):
            load_shards(checkpoint, self.named(), optimizer)
            self.refresh()
        else:
            self.load(load_model_state(checkpoint), state.ema, state.extra)  # (it refreshes)
            load_optimizer_whole(self.model, optimizer, state.optimizer)
