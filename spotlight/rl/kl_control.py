"""An adaptive trust term: the weight of ``||v - v_ref||²`` follows the measured distance to a target.

Measured on the shapes task (docs/learning.md, "The stable update"), the NFT default learns fast and
then diverges once the policy has moved far from the base: its distance to the base,
``||v - v_ref||²`` (``train/kl``), grows slowly to ~0.2 and then doubles every few iterations, the
loss with it, whatever the learning rate (5e-5 and 1e-4 both blew up at iterations 115-180) and however
much the signal is scaled down (``nft_adv_scale`` 5 or a θ_old trailing by ten iterations only slowed
learning and the walk alike, ~3x). A fixed weight large enough to hold the walk (0.1) also held the
learning (+0.06 where 0.01 gave +0.13). What is needed is a weight that is small while the policy is
near the base and grows as it leaves: PPO's adaptive KL coefficient (Schulman et al., 2017), with
the velocity distance in place of the KL. After every update the weight is doubled when the
iteration's distance is over 1.5x the target and halved (down to the configured floor) when it is
under target / 1.5; between, it stays. Its value is part of the checkpoint, so a resumed run is exact.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["AdaptiveTrust"]


class AdaptiveTrust:
    """The trust term's weight for the next update, from the last update's measured distance to the base."""

    def __init__(self, floor: float, target: float | None, ceiling: float = 10.0) -> None:
        """``floor``: the configured ``nft_kl_beta`` (the weight near the base); ``target``: the distance
        to hold (None: the weight stays at ``floor``); ``ceiling``: the largest weight."""
        self.floor, self.target, self.ceiling = floor, target, ceiling
        self.beta = floor

    def observe(self, distance: float | None) -> None:
        """Adapt the weight to one update's mean distance ``||v - v_ref||²`` (None or non-finite: no change)."""
        if self.target is None or distance is None or not math.isfinite(distance):
            return
        if distance > 1.5 * self.target:
            self.beta = min(self.ceiling, max(2.0 * self.beta, 1e-4))
        elif distance < self.target / 1.5:
            self.beta = max(self.floor, self.beta / 2.0)

    def state_dict(self) -> dict[str, Any]:
        return {"beta": self.beta}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.beta = float(state.get("beta", self.floor))
