"""Accuracy, robustness and speed of the OCR reward (PP-OCRv4 recogniser) of the text-rendering task.

What is measured (seeded; the renderer is the reference, since it draws exactly the asked-for text):

- Mean reward and exact-match rate on every validation prompt rendered (64) and every prompt of the
  task (train + validation), per kind, clean and degraded as a small generator degrades images:
  Gaussian blur (sigma 0.7 and 1 px), pixel noise (sigma 0.05 and 0.1), blur + noise. The clean
  validation mean must be >= 0.95.
- Wrong text: each clean validation image judged against another validation prompt (the next one
  of the same kind). Should be low: only characters the two texts share by chance earn credit.
- Images with no text: uniform and Gaussian noise, an untrained generator's output, black, grey,
  white. Mean reward should be ~0.
- Speed: wall time to score one batch of 128 lines (median of 3), after a warm-up call.

Run: nice -n 19 .venv/bin/python benchmarks/rewards/ocr_reward_accuracy.py  (~1-2 min on 1 thread)
Writes benchmarks/results/ocr_reward_accuracy.json.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from spotlight.rewards.ocr.reward import OCRReward
from spotlight.tasks.text import KINDS, kind_of, train_val_split
from spotlight.tasks.text_render import HEIGHT, WIDTH, render_batch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `benchmarks.*` imports

from benchmarks.provenance import RESULTS, git_commit, machine
from benchmarks.rewards.probe_images import add_noise, empty_images, gaussian_blur

NOISE_SEED = 7
SPEED_BATCH = 128


def degradations(generator: torch.Generator) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
    def noisy(images: torch.Tensor, sigma: float) -> torch.Tensor:
        return add_noise(images, sigma, generator)

    return {
        "clean": lambda x: x,
        "gaussian blur s=0.7": lambda x: gaussian_blur(x, 0.7),
        "gaussian blur s=1": lambda x: gaussian_blur(x, 1.0),
        "noise s=0.05": lambda x: noisy(x, 0.05),
        "noise s=0.1": lambda x: noisy(x, 0.1),
        "gaussian blur s=0.7 + noise s=0.1": lambda x: noisy(gaussian_blur(x, 0.7), 0.1),
    }


def per_kind(prompts: list[str], rewards: torch.Tensor, strict: torch.Tensor) -> dict[str, dict[str, float]]:
    kinds = [kind_of(prompt) for prompt in prompts]
    table = {}
    for kind in (*KINDS, "all"):
        rows = [i for i, k in enumerate(kinds) if kind in (k, "all")]
        table[kind] = {"images": len(rows), "exact_match": float(strict[rows].float().mean()),
                       "mean_reward": float(rewards[rows].mean())}
    return table


def other_prompt(prompts: list[str]) -> list[str]:
    """For each prompt, the next prompt of the same kind (cyclically): a wrong text of the same alphabet."""
    by_kind = {kind: [p for p in prompts if kind_of(p) == kind] for kind in KINDS}
    return [by_kind[kind_of(p)][(by_kind[kind_of(p)].index(p) + 1) % len(by_kind[kind_of(p)])] for p in prompts]


def main() -> None:
    torch.set_num_threads(1)
    started = time.perf_counter()
    reward = OCRReward(num_threads=1)
    train, validation = train_val_split()
    generator = torch.Generator().manual_seed(NOISE_SEED)
    val_images = (render_batch(validation) + 1) / 2
    warm = time.perf_counter()
    reward.score(val_images[:1], validation[:1])
    load_s = time.perf_counter() - warm

    accuracy = {}
    for name, degrade in degradations(generator).items():
        out = reward.score(degrade(val_images), validation)
        accuracy[name] = per_kind(validation, out.rewards, out.strict)
    every = train + validation
    out = reward.score((render_batch(every) + 1) / 2, every)
    all_prompts = per_kind(every, out.rewards, out.strict)
    misread = [f"{p}: score {r:.2f}" for p, r in zip(every, out.rewards.tolist(), strict=True) if r < 1]

    judged_wrong = reward.score(val_images, other_prompt(validation))
    wrong_text = per_kind(validation, judged_wrong.rewards, judged_wrong.strict)

    no_text = {}
    for name, batch in empty_images(generator, len(validation), HEIGHT, WIDTH).items():
        out = reward.score(batch, validation)
        no_text[name] = {"mean_reward": float(out.rewards.mean()), "exact_match": float(out.strict.float().mean())}

    speed_images = val_images.repeat(2, 1, 1, 1)[:SPEED_BATCH]
    speed_prompts = (validation * 2)[:SPEED_BATCH]
    timings = []
    for _ in range(3):
        tick = time.perf_counter()
        reward.score(speed_images, speed_prompts)
        timings.append(time.perf_counter() - tick)
    score_s = statistics.median(timings)

    print(f"OCR reward on the {len(validation)} rendered validation prompts (exact match / mean reward)")
    print(f"{'condition':<36}" + "".join(f"{kind:>16}" for kind in (*KINDS, "all")))

    def row(name: str, table: dict[str, dict[str, float]]) -> None:
        cells = "".join(f"{table[k]['exact_match']:>8.3f} / {table[k]['mean_reward']:.3f}" for k in (*KINDS, "all"))
        print(f"{name:<36}{cells}")

    for name, table in accuracy.items():
        row(name, table)
    row(f"all {len(every)} prompts, clean", all_prompts)
    row("wrong text (next prompt's text)", wrong_text)
    print("misread clean prompts: " + ("; ".join(misread) if misread else "none"))
    print("\nimages with no text (mean reward / exact match)")
    for name, values in no_text.items():
        print(f"  {name:<36}{values['mean_reward']:>8.4f} / {values['exact_match']:.3f}")
    print(f"\nload {load_s:.1f} s; score a batch of {SPEED_BATCH}: {score_s:.2f} s "
          f"({SPEED_BATCH / score_s:.0f} lines/s)")

    RESULTS.mkdir(parents=True, exist_ok=True)
    payload = {
        "benchmark": "ocr_reward_accuracy",
        "commit": git_commit(),
        "machine": {**machine(), "torch_threads": torch.get_num_threads(), "onnx_threads": 1},
        "config": {"validation_prompts": len(validation), "all_prompts": len(every), "noise_seed": NOISE_SEED,
                   "speed_batch": SPEED_BATCH, "image": [HEIGHT, WIDTH]},
        "accuracy": accuracy,
        "all_prompts_clean": all_prompts,
        "misread_clean": misread,
        "wrong_text": wrong_text,
        "no_text": no_text,
        "speed": {"load_s": load_s, "score_batch_s": score_s, "lines_per_s": SPEED_BATCH / score_s},
        "elapsed_s": time.perf_counter() - started,
    }
    temporary = RESULTS / "ocr_reward_accuracy.json.tmp"
    temporary.write_text(json.dumps(payload, indent=2) + "\n")
    temporary.replace(RESULTS / "ocr_reward_accuracy.json")


if __name__ == "__main__":
    main()
