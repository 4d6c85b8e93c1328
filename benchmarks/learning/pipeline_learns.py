"""Does post-training a pipeline folder learn? A user reward (`pipeline_learns:redness`) on a tiny pipeline.

The issue-22 check that the whole real-pipeline path learns, not only runs: a tiny random pipeline folder
(`spotlight.models.pipelines.tiny`), prompts of the shapes preset, its own text encoders, latents, the
scheduler's schedule, CFG in the rollouts and VAE decoding, and a user reward named as
``pkg.module:function`` (`redness` below: the mean of red minus the mean of green and blue, in [-1, 1]).
NFT trains LoRA, CFG-free. The rollout reward's mean over the first and last ``--window`` iterations is
compared per seed; the pipeline is random, so what it learns is colour, not shapes. A random VAE
decodes most latents to nearly the same colour (the per-sample spread of the reward is about 0.005),
so the learning rate is high (3e-2, LoRA rank 8) for a change to show within 20 iterations.

    .venv/bin/python benchmarks/learning/pipeline_learns.py                       # flux, 20 iterations, seeds 0 1 2
    .venv/bin/python benchmarks/learning/pipeline_learns.py --family sd3 --seeds 0

Prints a table; writes benchmarks/results/pipeline_learns.json (commit, machine, config, numbers).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from spotlight.config import TrainConfig, load_config
from spotlight.models.pipelines.tiny import FAMILIES, save_tiny_pipeline
from spotlight.trainer import train

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `benchmarks.*` imports

from benchmarks.provenance import RESULTS, git_commit, machine


def redness(images: torch.Tensor, prompts: list[str], metadata: list[dict]) -> torch.Tensor:
    """The user reward: mean red minus the mean of green and blue, per image (N, 3, H, W) in [0, 1]."""
    del prompts, metadata
    red, green, blue = images.mean(dim=(2, 3)).unbind(dim=1)
    return red - 0.5 * (green + blue)


def overrides(folder: Path, run_dir: Path, seed: int, iterations: int, learning_rate: float) -> list[str]:
    return [f"model.pretrained={folder}", f"run_dir={run_dir}", f"seed={seed}", f"iterations={iterations}",
            "mode=vanilla", "reward.name=pipeline_learns:redness", "rollout.resolution=32",
            "rollout.prompts_per_iteration=4", "rollout.group_size=4", "rollout.num_steps=4", "rollout.sde_steps=null",
            "rollout.guidance_scale=2.0", "model.lora_rank=8", "model.lora_alpha=8",
            f"train.learning_rate={learning_rate}",
            # the plain NFT update: no trailing sampling policy, no KL to the base, no EMA (a short run)
            "train.num_minibatches=2", "train.num_epochs=4", "train.old_policy_decay=0", "train.nft_kl_beta=0",
            "train.ema_decay=null", "eval.every=1000", "eval.seeds_per_prompt=1",
            "eval.num_steps=4", "eval.grid_prompts=2", "eval.raw_model=false", "checkpoint_every=1000",
            "pin_devices=false", "num_threads=1"]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", choices=FAMILIES, default="flux")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--window", type=int, default=3)
    parser.add_argument("--learning-rate", type=float, default=3e-2)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # reward.name pipeline_learns:redness imports this file
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        folder = save_tiny_pipeline(args.family, Path(scratch) / args.family)
        for seed in args.seeds:
            run_dir = Path(scratch) / f"run-{seed}"
            config = load_config(TrainConfig, None, overrides(folder, run_dir, seed, args.iterations,
                                                              args.learning_rate))
            started = time.perf_counter()
            summary = train(config)
            means = [record["rollout/reward_mean"] for record in summary.history if "rollout/reward_mean" in record]
            first = sum(means[: args.window]) / args.window
            last = sum(means[-args.window:]) / args.window
            rows.append({"seed": seed, "first": first, "last": last, "rise": last - first, "curve": means,
                         "wall_s": time.perf_counter() - started})
    print(f"{args.family}, {args.iterations} iterations, reward redness (mean of the first / last {args.window})")
    print(f"{'seed':>4} {'first':>9} {'last':>9} {'rise':>9} {'wall s':>7}")
    for row in rows:
        print(f"{row['seed']:>4} {row['first']:>9.4f} {row['last']:>9.4f} {row['rise']:>+9.4f} {row['wall_s']:>7.1f}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "pipeline_learns.json"
    out.write_text(json.dumps({"commit": git_commit(), "machine": machine(), "family": args.family,
                               "iterations": args.iterations, "window": args.window,
                               "overrides": overrides(Path("FOLDER"), Path("RUN_DIR"), 0, args.iterations,
                                                      args.learning_rate),
                               "runs": rows}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
