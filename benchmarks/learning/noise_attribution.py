"""Where a rollout's reward variance is decided, and which exploration plans predict the rollout.

Three measurements on a shipped base model (no training), each over the same training prompts:

1. Attribution by step: sample steps [0, k) with one noise stream per (prompt, head), then finish
   steps [k, K) with fresh streams, several tails per head. The variance of the reward between heads
   (of the tails' mean) over the total variance is the share decided before step k: by the initial
   latent and the noise of the first k steps.
2. Sampler quality: mean reward and strict accuracy of the full SDE, of an SDE window (noise on the
   first ``sde_steps`` steps, ODE after) and of the ODE, at the same seeds.
3. Exploration arms: for each arm, the per-prompt correlation of its candidate rewards with the
   rollout rewards of the same seeds (fresh weights), and the rollout group std of the G seeds it
   selects out of N, against G random seeds; for SDE rollouts (flow-grpo) and the ODE rollout (nft,
   where a seed is the initial latent and an arm is a prefix of the rollout's ODE).

    python benchmarks/learning/noise_attribution.py                 # shapes-base
    python benchmarks/learning/noise_attribution.py --task ocr --checkpoint ocr-base
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from spotlight.components.checkpoint import load_model
from spotlight.diffusion.noise import initial_latents
from spotlight.diffusion.sampler import SamplingPlan, sample
from spotlight.explore.candidates import exploration_sampling, score_candidates
from spotlight.explore.planner import ExplorePlan
from spotlight.explore.selection import select_max_variance
from spotlight.models.generation import generate, prompt_tokens, velocity_fn
from spotlight.models.policy import to_images
from spotlight.rewards.base import Reward
from spotlight.task_presets import get_task

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `benchmarks.*` imports

from benchmarks.provenance import RESULTS, git_commit, machine


def score(reward: Reward, latents: torch.Tensor, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """(rewards, strict) of final latents, as floats."""
    out = reward.score(to_images(latents), prompts)
    return out.rewards.float(), out.strict.float()


def attribution(model, reward: Reward, prompts: list[str], plan: SamplingPlan, split: int, heads: int,
                tails: int) -> dict[str, float]:
    """Share of the within-prompt reward variance decided before step ``split`` (see the module docstring)."""
    expanded = [p for p in prompts for _ in range(heads * tails)]
    head_seeds = [10_000 + i * heads + h for i in range(len(prompts)) for h in range(heads) for _ in range(tails)]
    tail_seeds = [500_000 + n for n in range(len(expanded))]
    velocity = velocity_fn(model, prompt_tokens(model, expanded))
    x = initial_latents(head_seeds, model.config.latent_shape)
    head = sample(velocity, head_seeds, plan, model.config.latent_shape, start_latents=x, stop_step=split,
                  record=False)
    tail = sample(velocity, tail_seeds, plan, model.config.latent_shape, start_latents=head.final,
                  start_step=split, record=False)
    rewards = score(reward, tail.final, expanded)[0].view(len(prompts), heads, tails)
    total = rewards.view(len(prompts), -1).var(dim=1, unbiased=False).mean()
    within_head = rewards.var(dim=2, unbiased=False).mean()
    return {"split": split, "total_var": float(total), "decided_before_split": float(1 - within_head / total)}


def per_prompt_correlation(a: torch.Tensor, b: torch.Tensor) -> float:
    a = a - a.mean(dim=1, keepdim=True)
    b = b - b.mean(dim=1, keepdim=True)
    return float(((a * b).sum(dim=1) / (a.norm(dim=1) * b.norm(dim=1)).clamp_min(1e-9)).mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="shapes")
    parser.add_argument("--checkpoint", default="shapes-base")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--num-steps", type=int, default=10)
    parser.add_argument("--shift", type=float, default=3.0)
    parser.add_argument("--noise-level", type=float, default=0.7)
    parser.add_argument("--sde-steps", type=int, default=6)
    parser.add_argument("--splits", type=int, nargs="*", default=[1, 3, 6, 8])
    parser.add_argument("--rollouts", nargs="+", choices=["sde", "ode"], default=["sde", "ode"],
                        help="rollout samplers whose exploration arms are measured (sde: full and window)")
    parser.add_argument("--candidates", type=int, default=16)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--arm-steps", type=int, nargs="+", default=[3, 5, 7, 9, 10])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    started = time.perf_counter()

    task = get_task(args.task)
    reward = task.make_reward(0.5)
    train_prompts, _ = task.split()
    order = torch.randperm(len(train_prompts), generator=torch.Generator().manual_seed(0))
    prompts = [train_prompts[i] for i in order[: args.prompts].tolist()]
    model = load_model(args.checkpoint).eval()
    full_sde = SamplingPlan(args.num_steps, args.shift, "sde", args.noise_level)
    windowed = SamplingPlan(args.num_steps, args.shift, "sde", args.noise_level, sde_steps=args.sde_steps)

    steps = [attribution(model, reward, prompts, full_sde, split, heads=4, tails=8) for split in args.splits]
    for row in steps:
        print(f"full SDE: {row['decided_before_split']:.2f} of the reward variance is decided before step "
              f"{row['split']} of {args.num_steps}")

    expanded = [p for p in prompts for _ in range(args.candidates)]
    seeds = list(range(90_000, 90_000 + len(expanded)))
    candidate_seeds = torch.tensor(seeds).view(len(prompts), args.candidates)
    samplers = {"sde": full_sde, f"sde window {args.sde_steps}": windowed,
                "ode": SamplingPlan(args.num_steps, args.shift, "ode")}
    quality, rollout_rewards = {}, {}
    for name, plan in samplers.items():
        rewards, strict = score(reward, generate(model, expanded, seeds, plan, record=False).final, expanded)
        quality[name] = {"reward": float(rewards.mean()), "strict": float(strict.mean())}
        rollout_rewards[name] = rewards.view(len(prompts), args.candidates)
        print(f"{name:<16} reward {quality[name]['reward']:.3f}  strict {quality[name]['strict']:.3f}")

    arms = []
    for rollout_name, rollout in samplers.items():
        if rollout_name.split()[0] not in args.rollouts:
            continue
        truth = rollout_rewards[rollout_name]
        random_std = float(truth[:, : args.group_size].std(dim=1, unbiased=False).mean())
        for arm_steps in args.arm_steps:
            # with an ODE rollout (nft) every arm is an ODE prefix of it: one arm per S
            for sampler in ("sde", "ode") if rollout.sampler == "sde" else ("ode",):
                sampling = exploration_sampling(ExplorePlan(args.candidates, arm_steps, sampler), rollout)
                explored = score_candidates(model, prompts, candidate_seeds, sampling, reward)
                chosen = torch.stack([select_max_variance(row, args.group_size) for row in explored])
                selected_std = float(torch.gather(truth, 1, chosen).std(dim=1, unbiased=False).mean())
                arms.append({"rollout": rollout_name, "arm_steps": arm_steps, "sampler": sampler,
                             "correlation": per_prompt_correlation(explored, truth),
                             "selected_group_std": selected_std, "random_group_std": random_std})
                print(f"rollout {rollout_name:<14} arm S={arm_steps:<2} {sampler}: correlation "
                      f"{arms[-1]['correlation']:+.3f}, selected group std {selected_std:.3f} "
                      f"(random {random_std:.3f})")

    out = Path(args.out) if args.out else RESULTS / f"noise_attribution_{args.task}.json"
    payload = {"benchmark": "noise_attribution", "commit": git_commit(), "machine": machine(), "args": vars(args),
               "attribution_full_sde": steps, "sampler_quality": quality, "exploration_arms": arms,
               "wall_s": time.perf_counter() - started}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
