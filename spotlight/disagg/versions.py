"""One-step-constrained asynchrony (TCSS): which weights a generation may use, and the check on every update.

Update s turns θ_s into θ_{s+1} from a logical batch of samples. Strictly on-policy, every sample of
batch s is drawn with θ_s, so generators wait while the trainer finishes update s-1. With one-step
asynchrony a generator may start batch s's units with θ_{s-1} (at most one version old) as soon as
θ_{s-1} is published: generation of batch s overlaps the trainer's update s-1. Each trajectory is
drawn from ONE snapshot (weights published mid-trajectory apply to the next one), so a trajectory's
log-probs and NFT's sampling policy are those of one version. How DigenRL pins the snapshot is
inferred: its RFC states the one-version bound and one snapshot per trajectory, not the mechanism.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from spotlight.disagg.samples import ScoredSample


class StalenessError(RuntimeError):
    """A sample in an update was drawn by weights outside the allowed versions, or by several versions."""


@dataclass(frozen=True)
class VersionGate:
    """The allowed lag between an update and the weights its samples come from: 1 with ``async_one_step``, else 0."""

    async_one_step: bool = False

    @property
    def max_lag(self) -> int:
        return 1 if self.async_one_step else 0

    def may_start(self, update_step: int, weights_version: int) -> bool:
        """Whether a unit of batch ``update_step`` may be generated with θ_{weights_version}."""
        return update_step - self.max_lag <= weights_version <= update_step

    def check_update(self, update_step: int, samples: Iterable[ScoredSample]) -> None:
        """Raise `StalenessError` if any sample of update ``update_step`` is too stale, from the future, or
        its trajectory mixes versions (its logged per-step versions differ from its id's version)."""
        for sample in samples:
            version = sample.id.policy_version
            if not self.may_start(update_step, version):
                allowed = f"{update_step - self.max_lag}..{update_step}"
                raise StalenessError(f"sample {sample.id} in update {update_step} was drawn by θ_{version}; allowed "
                                     f"versions are {allowed} (async_one_step={self.async_one_step})")
            if set(sample.step_versions) - {version}:
                logged = sorted(set(sample.step_versions))
                raise StalenessError(f"trajectory {sample.id} mixes weight versions {logged}: a generator must keep "
                                     f"one snapshot for a whole trajectory")
