"""One update on K ranks equal to the update of one process on the union batch: what each rank computes and how
the gradients meet.

Every rank holds the whole scored rollout and runs the one update (`nft_update` / `grpo_update`) with the
same generator, so every shuffle and noise draw is the same everywhere; `RankShare` tells the update's
micro-batching (`spotlight.rl.micro_batch`) to compute only this rank's rows. Each row's loss is already
weighted by its share of the whole minibatch, so the minibatch's gradient is the SUM of the ranks'
gradients, not their mean:

- ddp (`data_parallel`): DDP averages every backward's bucket (sync on each micro-batch, so gradients
  that were already reduced stay correct when more are added: the mean of equal values is that value);
  a hook multiplies each rank's fresh gradient by K first, so the mean of K·g_r is Σ g_r.
- fsdp (`sharded`): FSDP2 reduce-scatters each backward's fresh gradient into the sharded ``.grad``;
  a divide factor of 1 makes that reduction a sum.

The trained model the loop holds stays the plain policy (DDP wraps it; FSDP2 turns its parameters into
DTensor shards in place, and `full_state` gathers them for a checkpoint any K' can load).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

__all__ = ["RankShare", "data_parallel", "full_state", "sharded"]


@dataclass(frozen=True)
class RankShare:
    """A training section seen by one of ``world_size`` ranks: every field of ``section``, plus ``rank``.

    The update reads its hyperparameters from this object as from the section; `micro_batches` reads
    ``rank`` and ``world_size``.
    """

    section: Any
    rank: int
    world_size: int

    def __getattr__(self, name: str) -> Any:
        return getattr(self.section, name)


def data_parallel(model: nn.Module, world_size: int) -> nn.Module:
    """``model`` under DDP in the current process group, its gradients summed over the ranks (see the module).

    ``init_sync`` is off: the ranks start from weights the driver sent, and a multi-billion-parameter
    frozen base would otherwise be broadcast whole. ``broadcast_buffers`` is off: the policies' buffers are
    constants every rank built alike (SD3's 453 MB sin-cos ``pos_embed``, RoPE tables; no running
    statistics), and DDP would otherwise send rank 0's to every rank before every forward.
    """
    for parameter in model.parameters():
        if parameter.requires_grad:
            parameter.register_hook(lambda grad: grad * world_size)
    return nn.parallel.DistributedDataParallel(model, init_sync=False, broadcast_buffers=False)


def sharded(model: nn.Module, cpu_offload: bool = False, activation_checkpointing: bool = False,
            param_dtype: torch.dtype | None = None) -> nn.Module:
    """``model`` with its parameters sharded over the ranks by FSDP2, gradients summed (see the module).

    Each block of the root's ``nn.ModuleList`` children (TinyDiT's and the diffusers transformers'
    blocks) is its own FSDP unit, so one block's weights are whole at a time; the root (the TinyDiT, or
    the diffusers policy's transformer) holds the rest. With
    ``activation_checkpointing`` each block recomputes its activations in the backward. ``param_dtype``:
    the dtype each unit's weights are all-gathered and computed in (bf16 halves the gathers), the
    gradients reduced in float32 into the float32 shards. θ's forward then computes as the whole copy in
    ``param_dtype`` that samples does: the root's inputs are cast to it but the noise level (`_compute_inputs`),
    and FSDP2 casts no unit's inputs (its ``cast_forward_inputs`` rounded SD3's float32 timestep, and FLUX's
    float32 rotary tables, to bf16 in the update only).
    """
    from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    offload = CPUOffloadPolicy() if cpu_offload else OffloadPolicy()
    precision = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32 if param_dtype else None,
                                     cast_forward_inputs=False)
    # a diffusers policy's frozen text encoders and VAE are shared with other policies: only its transformer shards
    root = model.shard_root
    blocks = [block for module in root.children() if isinstance(module, nn.ModuleList) for block in module
              if any(True for _ in block.parameters())]
    if activation_checkpointing:
        from torch.distributed._composable import checkpoint

        for block in blocks:
            checkpoint(block)
    for block in blocks:
        fully_shard(block, offload_policy=offload, mp_policy=precision)
    fully_shard(root, offload_policy=offload, mp_policy=precision)
    if param_dtype is not None:
        root.register_forward_pre_hook(_compute_inputs(param_dtype), with_kwargs=True)
    for unit in root.modules():
        if isinstance(unit, FSDPModule):  # a plain SUM (gloo has no pre-multiplied sum), divided by 1
            unit.set_force_sum_reduction_for_comms(True)
            unit.set_gradient_divide_factor(1.0)
    return model


# The noise level a diffusers transformer takes: sampling hands it in float32 (`transformer_velocity`: SD3's
# 1000·sigma in bf16 would be rounded to steps of 4-8; FLUX and Qwen-Image cast it inside themselves).
NOISE_LEVEL_INPUTS = ("timestep", "guidance")


def _compute_inputs(dtype: torch.dtype) -> Any:
    """A forward pre-hook casting a root's floating inputs to ``dtype``, as `transformer_velocity` casts them for a
    whole copy in ``dtype``, but the noise level (`NOISE_LEVEL_INPUTS`), which stays float32 as in sampling."""
    def cast(value: Any) -> Any:
        return value.to(dtype) if isinstance(value, torch.Tensor) and value.is_floating_point() else value

    def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict]:
        return (tuple(cast(value) for value in args),
                {name: value if name in NOISE_LEVEL_INPUTS else cast(value) for name, value in kwargs.items()})

    return hook


def full_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The whole ``state_dict`` of a model, its FSDP2 shards gathered (a collective: every rank calls it)."""
    return {name: value.full_tensor() if hasattr(value, "full_tensor") else value
            for name, value in model.state_dict().items()}
