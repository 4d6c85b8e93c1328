"""A deadline for a reward that runs user code: a call that hangs is abandoned, not waited on forever.

A `pkg.module:function` reward is the user's code: a lock that is never released, a dead server it calls
without a timeout, a model that swaps. `DeadlineReward` runs each call in a worker thread and waits
``reward.deadline_s`` for it (the same field bounds an ``http`` reward's requests):

- a call that returns in time is the reward's answer (an exception it raises is re-raised here, so
  `guarded_score` still confines a failing sample to itself);
- a call past the deadline is abandoned (its thread is a daemon: it can finish or hang on without
  holding up the run or its exit) and retried, up to ``reward.retries`` times;
- two timed-out calls in a row, across batches, stop the run with one line (`RewardDeadlineError`): a
  reward that hangs twice on a whole batch will not come back, and every further batch would cost
  the deadline again;
- a call still timed out when its retries are spent (``reward.retries: 0``) marks its samples invalid
  with the reason, as an unreachable reward server does.

A thread, not a process: the function, its module state and the images stay in this process (no
pickling, no second copy of a reward model), and an abandoned call costs only the CPU it keeps using.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch

from spotlight.rewards.base import Metadata, Reward, RewardContractError, RewardOutput, call_score

__all__ = ["DeadlineReward", "RewardDeadlineError", "call_with_deadline"]

logger = logging.getLogger(__name__)

TIMEOUTS_TO_STOP = 2  # timed-out calls in a row that end the run


class RewardDeadlineError(RewardContractError):
    """A reward hangs: calls in a row passed ``reward.deadline_s`` (a contract error: no sample is at fault, so
    `guarded_score` does not try the samples one by one)."""


def call_with_deadline(function: Callable[[], Any], deadline_s: float) -> tuple[bool, Any]:
    """(True, what ``function()`` returned) if it returns within ``deadline_s``, else (False, None), leaving it
    running in its daemon thread. An exception it raises in time is raised here."""
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append((True, function()))
        except BaseException as error:  # noqa: BLE001 - handed to the caller's thread as it was raised
            outcome.append((False, error))

    worker = threading.Thread(target=run, name="reward-call", daemon=True)
    worker.start()
    worker.join(deadline_s)
    if not outcome:
        return False, None
    returned, value = outcome[0]
    if not returned:
        raise value
    return True, value


class DeadlineReward:
    """``reward`` with every call bounded by ``deadline_s`` and retried ``retries`` times (module docstring)."""

    def __init__(self, reward: Reward, deadline_s: float, retries: int) -> None:
        self.reward, self.deadline_s, self.retries = reward, deadline_s, retries
        self.name = reward.name
        self.uses_metadata = bool(getattr(reward, "uses_metadata", False))
        self.requires_metadata = bool(getattr(reward, "requires_metadata", True))
        self.has_strict = bool(getattr(reward, "has_strict", True))
        self.timeouts_in_row = 0

    def score(self, images: torch.Tensor, prompts: Sequence[str],
              metadata: Sequence[Metadata] | None = None) -> RewardOutput:
        """The reward's output, or (retries spent) every sample invalid with the deadline as its reason."""
        for attempt in range(self.retries + 1):
            returned, out = call_with_deadline(lambda: call_score(self.reward, images, prompts, metadata),
                                               self.deadline_s)
            if returned:
                self.timeouts_in_row = 0
                return out
            self.timeouts_in_row += 1
            if self.timeouts_in_row >= TIMEOUTS_TO_STOP:
                raise RewardDeadlineError(
                    f"reward {self.name!r} did not return within reward.deadline_s={self.deadline_s:g} s on "
                    f"{len(prompts)} samples, {TIMEOUTS_TO_STOP} calls in a row: it hangs; fix the function (a "
                    "lock, a call without a timeout), or raise reward.deadline_s if it is only slow")
            logger.warning(f"reward {self.name!r}: a call on {len(prompts)} samples passed reward.deadline_s="
                           f"{self.deadline_s:g} s and was abandoned (attempt {attempt + 1} of {self.retries + 1})")
        batch = len(prompts)
        reason = f"reward did not return within reward.deadline_s={self.deadline_s:g} s ({self.retries + 1} attempts)"
        return RewardOutput(torch.zeros(batch), torch.zeros(batch, dtype=torch.bool),
                            torch.zeros(batch, dtype=torch.bool),
                            [f"sample {i} ({prompt!r}): {reason}" for i, prompt in enumerate(prompts)])
