"""Validation: the reward of deterministic (ODE) samples of the test prompts at fixed seeds.

It reports the reward's mean and its strict accuracy (the share of samples the reward calls exactly
right, GenEval's measure), overall and per prompt kind where the dataset names kinds (GenEval's
``tag``, a toy task's grammar). A reward without a notion of "exactly right" (``has_strict = False``,
e.g. a preference model or a user's function) is judged by its mean: `EvalResult.score` is what a
run keeps its best checkpoint by.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from spotlight.diffusion.sampler import SamplingPlan
from spotlight.models.generation import generate, images_of
from spotlight.models.policy import Policy
from spotlight.rewards.base import Reward, guarded_score
from spotlight.task_presets import get_task

KindOf = Callable[[str], str | None]  # a prompt's kind (GenEval's tag), None when it has none

VALIDATION_SEED_BASE = 1_000_003  # far from training seeds, which count up from the run seed

# Validation samples in chunks of this many (prompt, seed) rows, wherever a chunk runs: a row's value may
# depend on how many rows share its model call (CPU and GPU kernels pick their reduction order by shape), so
# chunks of one fixed size make validation the same bits on the trainer alone or split with spot devices.
VALIDATION_CHUNK = 32

# Final latents (B, ...) of validation's rows: (model, prompts, seeds, plan) -> latents, sampled in
# `validation_chunks`; `sample_validation` here, or a backend's `validation_samples` sharing the chunks out.
ValidationSampler = Callable[[Policy, list[str], list[int], SamplingPlan], torch.Tensor]


def validation_subset(prompts: Sequence[str], count: int | None) -> list[str]:
    """``count`` prompts spread evenly over ``prompts`` (all of them when ``count`` is None or not smaller).

    Evenly spaced rather than the first ``count``: a dataset listed kind by kind keeps every kind in a
    quick validation. The subset is a pure function of the list, so every validation of a run, and a
    resumed run's, scores the same prompts.
    """
    if count is None or count >= len(prompts):
        return list(prompts)
    return [prompts[index * len(prompts) // count] for index in range(count)]


@dataclass
class EvalResult:
    """Validation numbers and the images they came from (B, 3, H, W) in [0, 1], prompt-major.

    ``by_kind``: strict accuracy per kind, or the reward's mean per kind when the reward has no strict flag.
    """

    strict_accuracy: float
    mean_reward: float
    accuracy_by_kind: dict[str, float]
    images: torch.Tensor
    prompts: list[str]
    has_strict: bool = True
    rewards: torch.Tensor | None = None  # each sample's reward (B,), for the trackers' captions
    held_out_reward: float | None = None  # the mean of eval.held_out_reward on the same images, if set
    selects_held_out: bool = False  # eval.select_by held_out: the held-out reward picks the best model

    @property
    def score(self) -> float:
        """What a run selects its best checkpoint by: strict accuracy, or the mean reward without a strict flag
        (or, with ``eval.select_by held_out``, the held-out reward's mean)."""
        if self.selects_held_out and self.held_out_reward is not None:
            return self.held_out_reward
        return self.strict_accuracy if self.has_strict else self.mean_reward

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
        strict_score = self.has_strict and not (self.selects_held_out and self.held_out_reward is not None)
        out = {f"{prefix}/strict_accuracy": self.strict_accuracy, f"{prefix}/reward": self.mean_reward,
               f"{prefix}/strict_accuracy_se": self.strict_accuracy_se, f"{prefix}/score": self.score,
               f"{prefix}/score_is_strict": float(strict_score)}
        if self.held_out_reward is not None:
            out[f"{prefix}/held_out_reward"] = self.held_out_reward
        per_kind = "accuracy" if self.has_strict else "reward"
        out.update({f"{prefix}/{per_kind}_{kind}": value for kind, value in self.accuracy_by_kind.items()})
        return out


def score_is_strict(record: dict[str, Any]) -> bool:
    """Whether a validation record's score (``val/score``, what picks the best model) is strict accuracy.

    False for a reward without a strict flag, whose score is the mean reward; a record written before
    ``val/score_is_strict`` was logged counts as strict when it has no separate score or the two agree.
    """
    flag = record.get("val/score_is_strict")
    if flag is not None:
        return bool(flag)
    return "val/score" not in record or record["val/score"] == record.get("val/strict_accuracy")


def score_name(record: dict[str, Any]) -> str:
    """``strict accuracy`` or ``mean reward``: the name of the score that picks a run's best model."""
    return "strict accuracy" if score_is_strict(record) else "mean reward"


def validation_seeds(num_prompts: int, seeds_per_prompt: int) -> list[int]:
    """Fixed seeds: the same validation noise for every checkpoint, so curves compare like with like."""
    return [VALIDATION_SEED_BASE + i for i in range(num_prompts * seeds_per_prompt)]


def validation_chunks(rows: int) -> list[slice]:
    """Validation's units of work: consecutive chunks of `VALIDATION_CHUNK` rows (the last may be shorter)."""
    return [slice(start, min(start + VALIDATION_CHUNK, rows)) for start in range(0, rows, VALIDATION_CHUNK)]


def sample_validation(model: Policy, prompts: list[str], seeds: list[int], plan: SamplingPlan) -> torch.Tensor:
    """The final latents of validation's rows, sampled here chunk by chunk (`validation_chunks`)."""
    return torch.cat([generate(model, prompts[rows], seeds[rows], plan, record=False).final
                      for rows in validation_chunks(len(prompts))])


def model_kind_of(model: Policy) -> KindOf | None:
    """The prompt kinds of the toy task a model was built for (its ``config.task``); None for a model of no task."""
    task = model.config.task
    return None if task is None else get_task(task).kind_of


def evaluate(
    model: Policy, prompts: Sequence[str], reward: Reward, seeds_per_prompt: int = 4, num_steps: int = 10,
    shift: float = 1.0, kind_of: KindOf | None = None, schedule: SamplingPlan | None = None,
    sampler: ValidationSampler | None = None, held_out: Reward | None = None, select_held_out: bool = False,
) -> EvalResult:
    """Score ODE samples of every prompt at fixed seeds: the reward's mean and strict accuracy, overall and per kind.

    ``kind_of`` names each prompt's kind (a dataset's `PromptDataset.kind_of`); None: the kinds of the
    model's toy task, if it has one. Prompts of no kind are left out of the per-kind numbers. ``held_out``
    (``eval.held_out_reward``) scores the same images too; with ``select_held_out`` it is the result's score.
    ``schedule``: the rollout's plan (or a pipeline's `ScheduleParams`), whose sigma schedule validation
    keeps with its own ``num_steps`` of ODE; None: the policy's own scheduler if it has one (a pipeline
    folder), else Spotlight's schedule with ``shift``. ``sampler``: where the samples are drawn (a backend's
    `validation_samples`, which may share the chunks with spot devices); None: here (`sample_validation`).
    Either way the same bits: each chunk is a pure function of (weights, its prompts, its seeds, plan).
    """
    expanded = [prompt for prompt in prompts for _ in range(seeds_per_prompt)]
    seeds = validation_seeds(len(prompts), seeds_per_prompt)
    plan = SamplingPlan(num_steps=num_steps, shift=shift, sampler="ode")
    if schedule is None:
        schedule = model.schedule()  # a pipeline policy's scheduler (spotlight eval CHECKPOINT), else None
    if schedule is not None:
        plan = SamplingPlan(num_steps=num_steps, shift=schedule.shift, sampler="ode", grid_end=schedule.grid_end,
                            shift_terminal=schedule.shift_terminal)
    was_training = model.training
    model.eval()
    latents = (sample_validation if sampler is None else sampler)(model, expanded, seeds, plan)
    model.train(was_training)
    images = images_of(model, latents)
    scored = guarded_score(reward, images, expanded)
    strict = scored.strict.float()
    has_strict = bool(getattr(reward, "has_strict", True))
    kind_of = kind_of if kind_of is not None else model_kind_of(model)
    kinds = [kind_of(prompt) for prompt in expanded] if kind_of is not None else [None] * len(expanded)
    by_kind: dict[str, float] = {}
    for kind in sorted({kind for kind in kinds if kind is not None}):
        mask = torch.tensor([k == kind for k in kinds])
        if has_strict:
            by_kind[kind] = float(strict[mask].mean())
        elif (scored.valid & mask).any():
            by_kind[kind] = float(scored.rewards[scored.valid & mask].mean())
    return EvalResult(
        strict_accuracy=float(strict.mean()),
        mean_reward=float(scored.rewards[scored.valid].mean()) if scored.valid.any() else float("nan"),
        accuracy_by_kind=by_kind,
        images=images,
        prompts=expanded,
        has_strict=has_strict,
        rewards=scored.rewards,
        held_out_reward=None if held_out is None else held_out_mean(held_out, images, expanded),
        selects_held_out=select_held_out,
    )


def held_out_mean(reward: Reward, images: torch.Tensor, prompts: list[str]) -> float:
    """The mean of a held-out reward (``eval.held_out_reward``) over validation's images (its valid samples)."""
    scored = guarded_score(reward, images, prompts)
    return float(scored.rewards[scored.valid].mean()) if scored.valid.any() else float("nan")


def validation_score(record: dict[str, Any]) -> float:
    """What picks the best validation: strict accuracy, or the mean reward of a reward without a strict flag."""
    return record.get("val/score", record["val/strict_accuracy"])


def validated(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records of a run's history that carry a validation."""
    return [record for record in history if "val/strict_accuracy" in record]


def describe_score(record: dict[str, Any]) -> str:
    """``val strict accuracy 0.412`` (or ``val mean reward 0.731`` for a reward without a strict flag)."""
    return f"val {score_name(record)} {validation_score(record):.3f}"
