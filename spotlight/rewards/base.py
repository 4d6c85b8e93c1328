"""The reward interface, and the guard that keeps one bad sample from failing a batch.

A reward maps images (B, 3, H, W) in [0, 1] and their prompts to one number per image. Rewards run
code that can fail on odd inputs (a detector, an OCR model, a remote server); `guarded_score`
confines such a failure to the samples that cause it, so the RL step can drop them and go on.

Some rewards judge an image against more than its prompt's words: GenEval reads which objects, how
many, which colours and where from the prompt's metadata record (one dict per prompt, from a prompt
dataset's ``*_metadata.jsonl``). Such a reward sets ``uses_metadata = True`` and its ``score`` takes a
third argument; every other reward keeps the two-argument ``score`` and never sees metadata.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

logger = logging.getLogger(__name__)

Metadata = Mapping[str, Any]  # one prompt's record, e.g. GenEval's {"tag": ..., "include": [...]}


class RewardError(RuntimeError):
    """A reward failed for every sample of a batch: the run cannot learn from it."""


class RewardContractError(RewardError):
    """A reward broke its contract (e.g. returned a wrong number of scores): a bug, never one bad sample."""


@dataclass
class RewardOutput:
    """Per-sample rewards of one batch.

    rewards: float32 (B,); 0 where not valid.
    strict:  bool (B,); the image satisfies the prompt exactly (e.g. GenEval's strict accuracy).
    valid:   bool (B,); False where the reward could not be computed for that sample.
    errors:  one line per sample that failed, naming its index, prompt and the error.
    terms:   float32 (B,) per named part of a composite reward (unweighted), logged one by one; empty
             for a reward of one part.
    """

    rewards: torch.Tensor
    strict: torch.Tensor
    valid: torch.Tensor
    errors: list[str] = field(default_factory=list)
    terms: dict[str, torch.Tensor] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = self.rewards.shape[0] if self.rewards.dim() == 1 else -1
        if n < 0 or self.strict.shape != (n,) or self.valid.shape != (n,):
            raise ValueError(
                "RewardOutput.rewards, .strict and .valid must all have shape (B,) "
                f"(got {tuple(self.rewards.shape)}, {tuple(self.strict.shape)}, {tuple(self.valid.shape)})"
            )
        if self.strict.dtype != torch.bool or self.valid.dtype != torch.bool:
            raise ValueError(
                f"RewardOutput.strict and .valid must be bool tensors (got {self.strict.dtype}, "
                f"{self.valid.dtype})"
            )
        for term, values in self.terms.items():
            if values.shape != (n,):
                raise ValueError(f"RewardOutput.terms[{term!r}] must have shape ({n},) (got {tuple(values.shape)})")


class Reward(Protocol):
    """A reward: `score` takes images float (B, 3, H, W) in [0, 1] and B prompts.

    A reward with ``uses_metadata = True`` is called ``score(images, prompts, metadata)`` instead,
    with one metadata mapping per prompt (see the module docstring); it may set ``requires_metadata =
    False`` to be called with ``metadata=None`` when the prompts have none.
    """

    name: str

    def score(self, images: torch.Tensor, prompts: Sequence[str]) -> RewardOutput: ...


def uses_metadata(reward: Reward) -> bool:
    """Whether `reward.score` takes the prompts' metadata as a third argument."""
    return bool(getattr(reward, "uses_metadata", False))


def call_score(reward: Reward, images: torch.Tensor, prompts: Sequence[str],
               metadata: Sequence[Metadata] | None = None) -> RewardOutput:
    """`reward.score`, passing `metadata` only to a reward that uses it (RewardError if it is missing)."""
    if not uses_metadata(reward):
        return reward.score(images, prompts)
    if metadata is None and getattr(reward, "requires_metadata", True):
        raise RewardContractError(
            f"reward {reward.name!r} judges prompts by their metadata but none came with them; use a prompt "
            "dataset with a *_metadata.jsonl (data.dataset), e.g. GenEval's evaluation_metadata.jsonl")
    if metadata is not None and len(metadata) != len(prompts):
        raise ValueError(f"got {len(metadata)} metadata records for {len(prompts)} prompts; pass one per prompt")
    return reward.score(images, prompts, metadata)  # type: ignore[call-arg]


def _one_line(error: Exception) -> str:
    """'ExceptionType: first line of its message', for error lists and the RewardError text."""
    lines = str(error).splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}"


