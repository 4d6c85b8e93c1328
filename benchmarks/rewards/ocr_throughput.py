"""The OCR reward's images per second: one thread against the pool of OCR threads, and overlap off against on.

On rendered 512x512 scenes (`spotlight.rewards.ocr.scenes`, the text-rendering task's images), real
PP-OCRv4 weights:

1. **one thread**: the reward with one OCR worker (``reward.workers=1``): every image's detection and
   recognition in sequence on the calling thread, what scoring after sampling cost before;
2. **pool**: the same images read by ``--workers`` threads, each with its own ONNX sessions (default:
   the cores this process may use; `spotlight.rewards.ocr.scene.pool_size`). Scores must be identical;
3. **overlap off / on**: a rollout of ``--chunks`` chunks whose sampling is a stand-in that keeps one
   core busy for ``--sample-s`` per chunk (matrix products on one torch thread, as a CPU sampler; on a
   GPU the sampler would leave the host's cores to the reward altogether). Off: sample every chunk,
   then score the rollout. On: each finished chunk is handed to the overlapped reward
   (`spotlight.rewards.background.BackgroundReward`) and scored while the next samples. The rollout's
   wall time is compared with sampling alone.

Each measurement is repeated ``--repeats`` times interleaved; the median and the range are printed.
Times are wall seconds; on a shared machine the neighbours' load moves them, so compare within one run.

    .venv/bin/python benchmarks/rewards/ocr_throughput.py                 # ~1-2 minutes on 2 cores
    .venv/bin/python benchmarks/rewards/ocr_throughput.py --images 64 --workers 8

Writes benchmarks/results/ocr_throughput.json (commit, machine, load average, every time).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from spotlight.diffusion.sampler import Trajectory
from spotlight.rewards.background import BackgroundReward
from spotlight.rewards.base import guarded_score
from spotlight.rewards.ocr.scene import SceneOCRReward, pool_size
from spotlight.rewards.ocr.scenes import render_scene
from spotlight.rewards.overlap import sample_and_prefetch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `benchmarks.*` imports

from benchmarks.provenance import RESULTS, git_commit, machine


def busy(seconds: float) -> None:
    """Keep this thread's core busy for ``seconds`` with matrix products (a stand-in for a CPU sampler)."""
    a = torch.randn(256, 256)
    ended = time.perf_counter() + seconds
    while time.perf_counter() < ended:
        a = torch.tanh(a @ a)


CPU_SECONDS: list[float] = []  # the process's CPU seconds of each `timed` call (every thread's)


def timed(run: Callable[[], Any]) -> tuple[float, Any]:
    started, cpu_started = time.perf_counter(), time.process_time()
    out = run()
    CPU_SECONDS.append(time.process_time() - cpu_started)
    return time.perf_counter() - started, out


