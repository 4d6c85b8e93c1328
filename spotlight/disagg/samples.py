"""A generation's identity and the scored sample that carries it through the disaggregated pipeline.

With generation, scoring and training on separate pools, samples reach the trainer out of order and
from different devices. Each one keeps the identity it was given before it was generated (prompt,
sample within the prompt's group, policy version of the weights that drew it), so the trainer can
rebuild exactly the batch a one-shot step would have seen, and the staleness check can read which
weights drew it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, order=True)
class GenerationId:
    """Which generation a sample is: ``prompt_index`` in the logical batch, ``sample_index`` in its
    group, and ``policy_version`` (the number of optimizer steps behind the weights that drew it)."""

    prompt_index: int
    sample_index: int
    policy_version: int


@dataclass(frozen=True)
class ScoredSample:
    """One scored generation.

    latents (K+1, C, H, W) as the sampler recorded them; log_probs (K,); tokens (L,) of its prompt;
    ``reward`` and ``valid`` (False: the reward failed); ``produced_by`` names the pool that drew it
    ("generator" or "trainer", the latter for trainer-assisted generation); ``step_versions`` the
    policy version read at each denoising step (empty when not logged): one-step asynchrony requires
    them all to equal ``id.policy_version``; ``strict`` the reward's strict flag (logged, not trained on).
    """

    id: GenerationId
    latents: torch.Tensor
    log_probs: torch.Tensor
    tokens: torch.Tensor
    reward: float
    valid: bool = True
    produced_by: str = "generator"
    step_versions: tuple[int, ...] = ()
    strict: bool = False


@dataclass(frozen=True)
class GenerationUnit:
    """The generations one device draws together: (prompt_index, sample_index) pairs of one batch."""

    index: int
    members: tuple[tuple[int, int], ...]


def cut_generation_units(num_prompts: int, group_size: int, unit_size: int) -> list[GenerationUnit]:
    """Cut a (num_prompts, group_size) batch into units of ``unit_size`` generations along the sample axis.

    The P·G generations are laid out prompt-major and cut every ``unit_size``: a batch of a few dozen
    prompts cut by prompt gives only a few units per device, too coarse to pipeline; cut by
    generation it gives P·G / unit_size. Prompt-major order keeps a group's samples in adjacent
    units, so groups complete (and the trainer can start) as early as possible. The last unit is
    shorter when unit_size does not divide P·G.
    """
    if num_prompts < 1 or group_size < 1:
        raise ValueError(f"a batch needs ≥ 1 prompt and ≥ 1 sample per group (got {num_prompts} x {group_size})")
    if unit_size < 1:
        raise ValueError(f"gap.unit_size must be ≥ 1 generation (got {unit_size})")
    pairs = [(prompt, sample) for prompt in range(num_prompts) for sample in range(group_size)]
    return [GenerationUnit(index=i, members=tuple(pairs[start:start + unit_size]))
            for i, start in enumerate(range(0, len(pairs), unit_size))]
