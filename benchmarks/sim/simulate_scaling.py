"""Simulated: images per GPU-second of K data-parallel trainer ranks, 8 to 256 H100s, SD3.5-Medium and Qwen-Image.

Each model is its shipped recipe (configs/sd35m-ocr-lora.yaml, configs/qwen-image-ocr-lora.yaml: LoRA, NFT,
512², 10 steps) on the shipped config folder (`spotlight/sim/planning/model_configs`, FLOPs counted on the meta
device), weak-scaled: every GPU keeps the recipe's batch per 8 GPUs (SD3.5-M 16 x 16 / 8 = 32 images,
Qwen-Image 8 x 16 / 8 = 16), so N GPUs sample N / 8 times the recipe's batch. The iteration's terms
and the interconnect are `spotlight.sim.scaling`'s; the GPU is the H100-SXM profile (its efficiencies and
link speeds are assumptions, named with their sources). ``full all-reduce s`` prices the all-reduce
had every transformer weight been trained (DDP's; FSDP2's reduce-scatter moves half), compute unchanged.

    python benchmarks/sim/simulate_scaling.py        (~3 min the first time: the meta FLOP counts are cached)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from spotlight.config import parse_config
from spotlight.plan_config import PlanConfig
from spotlight.sim.planning.device_profiles import profile
from spotlight.sim.planning.folder_workload import derive_workload
from spotlight.sim.scaling import Interconnect, all_reduce_s, scaling_row

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `benchmarks.*` imports

from benchmarks.provenance import RESULTS, git_commit, machine

GPUS = (8, 16, 32, 64, 128, 256)
RECIPES = {  # the shipped recipes' rollout (configs/*-ocr-lora.yaml); the rest is TrainConfig's default
    "SD3.5-Medium": {"model": {"pretrained": "sd3.5-medium", "finetune": "lora"},
                     "rollout": {"resolution": 512, "num_steps": 10, "prompts_per_iteration": 16, "group_size": 16}},
    "Qwen-Image": {"model": {"pretrained": "qwen-image", "finetune": "lora"},
                   "rollout": {"resolution": 512, "num_steps": 10, "prompts_per_iteration": 8, "group_size": 16}},
}


def table(name: str, settings: dict, gpu: str) -> dict:
    """The scaling rows of one recipe on ``gpu`` (module docstring)."""
    config = parse_config(PlanConfig, {**settings, "plan": {"gpu": gpu}})
    device = profile(gpu)
    work = derive_workload(config, device)
    link = Interconnect.of(device)
    batch = config.rollout.prompts_per_iteration * config.rollout.group_size
    per_gpu = batch // 8
    full = dataclasses.replace(work, trainable_parameters=work.parameters)
    rows = []
    for gpus in GPUS:
        latents = 1 if config.train.algorithm == "nft" else config.rollout.num_steps + 1  # what_the_update_reads
        row = scaling_row(work, device, link, gpus, per_gpu, batch, latents)
        rows.append({**row.as_dict(), "full_all_reduce_s": row.all_reduces * all_reduce_s(full.gradient_bytes, gpus,
                                                                                           link)})
    return {"model": name, "gpu": gpu, "images_per_gpu": per_gpu, "recipe": settings,
            "rollout_tflop_per_image": work.rollout_flops_per_image / 1e12,
            "update_tflop_per_sample": work.update_flops_per_sample / 1e12,
            "trainable_parameters": work.trainable_parameters, "parameters": work.parameters,
            "interconnect": link.describe(), "link_source": device.link_source,
            "efficiency_source": device.efficiency_source, "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", default="H100-SXM")
    args = parser.parse_args()
    tables = [table(name, settings, args.gpu) for name, settings in RECIPES.items()]
    for result in tables:
        first = result["rows"][0]["images_per_gpu_s"]
        print(f"\n{result['model']} on {result['gpu']}, LoRA, {result['images_per_gpu']} images per GPU an iteration; "
              f"{result['interconnect']}")
        print(f"{'GPUs':>5} {'rollout s':>9} {'exchange s':>10} {'update s':>9} {'all-reduce s':>12} "
              f"{'images/GPU-s':>12} {'vs 8':>6} {'full all-reduce s':>17}")
        for row in result["rows"]:
            print(f"{row['gpus']:>5} {row['rollout_s']:>9.2f} {row['exchange_s']:>10.3f} {row['update_s']:>9.2f} "
                  f"{row['all_reduce_s']:>12.4f} {row['images_per_gpu_s']:>12.3f} "
                  f"{row['images_per_gpu_s'] / first:>6.2f} {row['full_all_reduce_s']:>17.2f}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / "simulated_scaling.json"
    path.write_text(json.dumps({"commit": git_commit(), "machine": machine(), "simulated": True,
                                "gpu_measurement": "not measured: no GPU lent", "tables": tables}, indent=2))
    print(f"\nwritten to {path}")


if __name__ == "__main__":
    main()
