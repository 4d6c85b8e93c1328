"""Validation: strict GenEval accuracy of deterministic (ODE) samples at fixed seeds."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from spotlight.diffusion.sampler import SamplingPlan
from spotlight.generation import generate, to_images
from spotlight.models.policy import Policy
from spotlight.rewards.base import Reward, guarded_score
from spotlight.tasks.registry import task_of

VALIDATION_SEED_BASE = 1_000_003  # far from training seeds, which count up from the run seed


@dataclass
class EvalResult:
    """Validation numbers and the images they came from (B, 3, H, W) in [0, 1], prompt-major."""

    strict_accuracy: float
    mean_reward: float
    accuracy_by_kind: dict[str, float]
    images: torch.Tensor
    prompts: list[str]

    @property
    def num_samples(self) -> int:
        return len(self.prompts)

    @property
    def strict_accuracy_se(self) -> float:
        """Binomial standard error of the strict accuracy over the validation samples.

        It measures the noise of scoring a model on these fixed prompts and seeds, the number to
        compare two checkpoints of one run by; it does not include the spread over other prompt sets.
        """
        p = self.strict_accuracy
        return (p * (1.0 - p) / max(self.num_samples, 1)) ** 0.5

    def metrics(self, prefix: str = "val") -> dict[str, float]:
        out = {f"{prefix}/strict_accuracy": self.strict_accuracy, f"{prefix}/reward": self.mean_reward,
               f"{prefix}/strict_accuracy_se": self.strict_accuracy_se}
        out.update({f"{prefix}/accuracy_{kind}": value for kind, value in self.accuracy_by_kind.items()})
        return out


def validation_seeds(num_prompts: int, seeds_per_prompt: int) -> list[int]:
    """Fixed seeds: the same validation noise for every checkpoint, so curves compare like with like."""
    return [VALIDATION_SEED_BASE + i for i in range(num_prompts * seeds_per_prompt)]


def evaluate(
    model: Policy, prompts: Sequence[str], reward: Reward, seeds_per_prompt: int = 4, num_steps: int = 10,
    shift: float = 1.0,
) -> EvalResult:
    """Score ODE samples of every prompt at fixed seeds; returns strict accuracy overall and per kind."""
    expanded = [prompt for prompt in prompts for _ in range(seeds_per_prompt)]
    seeds = validation_seeds(len(prompts), seeds_per_prompt)
    plan = SamplingPlan(num_steps=num_steps, shift=shift, sampler="ode")
    was_training = model.training
    model.eval()
    trajectory = generate(model, expanded, seeds, plan, record=False)
    model.train(was_training)
    images = to_images(trajectory.final)
    scored = guarded_score(reward, images, expanded)
    strict = scored.strict.float()
    kinds = [task_of(model).kind_of(prompt) for prompt in expanded]
    by_kind: dict[str, float] = {}
    for kind in sorted(set(kinds)):
        mask = torch.tensor([k == kind for k in kinds])
        by_kind[kind] = float(strict[mask].mean())
    return EvalResult(
        strict_accuracy=float(strict.mean()),
        mean_reward=float(scored.rewards[scored.valid].mean()) if scored.valid.any() else float("nan"),
        accuracy_by_kind=by_kind,
        images=images,
        prompts=expanded,
    )
