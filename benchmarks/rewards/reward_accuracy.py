"""Accuracy, robustness and speed of the GenEval-style reward of the shapes task.

What is measured (all seeded; the renderer is the reference, since it draws exactly the prompt):

- Strict accuracy and mean reward on 1,000 rendered images of the validation prompts (12-13 per
  prompt), per prompt kind, clean and degraded the ways a small generator degrades images:
  3x3 and 5x5 box blur, Gaussian blur (sigma 1 and 1.5 px), pixel noise (sigma 0.05 and 0.1),
  blur + noise, and dimming (x0.7).
- False strict rate: the same clean images judged against a wrong prompt (a swapped relation,
  a count off by one, one object of a pair only, a changed colour). Should be 0.
- Images with no object: Gaussian noise N(0, 1) clamped to [0, 1], an untrained generator's
  output (N(0, 1) in model space [-1, 1], mapped to [0, 1]), uniform noise, black, grey, white.
  Mean reward should be low (< 0.1) and strict ~0.
- Speed: render throughput (images/s) and the wall time to score one batch of 256 (median of 5).

Run: .venv/bin/python benchmarks/rewards/reward_accuracy.py  (~20 s on 2 cores)
Writes benchmarks/results/reward_accuracy.json.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from spotlight.rewards.geneval.reward import GenEvalReward
from spotlight.tasks.render import render_batch
from spotlight.tasks.shapes import COUNT_WORDS, KINDS, ObjectSpec, PromptSpec, parse_prompt, train_val_split

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `benchmarks.*` imports

from benchmarks.provenance import RESULTS, git_commit, machine
from benchmarks.rewards.probe_images import add_noise, box_blur, empty_images, gaussian_blur

NUM_IMAGES = 1000
RENDER_SEED = 20_251_122
NOISE_SEED = 7
SPEED_BATCH = 256


def degradations(generator: torch.Generator) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
    def noisy(images: torch.Tensor, sigma: float) -> torch.Tensor:
        return add_noise(images, sigma, generator)

    return {
        "clean": lambda x: x,
        "box blur 3x3": lambda x: box_blur(x, 3),
        "box blur 5x5": lambda x: box_blur(x, 5),
        "gaussian blur s=1": lambda x: gaussian_blur(x, 1.0),
        "gaussian blur s=1.5": lambda x: gaussian_blur(x, 1.5),
        "noise s=0.05": lambda x: noisy(x, 0.05),
        "noise s=0.1": lambda x: noisy(x, 0.1),
        "box blur 3x3 + noise s=0.05": lambda x: noisy(box_blur(x, 3), 0.05),
        "box blur 3x3 + noise s=0.1": lambda x: noisy(box_blur(x, 3), 0.1),
        "dimmed x0.7": lambda x: x * 0.7,
    }


def wrong_prompt(text: str) -> str:
    """A prompt that the image of `text` does not satisfy: each kind changed where it is judged."""
    spec = parse_prompt(text)
    first = spec.objects[0]
    if spec.kind == "position":
        swapped = {"left of": "right of", "right of": "left of", "above": "below", "below": "above"}
        return PromptSpec("position", spec.objects, swapped[spec.relation]).text
    if spec.kind == "counting":
        count = first.count + 1 if first.count + 1 in COUNT_WORDS else first.count - 1
        return PromptSpec("counting", (ObjectSpec(first.colour, first.shape, count),)).text
    if spec.kind == "two_object":
        return PromptSpec("single", (first,)).text  # the second object is then an extra one
    other = "blue" if first.colour != "blue" else "red"
    return PromptSpec("single", (ObjectSpec(other, first.shape),)).text


def per_kind(texts: list[str], rewards: torch.Tensor, strict: torch.Tensor) -> dict[str, dict[str, float]]:
    kinds = [parse_prompt(text).kind for text in texts]
    table = {}
    for kind in (*KINDS, "all"):
        rows = [i for i, k in enumerate(kinds) if kind in (k, "all")]
        table[kind] = {
            "images": len(rows),
            "strict_accuracy": float(strict[rows].float().mean()),
            "mean_reward": float(rewards[rows].mean()),
        }
    return table


def main() -> None:
    torch.set_num_threads(1)
    started = time.perf_counter()
    reward = GenEvalReward()
    validation = train_val_split()[1]
    texts = [validation[i % len(validation)] for i in range(NUM_IMAGES)]
    generator = torch.Generator().manual_seed(NOISE_SEED)

    render_started = time.perf_counter()
    images = (render_batch(texts, seed=RENDER_SEED) + 1) / 2
    render_rate = NUM_IMAGES / (time.perf_counter() - render_started)

    accuracy = {}
    for name, degrade in degradations(generator).items():
        out = reward.score(degrade(images), texts)
        accuracy[name] = per_kind(texts, out.rewards, out.strict)

    wrong = [wrong_prompt(text) for text in texts]
    judged_wrong = reward.score(images, wrong)
    false_strict = per_kind(texts, judged_wrong.rewards, judged_wrong.strict)

    no_object = {}
    for name, batch in empty_images(generator, NUM_IMAGES, 32, 32).items():
        out = reward.score(batch, texts)
        no_object[name] = {
            "mean_reward": float(out.rewards.mean()),
            "strict_rate": float(out.strict.float().mean()),
        }

    speed_batch, speed_texts = images[:SPEED_BATCH], texts[:SPEED_BATCH]
    timings = []
    for _ in range(5):
        tick = time.perf_counter()
        reward.score(speed_batch, speed_texts)
        timings.append(time.perf_counter() - tick)
    score_s = statistics.median(timings)

    print(f"reward accuracy on {NUM_IMAGES} rendered validation images (strict accuracy / mean reward)")
    header = f"{'condition':<30}" + "".join(f"{kind:>18}" for kind in (*KINDS, "all"))
    print(header)
    for name, table in accuracy.items():
        cells = "".join(
            f"{table[k]['strict_accuracy']:>10.3f} / {table[k]['mean_reward']:.2f}" for k in (*KINDS, "all")
        )
        print(f"{name:<30}{cells}")
    cells = "".join(
        f"{false_strict[k]['strict_accuracy']:>10.3f} / {false_strict[k]['mean_reward']:.2f}"
        for k in (*KINDS, "all")
    )
    print(f"{'wrong prompt (false strict)':<30}{cells}")
    print("\nimages with no object (mean reward / strict rate)")
    for name, row in no_object.items():
        print(f"  {name:<36}{row['mean_reward']:>8.4f} / {row['strict_rate']:.3f}")
    print(
        f"\nrender: {render_rate:,.0f} images/s; score a batch of {SPEED_BATCH}: {score_s * 1000:.0f} ms "
        f"({SPEED_BATCH / score_s:,.0f} images/s)"
    )

    RESULTS.mkdir(parents=True, exist_ok=True)
    payload = {
        "benchmark": "reward_accuracy",
        "commit": git_commit(),
        "machine": {**machine(), "torch_threads": torch.get_num_threads()},
        "config": {
            "num_images": NUM_IMAGES,
            "validation_prompts": len(validation),
            "render_seed": RENDER_SEED,
            "noise_seed": NOISE_SEED,
            "speed_batch": SPEED_BATCH,
        },
        "accuracy": accuracy,
        "wrong_prompt": false_strict,
        "no_object": no_object,
        "speed": {
            "render_images_per_s": render_rate,
            "score_batch_s": score_s,
            "score_images_per_s": SPEED_BATCH / score_s,
        },
        "elapsed_s": time.perf_counter() - started,
    }
    temporary = RESULTS / "reward_accuracy.json.tmp"
    temporary.write_text(json.dumps(payload, indent=2) + "\n")
    temporary.replace(RESULTS / "reward_accuracy.json")


if __name__ == "__main__":
    main()
