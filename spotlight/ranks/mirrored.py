"""The driver's versions under FSDP2: each call runs on rank 0's shards and, at the same moment, on ranks 1..K-1.

The loop (`spotlight.trainer.Trainer`) is written once against the `PolicyVersions` interface. Under
``trainer.sharding: fsdp`` the versions are sharded over K ranks (`spotlight.ranks.sharded_versions`),
and several of their operations are collectives (gathering θ_old into the whole sampler, saving
shards, resharding a checkpoint): every rank must enter them together. `MirroredVersions` is the
same interface on the driver: each call is sent to ranks 1..K-1 (`TrainerRanks.mirror`) and run on
rank 0's own shards while they run theirs, so the loop never says "now all ranks".

Rank 0 alone validates, writes checkpoints' consolidated files and talks to the backend, always
through the whole ``sampler`` copy, which needs no collective.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

import torch

from spotlight.models.loop_model import LoopModel
from spotlight.ranks.sharded_versions import ShardedVersions

__all__ = ["MirroredVersions"]


class Mirror(Protocol):
    """What runs a call on ranks 1..K-1 while rank 0 runs its own (`spotlight.ranks.group.TrainerRanks.mirror`)."""

    def mirror(self, local: Callable[[], Any], method: str, *args: Any) -> Any: ...

    def shared(self, value: Any) -> Any: ...


class MirroredVersions:
    """`PolicyVersions`' interface over K ranks' sharded versions (module docstring); ``local``: rank 0's."""

    def __init__(self, local: ShardedVersions, ranks: Mirror) -> None:
        self.local, self.ranks = local, ranks

    # the versions by name: rank 0's shards, and its whole sampler
    @property
    def model(self) -> LoopModel:
        return self.local.model

    @property
    def sampler(self) -> LoopModel:
        return self.local.sampler

    @property
    def previous(self) -> LoopModel:
        return self.local.previous

    @property
    def reference(self) -> LoopModel | None:
        return self.local.reference

    @property
    def ema(self) -> LoopModel | None:
        return self.local.ema

    @property
    def evaluated(self) -> LoopModel:
        """The whole copy validation reads (inside `evaluating`, where it holds the EMA or θ)."""
        return self.local.sampler

    @property
    def sampler_trails(self) -> bool:
        return self.local.sampler_trails

    @property
    def ships_sampler(self) -> bool:
        """No: every rank gathers θ_old into its own whole sampler after each update."""
        return False

    def _everywhere(self, name: str, *args: Any) -> Any:
        """``local.name(*args)`` on rank 0 while ranks 1..K-1 run the same."""
        return self.ranks.mirror(lambda: getattr(self.local, name)(*args), "versions_call", name, *args)

    def start(self) -> None:
        """Every version, the reference too, from rank 0's starting weights (broadcast; each rank keeps its chunks)."""
        self._everywhere("start")

    def hand_over(self) -> None:
        self._everywhere("hand_over")

    def after_update(self, iteration: int, section: Any) -> None:
        self._everywhere("after_update", iteration, section)

    @contextmanager
    def evaluating(self, raw: bool = False) -> Iterator[LoopModel]:
        """The whole sampler holds the evaluated version (the EMA, or θ; θ if ``raw``) for the block, θ_old after."""
        self._everywhere("begin_evaluation", raw)
        try:
            yield self.local.sampler
        finally:
            self._everywhere("end_evaluation")

    def reset_to(self, state: Mapping[str, torch.Tensor]) -> None:
        shared = self.ranks.shared(dict(state))
        self.ranks.mirror(lambda: self.local.reset_to(state), "versions_call", "reset_to", shared)

    def restore(self, checkpoint: Path, optimizer: torch.optim.Optimizer, state: Any) -> None:
        """Every rank reads its part of ``checkpoint`` (a shared file system across nodes), resharded to this K."""
        self.ranks.mirror(lambda: self.local.restore(checkpoint, optimizer, state), "restore", checkpoint)

    def save_checkpoint(self, run_dir: Path, done: int, optimizer: torch.optim.Optimizer,
                        loop_state: dict[str, Any]) -> None:
        """Every rank writes its shards (``dcp/``); rank 0 the consolidated θ (``transformer/``), the loop's state."""
        from spotlight.components.checkpoint import save_training_checkpoint

        def shards(staging: Path) -> None:
            self.ranks.mirror(lambda: self.local.save_shards(staging, optimizer), "save_shards", staging)

        try:  # the sampler holds θ while its files are written, θ_old again after
            save_training_checkpoint(run_dir, done, self.local.sampler, None, None, loop_state, shards=shards)
        finally:
            self._everywhere("end_evaluation")
