"""The run guard: notices a dying run from its own metrics, so the loop acts instead of spinning.

RL post-training of DiTs fails in a recognisable way (issue 21, and what users of DiT RL trainers
report): the policy drifts off the data, its samples stop satisfying anything, every group's rewards
become equal, the advantages and so the gradient are exactly zero, and the run goes on doing
nothing until its time is up; or the loss explodes first. Three signals, each read from an
iteration's metrics record:

- **dead signal**: every group had zero reward spread (``rollout/zero_std_groups`` = 1) for
  ``dead_iterations`` iterations in a row: nothing is left to learn from;
- **reward collapse**: the rollout reward's mean over the last ``window`` iterations fell more than
  ``reward_drop`` group standard deviations below the best such mean of the run. The unit is the
  groups' own reward spread at that best (what the advantages are normalised by), so the rule means
  the same for a 0/1 reward, a partial credit in [0, 1] or a preference score in logits;
- **loss explosion**: a non-finite loss or gradient norm, or a loss above ``loss_explosion`` times
  the median loss of the run so far.

The guard only judges; `spotlight.trainer.Trainer` acts on its verdict: roll back to
``checkpoints/best`` with the learning rate times ``rollback_lr_factor`` (at most ``max_rollbacks``
times), or stop with one line naming what happened and where the best model is.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any, Literal

from spotlight.components.guard_section import GuardSection

__all__ = ["GuardSection", "GuardVerdict", "RunGuard"]


@dataclass(frozen=True)
class GuardVerdict:
    """The guard's call on one iteration: why the run is dying, and whether to roll back or stop."""

    action: Literal["rollback", "stop"]
    iteration: int
    reason: str


class RunGuard:
    """Reads each iteration's metrics and calls a dying run (module docstring). State is plain data."""

    def __init__(self, section: GuardSection) -> None:
        self.section = section
        self.rewards: list[float] = []  # rollout reward means since the last rollback
        self.spreads: list[float] = []  # their group reward stds
        self.losses: list[float] = []  # every finite loss of the run
        self.dead_streak = 0
        self.best_window: float | None = None  # best rollout-reward window mean since the last rollback
        self.best_spread = 0.0  # the group reward std over that window
        self.rollbacks = 0

    def observe(self, record: dict[str, Any]) -> GuardVerdict | None:
        """Judge one iteration's record; a verdict when the run is dying, else None."""
        if not self.section.enabled:
            return None
        iteration = int(record["iteration"])
        reason = self._loss_problem(record) or self._dead_signal(record) or self._reward_collapse(record)
        if reason is None:
            return None
        if self.section.action == "rollback" and self.rollbacks < self.section.max_rollbacks:
            return GuardVerdict("rollback", iteration, reason)
        return GuardVerdict("stop", iteration, reason)

    def rolled_back(self) -> None:
        """Start judging afresh after a rollback (the restored model is judged on its own record)."""
        self.rollbacks += 1
        self.rewards, self.spreads, self.dead_streak = [], [], 0
        self.best_window, self.best_spread = None, 0.0

    def _loss_problem(self, record: dict[str, Any]) -> str | None:
        loss, grad_norm = record.get("train/loss"), record.get("train/grad_norm")
        if loss is None:
            return None
        if not math.isfinite(loss) or (grad_norm is not None and not math.isfinite(grad_norm)):
            return f"the loss or gradient norm is not finite (loss {loss}, grad norm {grad_norm})"
        median = statistics.median(self.losses) if len(self.losses) >= self.section.window else None
        self.losses.append(loss)
        if median is not None and median > 0 and loss > self.section.loss_explosion * median:
            return f"the loss exploded to {loss:.3g}, {loss / median:.0f}x its median {median:.3g}"
        return None

    def _dead_signal(self, record: dict[str, Any]) -> str | None:
        zero = record.get("rollout/zero_std_groups")
        if zero is None:
            return None
        self.dead_streak = self.dead_streak + 1 if zero >= 1.0 else 0
        if self.dead_streak >= self.section.dead_iterations:
            return (f"every group had zero reward spread for {self.dead_streak} iterations in a row "
                    f"(rollout reward {record.get('rollout/reward_mean', float('nan')):.3f}): no signal left")
        return None

    def _reward_collapse(self, record: dict[str, Any]) -> str | None:
        reward, spread = record.get("rollout/reward_mean"), record.get("rollout/group_reward_std")
        if reward is None or spread is None or not math.isfinite(reward):
            return None
        self.rewards.append(reward)
        self.spreads.append(spread)
        window = self.section.window
        if len(self.rewards) < window:
            return None
        mean = sum(self.rewards[-window:]) / window
        if self.best_window is None or mean > self.best_window:
            self.best_window, self.best_spread = mean, sum(self.spreads[-window:]) / window
            return None
        drop = self.best_window - mean
        if self.best_spread > 0 and drop > self.section.reward_drop * self.best_spread:
            return (f"the rollout reward fell to {mean:.3f} (mean of {window} iterations), "
                    f"{drop / self.best_spread:.1f} group stds below its best {self.best_window:.3f}")
        return None

    def state_dict(self) -> dict[str, Any]:
        return {"rewards": self.rewards, "spreads": self.spreads, "losses": self.losses,
                "dead_streak": self.dead_streak, "best_window": self.best_window, "best_spread": self.best_spread,
                "rollbacks": self.rollbacks}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rewards, self.spreads = list(state["rewards"]), list(state["spreads"])
        self.losses, self.dead_streak = list(state["losses"]), int(state["dead_streak"])
        self.best_window, self.best_spread = state["best_window"], float(state["best_spread"])
        self.rollbacks = int(state["rollbacks"])
