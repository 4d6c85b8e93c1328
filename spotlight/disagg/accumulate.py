"""The generation-axis pipeline's gradient accumulator (GAP): train groups as they complete, step once.

The one-shot update waits for the whole logical batch, then takes the mean of the per-row losses
(a row: one sample at one trained timestep) and steps the optimizer. Its gradient is
``(1/N) Σ_rows ∇ℓ``: a sum, so it can be built group by group in any order. `LogicalBatchUpdate`
backpropagates each complete group's loss SUM as the group arrives (the gradients add up in
``.grad``) and, once the last group is in, divides by the batch's row count N, clips and commits
ONE optimizer step. N is known only at the end (NFT leaves out samples whose advantage is 0), which
is why the division comes last rather than a 1/N on every group. The result equals the one-shot
update (one epoch, one minibatch = the batch; see `spotlight.disagg.group_loss`) up to the order of
floating-point sums.

With data parallelism each rank accumulates its own groups; every forward/backward but the batch's
last runs under ``no_sync`` (see `spotlight.disagg.timestep_packing`), the last one averages the
gradient sums over the ranks, and ``reduce_rows`` (an all-reduce of the row count) gives the global
N: the average times world_size / N is the global mean.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from typing import Protocol

import torch

from spotlight.disagg.group_loss import LossPiece
from spotlight.disagg.groups import AssembledGroup


class GroupLoss(Protocol):
    """A loss that a logical batch's update sums group by group (`spotlight.disagg.group_loss`)."""

    def num_pieces(self, group: AssembledGroup) -> int: ...

    def piece(self, model: torch.nn.Module, group: AssembledGroup, index: int) -> LossPiece: ...


class LogicalBatchUpdate:
    """Accumulates one logical batch of ``num_groups`` groups (this rank's share) into one optimizer step.

    ``no_sync``: a DDP/FSDP module's ``no_sync`` (None on one process). ``reduce_rows``: sums a row
    count over the ranks (identity on one process).
    """

    def __init__(self, model: torch.nn.Module, loss: GroupLoss, num_groups: int,
                 no_sync: Callable[[], AbstractContextManager] | None = None,
                 reduce_rows: Callable[[int], int] = lambda rows: rows, world_size: int = 1) -> None:
        if num_groups < 1:
            raise ValueError(f"a logical batch needs ≥ 1 group on each rank (got {num_groups})")
        self.model = model
        self.loss = loss
        self.num_groups = num_groups
        self.no_sync = no_sync
        self.reduce_rows = reduce_rows
        self.world_size = world_size
        self.rows = 0
        self.metric_sums: dict[str, float] = {}
        self._seen: set[int] = set()
        self._finished = False
        model.zero_grad(set_to_none=True)

    @property
    def complete(self) -> bool:
        return len(self._seen) == self.num_groups

    def add(self, group: AssembledGroup) -> None:
        """Forward and backward one complete group (its loss sum); gradients add up in ``.grad``."""
        if self._finished:
            raise RuntimeError("this logical batch has committed its step; start a new LogicalBatchUpdate")
        if group.prompt_index in self._seen:
            raise ValueError(f"group {group.prompt_index} was added twice to one logical batch")
        if len(self._seen) == self.num_groups:
            raise ValueError(f"logical batch already holds its {self.num_groups} groups (extra: {group.prompt_index})")
        self._seen.add(group.prompt_index)
        pieces = self.loss.num_pieces(group)
        if self.no_sync is not None and self.complete and pieces == 0:
            raise ValueError(f"the last group of this rank's batch ({group.prompt_index}) has nothing to train, so "
                             f"no backward would reduce the gradients across ranks: give it a group with rows")
        for index in range(pieces):
            last = self.complete and index == pieces - 1
            quiet = self.no_sync is not None and not last
            with self.no_sync() if quiet else contextlib.nullcontext():  # the forward decides, so it is inside
                piece = self.loss.piece(self.model, group, index)
                piece.loss_sum.backward()
            self.rows += piece.rows
            for name, value in piece.metric_sums.items():
                self.metric_sums[name] = self.metric_sums.get(name, 0.0) + value

    def finish_gradients(self) -> int:
        """Turn the summed gradients into the batch mean; return the global row count N (0: nothing to train)."""
        if not self.complete:
            raise RuntimeError(f"{len(self._seen)} of {self.num_groups} groups are in: the step must wait "
                               f"for the whole logical batch, or it would not equal the one-shot update")
        total_rows = self.reduce_rows(self.rows)
        if total_rows:
            scale = self.world_size / total_rows
            for parameter in self.model.parameters():
                if parameter.grad is not None:
                    parameter.grad.mul_(scale)
        self._finished = True
        return total_rows

    def commit(self, optimizer: torch.optim.Optimizer, grad_clip: float) -> dict[str, float]:
        """Mean the gradients, clip them to ``grad_clip`` and take the batch's one optimizer step.

        Returns the batch's mean loss (and the other metrics) over this rank's rows, the grad norm
        and the row count. A batch with no rows (every NFT advantage 0) takes no step, as the
        one-shot update takes none.
        """
        total_rows = self.finish_gradients()
        metrics = {f"train/{name}": value / max(self.rows, 1) for name, value in self.metric_sums.items()}
        metrics["train/rows"] = float(total_rows)
        if total_rows:
            grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), grad_clip)
            optimizer.step()
            metrics["train/grad_norm"] = float(grad_norm)
        return metrics


def one_shot_update(model: torch.nn.Module, loss: GroupLoss, groups: Iterable[AssembledGroup],
                    optimizer: torch.optim.Optimizer, grad_clip: float) -> dict[str, float]:
    """The unpipelined fallback: the whole batch's groups (in prompt order) through one accumulator and one step."""
    ordered = sorted(groups, key=lambda group: group.prompt_index)
    update = LogicalBatchUpdate(model, loss, len(ordered))
    for group in ordered:
        update.add(group)
    return update.commit(optimizer, grad_clip)