def summary(seconds: list[float], images: int, cpu_seconds: list[float] | None = None) -> dict[str, Any]:
    median = statistics.median(seconds)
    row = {"s_median": median, "s_min": min(seconds), "s_max": max(seconds), "images_per_s": images / median,
           "all_s": seconds}
    if cpu_seconds:  # on a shared machine the one that does not depend on the neighbours' load
        row["images_per_cpu_s"] = images / statistics.median(cpu_seconds)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=32)
    parser.add_argument("--workers", type=int, default=None, help="the pool's threads (default: the cores here)")
    parser.add_argument("--chunks", type=int, default=4, help="chunks of the overlap rollout")
    parser.add_argument("--sample-s", type=float, default=None,
                        help="seconds of stand-in sampling per chunk (default: one chunk's one-thread scoring time)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(RESULTS / "ocr_throughput.json"))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # the sampler stand-in: one thread, as a pinned CPU trainer samples
    workers = args.workers or len(os.sched_getaffinity(0))
    scenes = [render_scene(seed, correct=seed % 2 == 0) for seed in range(args.images)]
    images = torch.stack([scene.image for scene in scenes])
    prompts = [scene.prompt for scene in scenes]
    one, pool = SceneOCRReward(workers=1), SceneOCRReward(workers=workers)
    guarded_score(one, images[:2], prompts[:2]), guarded_score(pool, images[:workers], prompts[:workers])  # warm-up

    rows: dict[str, list[float]] = {"one thread": [], f"pool of {workers}": []}
    cpu: dict[str, list[float]] = {name: [] for name in rows}
    outputs = {}
    for _ in range(args.repeats):
        for name, reward in (("one thread", one), (f"pool of {workers}", pool)):
            seconds, out = timed(lambda reward=reward: guarded_score(reward, images, prompts))
            rows[name].append(seconds)
            cpu[name].append(CPU_SECONDS[-1])
            outputs[name] = out.rewards
    identical = torch.equal(outputs["one thread"], outputs[f"pool of {workers}"])

    per_chunk = args.images // args.chunks
    sample_s = args.sample_s if args.sample_s is not None else statistics.median(rows["one thread"]) / args.chunks
    latents = images[:, None] * 2 - 1

    def sample_chunk(chunk_rows: slice) -> Trajectory:
        busy(sample_s)
        return Trajectory(latents[chunk_rows], torch.zeros(latents[chunk_rows].shape[0], 0), 0)

    def rollout(reward: Any, overlap: bool) -> Any:
        if not overlap:
            for start in range(0, args.images, per_chunk):
                sample_chunk(slice(start, start + per_chunk))
            return guarded_score(reward, images, prompts)
        trajectory = sample_and_prefetch(prompts, per_chunk, 1, sample_chunk, lambda x: (x + 1) / 2, reward)
        return reward.collect(prompts, trajectory.final)

    overlapped = BackgroundReward(pool)
    rollouts: dict[str, list[float]] = {"sampling alone": [], "overlap off (pool after sampling)": [],
                                        "overlap on (pool during sampling)": []}
    for _ in range(args.repeats):
        rollouts["sampling alone"].append(timed(lambda: [busy(sample_s) for _ in range(args.chunks)])[0])
        seconds, out = timed(lambda: rollout(pool, overlap=False))
        rollouts["overlap off (pool after sampling)"].append(seconds)
        seconds, overlapped_out = timed(lambda: rollout(overlapped, overlap=True))
        rollouts["overlap on (pool during sampling)"].append(seconds)
        identical &= torch.equal(out.rewards, overlapped_out.rewards)

    scoring = {name: summary(seconds, args.images, cpu[name]) for name, seconds in rows.items()}
    rollout_table = {name: summary(seconds, args.images) for name, seconds in rollouts.items()}
    print(f"{args.images} scenes 512x512, {workers} OCR workers (pool_size default here: {pool_size()}), "
          f"{len(os.sched_getaffinity(0))} cores, load average {os.getloadavg()[0]:.1f}")
    print(f"{'scoring':38s} {'s (median)':>10s} {'range':>13s} {'images/s':>9s} {'images/CPU-s':>12s}")
    for name, row in {**scoring, **rollout_table}.items():
        per_cpu = f"{row['images_per_cpu_s']:12.2f}" if "images_per_cpu_s" in row else f"{'':12s}"
        print(f"{name:38s} {row['s_median']:10.2f} {row['s_min']:6.2f}-{row['s_max']:<6.2f} {row['images_per_s']:9.2f} "
              f"{per_cpu}")
    print(f"stand-in sampling: {args.chunks} chunks x {sample_s:.2f} s; scores identical on every path: {identical}")
    result = {"benchmark": "ocr_throughput", "commit": git_commit(), "machine": machine(),
              "load_average_at_end": os.getloadavg(), "config": {**vars(args), "workers": workers,
                                                                "sample_s": sample_s},
              "scores_identical": identical, "scoring": scoring, "rollout": rollout_table}
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as handle:
        handle.write(json.dumps(result, indent=1) + "\n")
    pool.reader.close()
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
