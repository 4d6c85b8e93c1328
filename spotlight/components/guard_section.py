"""The guard's config section (``guard:``): kept apart from the guard so the run config can read it.

`spotlight.config` gathers every folder's section; a section module imports only the schema, so the
configuration sits above the folders it configures without their importing it back.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from spotlight.schema import Section

__all__ = ["GuardSection"]


class GuardSection(Section):
    """When the loop calls a run dying, and what it does then (``train.guard``)."""

    enabled: bool = True
    dead_iterations: int = Field(10, ge=1)  # every group zero-spread this many iterations in a row
    window: int = Field(10, ge=1)  # iterations averaged for the reward-collapse rule
    # in group reward stds at the best window: the shapes run that collapsed had fallen ~0.8 by the
    # iteration its raw model lost half its accuracy; healthy runs' window means move < 0.2
    reward_drop: float = Field(0.75, gt=0)
    loss_explosion: float = Field(10.0, gt=1)  # times the run's median loss; the collapse went 0.2 → 2.4 → 1,197
    action: Literal["rollback", "stop"] = "rollback"
    rollback_lr_factor: float = Field(0.5, gt=0, le=1)
    max_rollbacks: int = Field(2, ge=0)  # then stop
