"""The group assembler: scored samples arrive in any order; complete groups leave with their advantages.

Group-relative advantages need every sample of a group, nothing more (with the per-group standard
deviation): so a group can be released, and trained on, the moment its last sample is scored, while
other groups are still being generated. The advantages are computed by the one-shot path's own
function (`spotlight.rl.advantages.group_advantages`) on the group's row, which gives the numbers
the one-shot path computes on the whole (P, G) matrix row by row. With ``std_mode="global"`` the
standard deviation couples every group of the batch, so no group can be released before the last
one is complete: the assembler then holds them all and releases the whole batch at once (the
pipeline degrades to one-shot for that setting rather than changing the advantages).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from spotlight.disagg.samples import ScoredSample
from spotlight.rl.advantages import StdMode, group_advantages


@dataclass(frozen=True)
class AssembledGroup:
    """One prompt's complete group: ``samples`` ordered by sample index, ``advantages`` (G,) in that order."""

    prompt_index: int
    samples: tuple[ScoredSample, ...]
    advantages: torch.Tensor

    @property
    def rewards(self) -> torch.Tensor:
        return torch.tensor([sample.reward for sample in self.samples], dtype=torch.float32)


class GroupAssembler:
    """Collects the scored samples of one logical batch of ``num_prompts`` groups of ``group_size``.

    `add` returns the groups the sample completed (none, its own, or with ``"global"`` std the whole
    batch). A sample outside the batch or seen twice is an error: both would make the update differ
    from the one-shot update silently.
    """

    def __init__(self, num_prompts: int, group_size: int, std_mode: StdMode = "group", clip: float = 5.0) -> None:
        if std_mode not in ("group", "global"):
            raise ValueError(f"train.adv_std must be 'group' or 'global' (got {std_mode!r})")
        self.num_prompts = num_prompts
        self.group_size = group_size
        self.std_mode = std_mode
        self.clip = clip
        self._pending: dict[int, dict[int, ScoredSample]] = {}
        self._complete: dict[int, tuple[ScoredSample, ...]] = {}
        self._released = 0
        self._global: torch.Tensor | None = None

    @property
    def done(self) -> bool:
        """True once every group of the batch has been released."""
        return self._released == self.num_prompts

    def add(self, sample: ScoredSample) -> list[AssembledGroup]:
        """Take one scored sample; return the groups that are now complete (in prompt order)."""
        prompt, index = sample.id.prompt_index, sample.id.sample_index
        if not (0 <= prompt < self.num_prompts and 0 <= index < self.group_size):
            raise ValueError(f"sample {sample.id} is outside the batch of {self.num_prompts} prompts x "
                             f"{self.group_size} samples: it belongs to another logical batch")
        group = self._pending.setdefault(prompt, {})
        if index in group or prompt in self._complete:
            raise ValueError(f"sample {sample.id} arrived twice: a re-sent sample must replace, not add to, its group")
        group[index] = sample
        if len(group) < self.group_size:
            return []
        self._complete[prompt] = tuple(group[i] for i in range(self.group_size))
        del self._pending[prompt]
        if self.std_mode == "group":
            return [self._release(prompt)]
        if len(self._complete) < self.num_prompts:
            return []
        return [self._release(p) for p in range(self.num_prompts)]

    def _release(self, prompt: int) -> AssembledGroup:
        samples = self._complete[prompt]
        if self.std_mode == "group":
            rewards = torch.tensor([[s.reward for s in samples]], dtype=torch.float32)
            valid = torch.tensor([[s.valid for s in samples]])
            advantages = group_advantages(rewards, valid, "group", self.clip)[0]
        else:
            advantages = self._global_advantages()[prompt]
        self._released += 1
        return AssembledGroup(prompt_index=prompt, samples=samples, advantages=advantages)

    def _global_advantages(self) -> torch.Tensor:
        if self._global is None:
            rows = [self._complete[p] for p in range(self.num_prompts)]
            rewards = torch.tensor([[s.reward for s in row] for row in rows], dtype=torch.float32)
            valid = torch.tensor([[s.valid for s in row] for row in rows])
            self._global = group_advantages(rewards, valid, "global", self.clip)
        return self._global
