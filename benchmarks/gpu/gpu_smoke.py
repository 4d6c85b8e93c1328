"""GPU smoke test: a tiny pipeline of each family (SD3, FLUX, Qwen-Image) post-trained 2 iterations on CUDA in bfloat16.

What it checks is that the real-pipeline path (loading a folder, prompt encoding, latents, CFG, VAE
decoding, LoRA training, frozen copies over one base, checkpoints with the diffusers LoRA file) runs on
a GPU end to end, and what it costs there: peak allocated memory beside the start-up estimate
(`spotlight.models.pipelines.memory_estimate`) and seconds per iteration (validation left out). The pipelines
are random and tiny (`spotlight.models.pipelines.tiny`), so the numbers are of the plumbing, not of a
20 B model; the reward is the images' mean brightness, a stand-in that needs no model.

On a machine without CUDA it says so in one line and exits 0 (the suite and CI run anywhere);
``--device cpu --dtype float32`` runs the same path on a CPU.

    .venv/bin/python benchmarks/gpu/gpu_smoke.py                       # cuda, bfloat16, every family
    .venv/bin/python benchmarks/gpu/gpu_smoke.py --device cpu --dtype float32 --families sd3
    .venv/bin/python benchmarks/gpu/gpu_smoke.py --families sd3 --finetune full --sharding fsdp   # FSDP2 on NCCL, bf16

Prints a table; writes benchmarks/results/gpu_smoke.json (commit, machine, GPU, config, numbers).
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from spotlight.components.sharded_checkpoint import is_sharded
from spotlight.config import TrainConfig, load_config
from spotlight.models.pipelines.memory_estimate import run_memory_estimate
from spotlight.models.pipelines.tiny import FAMILIES, save_tiny_pipeline
from spotlight.ranks.placement import process_group_backend
from spotlight.rewards.base import RewardOutput
from spotlight.trainer import Trainer

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `benchmarks.*` imports

from benchmarks.provenance import RESULTS, git_commit, machine


class Brightness:
    """Mean brightness of each decoded image: a reward that needs no model, so only the pipeline is measured."""

    name = "brightness"
    has_strict = False

    def score(self, images: torch.Tensor, prompts: Sequence[str]) -> RewardOutput:
        count = len(prompts)
        return RewardOutput(images.float().mean(dim=(1, 2, 3)).cpu(), torch.zeros(count, dtype=torch.bool),
                            torch.ones(count, dtype=torch.bool))


def smoke_config(folder: Path, run_dir: Path, args: argparse.Namespace) -> TrainConfig:
    """Two iterations of vanilla NFT with CFG on the shipped OCR prompts; validation only at the start and end."""
    return load_config(TrainConfig, None, [
        f"model.pretrained={folder}", f"device={args.device}", f"dtype={args.dtype}", "data.dataset=ocr",
        f"rollout.resolution={args.resolution}", f"rollout.guidance_scale={args.guidance_scale}",
        f"train.algorithm={args.algorithm}", f"iterations={args.iterations}", "mode=vanilla",
        f"run_dir={run_dir}", "pin_devices=false", "rollout.prompts_per_iteration=4", "rollout.group_size=4",
        "rollout.num_steps=6", "train.num_minibatches=2", "train.num_epochs=1", "eval.every=1000",
        "eval.seeds_per_prompt=1", "eval.num_steps=4", "eval.raw_model=false", "checkpoint_every=1000",
        f"model.finetune={args.finetune}", f"trainer.sharding={args.sharding}",
        # fsdp: whole weights (the sampler copy, the per-block gathers) in the run's dtype, shards in float32
        *([f"trainer.whole_dtype={args.dtype}"] if args.sharding == "fsdp" else []),
    ])


def measure(family: str, root: Path, args: argparse.Namespace) -> dict[str, object]:
    """Build ``family``'s tiny pipeline, train it ``args.iterations`` iterations; its time and memory."""
    folder = save_tiny_pipeline(family, root / family)
    config = smoke_config(folder, root / f"run-{family}", args)
    estimate = run_memory_estimate(config)
    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    summary = Trainer(config, reward=Brightness()).run()
    total_s = time.perf_counter() - started
    last = summary.history[-1]
    checkpoint = root / f"run-{family}" / "checkpoints" / f"iter-{args.iterations:06d}"
    return {
        "s_per_iteration": last["time/wall_s"] / args.iterations,
        "total_s_with_validation": total_s,
        "peak_memory_mib": (torch.cuda.max_memory_allocated() if cuda else
                            resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024) / 1024**2,
        "peak_memory_kind": "torch.cuda.max_memory_allocated" if cuda else "process max RSS (CPU)",
        "estimate_mib": None if estimate is None else estimate.total / 1024**2,
        "rollout_reward_mean": last.get("rollout/reward_mean"),
        "val_reward": last.get("val/reward"),
        "diffusers_lora_file": (checkpoint / "pytorch_lora_weights.safetensors").is_file(),
        "transformer_folder": (checkpoint / "transformer" / "config.json").is_file(),
        # fsdp: a process group of one (NCCL on CUDA) and the shards of a torch.distributed.checkpoint
        "process_group": process_group_backend(args.device) if args.sharding == "fsdp" else None,
        "sharded_checkpoint": is_sharded(checkpoint),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=list(FAMILIES))
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16")
    parser.add_argument("--iterations", type=int, default=2)
    parser.add_argument("--resolution", type=int, default=64)
    parser.add_argument("--guidance-scale", type=float, default=3.0)
    parser.add_argument("--algorithm", choices=["nft", "flow-grpo"], default="nft")
    parser.add_argument("--finetune", choices=["lora", "full"], default="lora")
    parser.add_argument("--sharding", choices=["ddp", "fsdp"], default="ddp",
                        help="fsdp: the FSDP2 path on one device (a process group of one; needs --finetune full)")
    parser.add_argument("--out", type=Path, default=None,
                        help="the JSON to write (default benchmarks/results/gpu_smoke[_fsdp][_cpu].json)")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_smoke: no CUDA device on this machine (torch.cuda.is_available() is False): nothing to measure")
        return 0
    results: dict[str, dict[str, object]] = {}
    with tempfile.TemporaryDirectory(prefix="gpu-smoke-") as root:
        for family in args.families:
            results[family] = measure(family, Path(root), args)
    print(f"{'family':<11} {'s/iteration':>11} {'peak MiB':>9} {'estimate MiB':>12} {'reward':>7}  lora file"
          "  transformer/  dcp shards")
    for family, row in results.items():
        estimate = "-" if row["estimate_mib"] is None else f"{row['estimate_mib']:.1f}"
        print(f"{family:<11} {row['s_per_iteration']:>11.3f} {row['peak_memory_mib']:>9.1f} {estimate:>12} "
              f"{row['rollout_reward_mean']:>7.3f}  {row['diffusers_lora_file']!s:<9}  "
              f"{row['transformer_folder']!s:<12}  {row['sharded_checkpoint']}")
    device_name = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
    result = {"benchmark": "gpu_smoke", "commit": git_commit(), "machine": {**machine(), "device": device_name},
              "config": vars(args), "families": results}
    suffix = ("" if args.sharding == "ddp" else "_fsdp") + ("" if args.device == "cuda" else "_cpu")
    out = args.out or RESULTS / f"gpu_smoke{suffix}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
