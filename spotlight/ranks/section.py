"""``trainer:``: how many devices train the policy, and how its weights are spread over them."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from spotlight.schema import Section


class TrainerSection(Section):
    """K trainer ranks in one torch.distributed group (`spotlight.ranks`); 1: the trainer is this process alone.

    ``sharding``: ddp replicates the trained weights on every rank and all-reduces their gradients (LoRA:
    the adapters are megabytes); fsdp shards them, their gradients and the optimizer's moments over the
    ranks with FSDP2 (``fully_shard``), for full fine-tuning of a transformer that one device cannot hold.
    """

    devices: int = Field(1, ge=1)
    sharding: Literal["ddp", "fsdp"] = "ddp"
    cpu_offload: bool = False  # fsdp: keep the sharded weights, gradients and moments in host memory
    activation_checkpointing: bool = False  # fsdp: recompute each block's activations in the backward