def _checked(reward: Reward, images: torch.Tensor, prompts: Sequence[str],
             metadata: Sequence[Metadata] | None) -> RewardOutput:
    """`reward.score`, with its output's length checked against the batch (a wrong length raises)."""
    out = call_score(reward, images, prompts, metadata)
    if out.rewards.shape != (len(prompts),):
        raise RewardContractError(
            f"reward {reward.name!r} returned rewards of shape {tuple(out.rewards.shape)} for "
            f"{len(prompts)} prompts; it must return one reward per image"
        )
    return out


def guarded_score(reward: Reward, images: torch.Tensor, prompts: Sequence[str],
                  metadata: Sequence[Metadata] | None = None) -> RewardOutput:
    """Score a batch so that a sample the reward cannot handle marks only itself.

    Returns a RewardOutput (B,) in float32 / bool on the CPU, with the reward's `terms` (0 where a
    sample is invalid). If `reward.score` raises on the batch, every sample is scored alone, and those
    that raise get valid=False, reward 0 and a line in `errors`. Non-finite rewards are treated the
    same way. Raises RewardError if no sample of a non-empty batch is valid, since a run that silently
    trains on nothing is worse than a stop. `metadata` (one per prompt) reaches only rewards that use it.
    """
    if images.shape[0] != len(prompts):
        raise ValueError(f"got {images.shape[0]} images but {len(prompts)} prompts; pass one per image")
    batch = len(prompts)
    rewards = torch.zeros(batch, dtype=torch.float32)
    strict = torch.zeros(batch, dtype=torch.bool)
    valid = torch.zeros(batch, dtype=torch.bool)
    terms: dict[str, torch.Tensor] = {}
    errors: list[str] = []
    first_failure: Exception | None = None

    def keep_terms(out: RewardOutput, index: slice) -> None:
        for term, values in out.terms.items():
            terms.setdefault(term, torch.zeros(batch, dtype=torch.float32))[index] = values.detach().float().cpu()

    try:
        out = _checked(reward, images, prompts, metadata)
        rewards[:] = out.rewards.detach().float().cpu()
        strict[:] = out.strict.cpu()
        valid[:] = out.valid.cpu()
        keep_terms(out, slice(None))
        errors += out.errors
    except Exception as batch_error:
        if isinstance(batch_error, RewardContractError):  # a bug of the reward or the caller, not of a sample
            raise
        for index, prompt in enumerate(prompts):
            try:
                one = None if metadata is None else [metadata[index]]
                out = _checked(reward, images[index : index + 1], [prompt], one)
            except Exception as error:  # any failure of one sample marks only that sample
                first_failure = first_failure or error
                errors.append(f"sample {index} ({prompt!r}): {_one_line(error)}")
                continue
            rewards[index] = out.rewards.detach().float().cpu()[0]
            strict[index] = bool(out.strict[0])
            valid[index] = bool(out.valid[0])
            keep_terms(out, slice(index, index + 1))
            errors += out.errors
    non_finite = valid & ~torch.isfinite(rewards)
    for index in torch.nonzero(non_finite).flatten().tolist():
        errors.append(f"sample {index} ({prompts[index]!r}): reward is {rewards[index].item()}")
    valid &= ~non_finite
    rewards[~valid] = 0.0
    for values in terms.values():
        values[~valid] = 0.0
    strict &= valid
    if batch > 0 and not valid.any():
        if first_failure is not None:
            cause = _one_line(first_failure)
        elif non_finite.any():
            cause = "it returned non-finite rewards"
        else:  # the reward's own reason, e.g. a deadline passed (rewards/deadline.py)
            cause = f"it marked every sample invalid: {errors[0]}" if errors else "it marked every sample invalid"
        raise RewardError(
            f"reward {reward.name!r} failed on all {batch} samples ({cause}); "
            "fix the reward or its inputs (images float (B, 3, H, W) in [0, 1], prompts of its task)"
        )
    if errors:  # the reasons of the samples left out (the run's summary counts them): the run's log keeps them
        logger.info("reward %r: %d of %d samples invalid: %s", reward.name, int((~valid).sum()), batch,
                    "; ".join(errors[:3]) + (f" (+{len(errors) - 3} more)" if len(errors) > 3 else ""))
    return RewardOutput(rewards, strict, valid, errors, terms)
