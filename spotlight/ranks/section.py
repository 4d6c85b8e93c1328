"""``trainer:``: how many devices train the policy, and how its weights are spread over them."""

from __future__ import annotations

from typing import Any, Literal

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
    # fsdp: the dtype whole weights are materialised in: each rank's sampling copy of θ_old and FSDP2's per-block
    # all-gathers (its MixedPrecisionPolicy param_dtype; gradients still reduce in float32 into float32 shards and
    # moments). null: the trained weights' own (float32 for a full fine-tune). bfloat16 halves both: Qwen-Image's
    # 20 B sampling copy is 41 GB instead of 82 GB. A bf16 pipeline's forward runs in bf16 anyway (autocast), so
    # only the weights autocast keeps in float32 (norms, biases) round differently
    whole_dtype: Literal["float32", "bfloat16", "float16"] | None = None

    @property
    def in_group(self) -> bool:
        """Whether the trainer is a process group: K > 1 ranks, or fsdp (on one device too, a group of one)."""
        return self.devices > 1 or self.sharding == "fsdp"


def ranks_problem(config: Any) -> str | None:
    """Why a `TrainConfig` cannot run on its ``trainer.devices`` K > 1 ranks, one line naming the knob; None: it can.

    Disaggregated mode: its generators stream each finished group to one trainer process, which steps as
    groups arrive; K ranks would need every group on every rank in one order. FSDP2: LoRA stays on DDP
    (only the adapters' gradients are all-reduced), and θ_{i-1} is kept only as shards, so mode
    stale-explore has no whole copy to explore with.
    """
    from spotlight.cores import unpinned_cores
    from spotlight.modes import Mode

    devices = config.trainer.devices
    if not config.trainer.in_group:
        return None
    cores = config.device_cores if config.device_cores is not None else unpinned_cores()
    if config.pin_devices and devices > len(cores):
        return (f"trainer.devices={devices} pins one rank per core, but only {len(cores)} core(s) {cores} are given "
                f"(device_cores or this process's cores): lower trainer.devices to {len(cores)}, or set pin_devices "
                "false")
    if config.mode is Mode.DISAGGREGATED and devices == 1:
        return ("trainer.sharding fsdp: mode disaggregated trains one process's plain policy as groups arrive: set "
                "trainer.sharding ddp")
    if config.mode is Mode.DISAGGREGATED:
        return (f"trainer.devices={devices}: mode disaggregated trains on one rank (its generators stream each "
                "finished group to one trainer process, which steps as groups arrive; K ranks would need every group "
                "on every rank in one order): set trainer.devices 1, or use mode vanilla or spotlight with K ranks")
    diffusers = config.model.pretrained is not None or config.model.family != "tinydit"
    if config.trainer.sharding == "fsdp" and diffusers and config.model.finetune == "lora":
        return ("trainer.sharding fsdp with model.finetune lora: LoRA trains with ddp (only its adapters' gradients "
                "are all-reduced; the frozen base needs no sharding): set trainer.sharding ddp")
    if config.trainer.whole_dtype not in (None, "float32") and not diffusers:
        return (f"trainer.whole_dtype {config.trainer.whole_dtype}: a TinyDiT runs in float32 only (it has no "
                "autocast): set trainer.whole_dtype null")
    if config.trainer.sharding == "fsdp" and config.mode is Mode.STALE_EXPLORE:
        return (f"trainer.devices={devices} with trainer.sharding fsdp: mode stale-explore explores with a whole "
                "θ_{i-1}, which fsdp keeps only as shards: use mode spotlight (stale exploration on spot devices), or "
                "set trainer.sharding ddp")
    return None
