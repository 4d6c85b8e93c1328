"""One gloo rank of `test_sharded_memory`: the peak memory of `ShardedVersions`' start-up and of one refresh.

Run as ``python sharded_memory_probe.py RANK WORLD RENDEZVOUS_FILE OUTPUT_JSON LAYERS WIDTH_HEADS``. The process
builds a scaled tiny SD3 transformer in float32 (what a rank loads), shards θ, θ_old, the reference and the EMA
(`ShardedVersions` and its `start`), then gathers θ_old into the bf16 sampler (`refresh`). Torch's CPU allocator
keeps no statistics, so the honest measure is the process's resident set: its high-water mark (``VmHWM``,
reset through ``/proc/self/clear_refs``) above the resident set before each step, with glibc returning every
large block on free (``MALLOC_MMAP_THRESHOLD_`` set by the test) so that the peak is the live bytes'.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from spotlight.config import TrainSection
from spotlight.models.pipelines.family_config import DiffusersPolicyConfig
from spotlight.models.rebuild import policy_from_config
from spotlight.ranks.section import TrainerSection
from spotlight.ranks.sharded_versions import ShardedVersions


def status_bytes(field: str) -> int:
    """A ``/proc/self/status`` size (VmRSS, VmHWM) in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def reset_peak() -> int:
    """Reset the resident set's high-water mark to the current resident set; that resident set."""
    Path("/proc/self/clear_refs").write_text("5")
    return status_bytes("VmRSS")


class GatheredDtypes(TorchDispatchMode):
    """The dtypes of every all-gather's output, and the largest float32 tensor any op makes (elements)."""

    def __init__(self) -> None:
        super().__init__()
        self.gathered: set[str] = set()
        self.largest_float32 = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        result = func(*args, **(kwargs or {}))
        outputs = result if isinstance(result, (tuple, list)) else [result]
        flat = [t for o in outputs for t in (o if isinstance(o, (tuple, list)) else [o]) if isinstance(t, torch.Tensor)]
        if "gather" in func.__name__:
            self.gathered.update(str(t.dtype) for t in flat)
        for tensor in flat:
            if tensor.dtype == torch.float32:
                self.largest_float32 = max(self.largest_float32, tensor.numel())
        return result


def main() -> None:
    rank, world, rendezvous, output = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], Path(sys.argv[4])
    layers, heads = int(sys.argv[5]), int(sys.argv[6])
    torch.manual_seed(0)
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world)
    overrides = {"num_layers": layers, "num_attention_heads": heads, "attention_head_dim": 64,
                 "joint_attention_dim": 64, "caption_projection_dim": heads * 64, "dual_attention_layers": ()}
    config = DiffusersPolicyConfig(family="sd3", tiny=True, tiny_overrides=overrides, finetune="full", init_seed=0)
    section = TrainSection(ema_decay=0.5, nft_kl_beta=0.1, old_policy_decay=0.0)
    trainer = TrainerSection(devices=world, sharding="fsdp", whole_dtype="bfloat16")
    warm = ShardedVersions(policy_from_config(config.model_copy(update={"tiny_overrides": {}})), section, trainer)
    warm.start()  # diffusers, FSDP2 and DTensor imported and warmed on the default tiny model: not measured
    warm.refresh()
    del warm
    dist.barrier()

    before = reset_peak()
    whole = policy_from_config(config)  # the rank's loaded transformer, float32
    versions = ShardedVersions(whole, section, trainer)
    versions.start()
    startup = status_bytes("VmHWM") - before
    dist.barrier()

    before = reset_peak()
    probe = GatheredDtypes()
    with probe:
        versions.refresh()
    refresh = status_bytes("VmHWM") - before

    root = whole.shard_root
    block = root.transformer_blocks[0]
    output.write_text(json.dumps({
        "startup": startup, "refresh": refresh,
        "parameters": sum(p.numel() for p in root.parameters()), "blocks": len(root.transformer_blocks),
        "hidden": heads * 64, "block_parameters": sum(p.numel() for p in block.parameters()),
        "gathered": sorted(probe.gathered), "largest_float32": probe.largest_float32,
        "sampler": sorted({str(p.dtype) for p in root.parameters()}),
    }))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
