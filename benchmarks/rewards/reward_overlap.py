"""Rollout time with the reward scored after sampling vs during it (`reward.overlap`), side by side.

One rollout of the OCR task (ocr-base, P prompts x G seeds, the default 10-step plan) is sampled on
core 0 with one thread, as the trainer samples, and scored by a real reward three ways:

- after, in process: sample everything, then score in the trainer's process (today's default);
- after, worker: sample everything, then score in the reward worker process (core 1);
- during, worker: sample chunk by chunk (`reward.overlap_groups` groups each), each finished chunk
  scored by the worker while the next is sampled (`reward.overlap: true`).

Sampling alone and scoring alone are timed too: "during" can at best approach max(sampling,
scoring) + the last chunk's scoring. The rewards of the three ways are checked equal. Each way runs
`--repeats` times, interleaved; medians are printed.

Run: .venv/bin/python benchmarks/rewards/reward_overlap.py --reward ocr-line
Writes benchmarks/results/reward_overlap_<reward>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from spotlight.config import TrainConfig, parse_config
from spotlight.loop.base_policy import build_policy
from spotlight.loop.rollout import group_requests, rollout_plan
from spotlight.loop.streams import candidate_seeds
from spotlight.models.generation import generate
from spotlight.models.policy import to_images
from spotlight.rewards.base import guarded_score
from spotlight.rewards.overlap import sample_and_prefetch
from spotlight.rewards.pool import PooledReward
from spotlight.rewards.registry import build_reward
from spotlight.task_presets import get_task

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `benchmarks.*` imports

from benchmarks.provenance import RESULTS, git_commit, machine


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reward", default="ocr-line", help="reward.name (ocr-line: the task's; ocr: whole-image)")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--groups-per-chunk", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--trainer-core", type=int, default=0)
    parser.add_argument("--worker-core", type=int, default=1)
    args = parser.parse_args()

    os.sched_setaffinity(0, {args.trainer_core})
    torch.set_num_threads(1)
    config: TrainConfig = parse_config(TrainConfig, {
        "task": "ocr", "base_checkpoint": "ocr-base",
        "rollout": {"prompts_per_iteration": args.prompts, "group_size": args.group_size},
        "reward": {"name": args.reward, "overlap_groups": args.groups_per_chunk, "worker_core": args.worker_core}})
    task = get_task("ocr")
    model = build_policy(config)
    prompts = task.split()[0][: args.prompts]
    seeds = candidate_seeds(0, 0, len(prompts), args.group_size)
    expanded, flat_seeds = group_requests(prompts, seeds)
    plan = rollout_plan(config)
    local = build_reward(config.reward, task.make_reward)
    pooled = PooledReward(build_reward, config.reward, task.make_reward, args.worker_core)

    def sample(rows: slice):
        return generate(model, expanded[rows], flat_seeds[rows], plan)

    def after(reward):
        began = time.perf_counter()
        images = to_images(sample(slice(0, len(expanded))).final)
        sampled = time.perf_counter()
        out = guarded_score(reward, images, expanded)
        return time.perf_counter() - began, sampled - began, time.perf_counter() - sampled, out

    def during():
        began = time.perf_counter()
        trajectory = sample_and_prefetch(expanded, args.group_size, args.groups_per_chunk, sample, to_images, pooled)
        sampled = time.perf_counter()
        out = guarded_score(pooled, to_images(trajectory.final), expanded)
        return time.perf_counter() - began, sampled - began, time.perf_counter() - sampled, out

    after(local), during()  # warm-up: first calls allocate and load
    runs: dict[str, list[tuple[float, float, float]]] = {"after, in process": [], "after, worker": [],
                                                         "during, worker": []}
    outputs = {}
    for _ in range(args.repeats):
        for name, run in (("after, in process", lambda: after(local)), ("after, worker", lambda: after(pooled)),
                          ("during, worker", during)):
            total, sampling, tail, out = run()
            runs[name].append((total, sampling, tail))
            outputs[name] = out.rewards
    pooled.close()
    same = all(torch.equal(outputs["after, in process"], rewards) for rewards in outputs.values())
    table = {name: {"rollout_s": statistics.median(r[0] for r in rs), "sampling_s": statistics.median(r[1] for r in rs),
                    "after_sampling_s": statistics.median(r[2] for r in rs), "all_rollout_s": [r[0] for r in rs]}
             for name, rs in runs.items()}
    base = table["after, in process"]["rollout_s"]
    print(f"reward {args.reward}: {len(expanded)} samples ({args.prompts} x {args.group_size}), chunks of "
          f"{args.groups_per_chunk} groups; cores trainer {args.trainer_core}, worker {args.worker_core}")
    print(f"{'scoring':20s} {'rollout s':>10s} {'of it sampling':>15s} {'waiting after':>14s} {'vs after':>9s}")
    for name, row in table.items():
        print(f"{name:20s} {row['rollout_s']:10.2f} {row['sampling_s']:15.2f} {row['after_sampling_s']:14.2f} "
              f"{row['rollout_s'] / base:9.2f}")
    print(f"rewards identical across the three ways: {same}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    result = {"benchmark": "reward_overlap", "commit": git_commit(), "machine": machine(),
              "load_average_at_end": os.getloadavg(), "config": vars(args), "samples": len(expanded),
              "rewards_identical": same, "results": table}
    (RESULTS / f"reward_overlap_{args.reward}.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
