"""The whole-image OCR reward (`reward.name: ocr`) on rendered 512x512 scenes: right vs wrong text, and speed.

Each scene (spotlight/rewards/ocr/scenes.py) paints a phrase of the OCR task's words in one of 12
fonts (DejaVu, STIX, Computer Modern; regular, bold, italic), 20-80 px, rotated up to +-30 degrees
in 70% of scenes, anywhere in a flat / gradient / noise background cluttered with shapes and lines.
Half the scenes paint the phrase the prompt quotes ("right"); the other half paint a phrase that
does not contain it ("wrong"). The reward is flow_grpo's (1 - capped normalised edit distance, a
contained target scores 1) over rapidocr's PP-OCRv4 detector + recogniser, real weights.

Printed: both reward distributions (mean, quantiles, histogram), exact-match rates, the right
scenes' mean by rotation and font, and images/s of scoring (rendering excluded), in batches of
`--batch` on `--threads` onnxruntime threads, per wall second and per CPU-second of the scoring
process (on a shared machine the second is the one that does not depend on the neighbours' load).

Run: nice -n 10 .venv/bin/python benchmarks/rewards/ocr_reward_scenes.py --scenes 500
Writes benchmarks/results/ocr_reward_scenes.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

from spotlight.rewards.base import guarded_score
from spotlight.rewards.ocr.scene import SceneOCRReward
from spotlight.rewards.ocr.scenes import render_scene

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `benchmarks.*` imports

from benchmarks.provenance import RESULTS, git_commit, machine

BINS = (0.0, 0.2, 0.4, 0.6, 0.8, 0.9, 1.0)


def distribution(values: list[float]) -> dict[str, object]:
    """Mean, quantiles and a histogram over BINS (the last bin is exactly 1.0)."""
    ordered = sorted(values)

    def quantile(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    histogram = {f"[{low:.1f},{high:.1f})": sum(low <= v < high for v in values)
                 for low, high in zip(BINS, BINS[1:], strict=False)}
    histogram["1.0"] = sum(v == 1.0 for v in values)
    return {"n": len(values), "mean": statistics.fmean(values), "min": ordered[0], "p10": quantile(0.1),
            "median": quantile(0.5), "p90": quantile(0.9), "max": ordered[-1], "histogram": histogram}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenes", type=int, default=500, help="scenes in all, half right and half wrong")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1, help="onnxruntime intra-op threads")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", default="ocr_reward_scenes.json", help="file name under benchmarks/results/")
    args = parser.parse_args()

    scenes = [render_scene(args.seed * 1_000_000 + index, correct=index % 2 == 0) for index in range(args.scenes)]
    reward = SceneOCRReward(num_threads=args.threads)
    guarded_score(reward, scenes[0].image[None], [scenes[0].prompt])  # warm-up: sessions, first allocations
    rewards: list[float] = []
    strict: list[bool] = []
    scoring_s = scoring_cpu_s = 0.0
    for start in range(0, len(scenes), args.batch):
        chunk = scenes[start : start + args.batch]
        images = torch.stack([scene.image for scene in chunk])
        began, began_cpu = time.perf_counter(), time.process_time()
        out = guarded_score(reward, images, [scene.prompt for scene in chunk])
        scoring_s += time.perf_counter() - began
        scoring_cpu_s += time.process_time() - began_cpu  # a shared machine's load slows wall time, not this
        rewards += out.rewards.tolist()
        strict += out.strict.tolist()

    right = [r for r, s in zip(rewards, scenes, strict=True) if s.correct]
    wrong = [r for r, s in zip(rewards, scenes, strict=True) if not s.correct]
    by_angle: dict[str, list[float]] = defaultdict(list)
    by_font: dict[str, list[float]] = defaultdict(list)
    for value, scene in zip(rewards, scenes, strict=True):
        if scene.correct:
            by_angle["0" if scene.angle == 0 else "<=15" if abs(scene.angle) <= 15 else ">15"].append(value)
            by_font[scene.font].append(value)
    result = {
        "benchmark": "ocr_reward_scenes", "commit": git_commit(), "machine": machine(),
        "config": {"scenes": args.scenes, "batch": args.batch, "threads": args.threads, "seed": args.seed,
                   "size": 512, "reward": "ocr (rapidocr PP-OCRv4 det + rec, flow_grpo scoring)"},
        "right": distribution(right), "wrong": distribution(wrong),
        "right_exact": sum(s for s, sc in zip(strict, scenes, strict=True) if sc.correct) / len(right),
        "wrong_exact": sum(s for s, sc in zip(strict, scenes, strict=True) if not sc.correct) / len(wrong),
        "gap": statistics.fmean(right) - statistics.fmean(wrong),
        "right_by_angle": {k: statistics.fmean(v) for k, v in sorted(by_angle.items())},
        "right_by_font": {k: statistics.fmean(v) for k, v in sorted(by_font.items())},
        "scoring_s": scoring_s, "images_per_s": len(scenes) / scoring_s, "scoring_cpu_s": scoring_cpu_s,
        "images_per_cpu_s": len(scenes) / scoring_cpu_s, "load_average_at_end": os.getloadavg(),
        "worst_right": sorted((r, s.painted, s.font, s.font_size, round(s.angle))
                              for r, s in zip(rewards, scenes, strict=True) if s.correct)[:10],
    }
    for name in ("right", "wrong"):
        d = result[name]
        print(f"{name:5s} n={d['n']} mean={d['mean']:.3f} min={d['min']:.2f} p10={d['p10']:.2f} "
              f"median={d['median']:.2f} p90={d['p90']:.2f}  exact={result[name + '_exact']:.3f}  "
              f"hist={d['histogram']}")
    print(f"gap (right mean - wrong mean) = {result['gap']:.3f}")
    print("right by rotation:", {k: round(v, 3) for k, v in result["right_by_angle"].items()})
    print("right by font:", {k: round(v, 3) for k, v in result["right_by_font"].items()})
    print(f"speed: {result['images_per_s']:.2f} images/s wall, {result['images_per_cpu_s']:.2f} images per CPU-second "
          f"({args.threads} thread(s), batch {args.batch}, 512x512; load average {os.getloadavg()[0]:.1f})")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / args.output).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
