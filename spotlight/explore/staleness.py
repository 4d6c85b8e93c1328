"""Staleness of exploration: do seeds ranked under stale weights θ_i keep their rank under θ_{i+1}?

Exploration for iteration i+1 scores candidates with θ_i while θ_i is being trained into θ_{i+1}.
It pays off only while the two weight versions rank the candidate seeds alike; this module
measures that agreement (Kendall τ-b of the rewards, overlap of the selected groups) and says
when to fall back to fresh exploration.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "StalenessMonitor",
    "StalenessRecord",
    "kendall_tau",
    "mean_kendall_tau",
    "selection_overlap",
]


def kendall_tau(a: Tensor, b: Tensor) -> float:
    """Kendall τ-b between two scorings of the same N candidates, in [-1, 1].

    a, b: (N,). τ-b = (concordant - discordant) / sqrt((n0 - ties_a)(n0 - ties_b)) with
    n0 = N(N-1)/2; the tie correction matters because rewards are often discrete (a GenEval
    check passes or fails), and plain τ-a would call two identical tied rankings imperfect.
    Candidates where either score is NaN/inf (failed reward samples) are dropped first.
    Returns NaN when fewer than 2 candidates remain or either scoring is constant (undefined).
    O(N²) memory and time, which is fine for the N ≤ a few hundred candidates of one prompt.
    """
    if a.ndim != 1 or a.shape != b.shape:
        raise ValueError(
            "kendall_tau needs two 1-D tensors of the same length "
            f"(got {tuple(a.shape)} and {tuple(b.shape)})"
        )
    a = a.detach().to(torch.float64)
    b = b.detach().to(torch.float64)
    finite = torch.isfinite(a) & torch.isfinite(b)
    a, b = a[finite], b[finite]
    if a.numel() < 2:
        return math.nan
    sign_a = torch.sign(a[:, None] - a[None, :]).triu(diagonal=1)
    sign_b = torch.sign(b[:, None] - b[None, :]).triu(diagonal=1)
    untied_a = float(sign_a.abs().sum())  # n0 - ties_a
    untied_b = float(sign_b.abs().sum())
    if untied_a == 0 or untied_b == 0:
        return math.nan
    concordance = float((sign_a * sign_b).sum())  # concordant - discordant
    return concordance / math.sqrt(untied_a * untied_b)


def mean_kendall_tau(a: Tensor, b: Tensor) -> float:
    """Mean over prompts of the per-prompt Kendall τ-b; a, b: (P, N). Returns a float.

    Prompts where τ is undefined (all candidates scored the same under either weights) are
    skipped: they carry no ranking to agree on. NaN if every prompt is undefined.
    """
    if a.ndim != 2 or a.shape != b.shape:
        raise ValueError(
            f"mean_kendall_tau needs two (P, N) tensors of the same shape "
            f"(got {tuple(a.shape)} and {tuple(b.shape)})"
        )
    taus = [kendall_tau(a[p], b[p]) for p in range(a.shape[0])]
    defined = [t for t in taus if not math.isnan(t)]
    return sum(defined) / len(defined) if defined else math.nan


def selection_overlap(selected_a: Tensor | Iterable[int], selected_b: Tensor | Iterable[int]) -> float:
    """Fraction of shared seeds between two selections, |A ∩ B| / max(|A|, |B|), in [0, 1].

    For two groups of G seeds this is "how many of the G seeds the stale selection got right,
    out of G" - easier to read than Jaccard (k / (2G - k)) and monotone in it. 1-D inputs are one
    prompt's seeds (or indices); (P, G) tensors give the mean over prompts. Duplicates count once.
    """
    a = torch.as_tensor(selected_a) if not isinstance(selected_a, Tensor) else selected_a
    b = torch.as_tensor(selected_b) if not isinstance(selected_b, Tensor) else selected_b
    if a.ndim != b.ndim or a.ndim not in (1, 2) or (a.ndim == 2 and a.shape[0] != b.shape[0]):
        raise ValueError(
            "selection_overlap needs two 1-D selections or two (P, G) batches with the same P "
            f"(got {tuple(a.shape)} and {tuple(b.shape)})"
        )
    if a.ndim == 2:
        return sum(selection_overlap(a[p], b[p]) for p in range(a.shape[0])) / max(a.shape[0], 1)
    set_a, set_b = set(a.tolist()), set(b.tolist())
    largest = max(len(set_a), len(set_b))
    if largest == 0:
        raise ValueError("selection_overlap needs at least one selected seed")
    return len(set_a & set_b) / largest


@dataclass(frozen=True)
class StalenessRecord:
    """One iteration's agreement between stale and fresh scoring (NaN where not measured)."""

    iteration: int
    tau: float
    overlap: float


class StalenessMonitor:
    """Tracks Kendall τ and selection overlap between stale (θ_i) and fresh (θ_{i+1}) scoring.

    `should_fallback` is True when the latest measured τ is below `floor`: the stale ranking no
    longer predicts the fresh one well enough for asynchronous exploration to beat random seeds,
    so the pipeline should explore synchronously (or use random seeds) until τ recovers. The
    decision looks at the latest iteration only, because the policy can change fast and a
    recovered τ should re-enable asynchronous exploration at once.
    """

    def __init__(self, floor: float) -> None:
        if not -1.0 <= floor <= 1.0:
            raise ValueError(f"staleness floor must be a Kendall τ in [-1, 1] (got {floor})")
        self.floor = floor
        self.records: list[StalenessRecord] = []

    def record(
        self,
        iteration: int,
        stale_rewards: Tensor,
        fresh_rewards: Tensor,
        stale_selected: Tensor | None = None,
        fresh_selected: Tensor | None = None,
    ) -> StalenessRecord:
        """Record one iteration; rewards (P, N) for the same candidates, selections (P, G) optional.

        Returns the StalenessRecord (τ = mean over prompts, overlap NaN without both selections).
        """
        if self.records and iteration <= self.records[-1].iteration:
            raise ValueError(
                f"staleness iterations must increase (got {iteration} after {self.records[-1].iteration})"
            )
        tau = mean_kendall_tau(stale_rewards, fresh_rewards)
        overlap = math.nan
        if stale_selected is not None and fresh_selected is not None:
            overlap = selection_overlap(stale_selected, fresh_selected)
        entry = StalenessRecord(iteration=iteration, tau=tau, overlap=overlap)
        self.records.append(entry)
        return entry

    @property
    def latest_tau(self) -> float:
        """The most recent measured τ, NaN before any was measured."""
        measured = [r.tau for r in self.records if not math.isnan(r.tau)]
        return measured[-1] if measured else math.nan

    @property
    def should_fallback(self) -> bool:
        """True when the latest measured τ is below the floor (never before a measurement)."""
        tau = self.latest_tau
        return not math.isnan(tau) and tau < self.floor

    @property
    def warning(self) -> str | None:
        """A one-line message for the log when falling back, else None."""
        if not self.should_fallback:
            return None
        last = next(r for r in reversed(self.records) if not math.isnan(r.tau))
        return (
            f"stale seed rankings disagree with fresh ones at iteration {last.iteration} "
            f"(Kendall tau {last.tau:.3f} < floor {self.floor:.3f}): falling back to fresh "
            "exploration until it recovers (lower the floor to tolerate more staleness)"
        )

    def summary(self) -> dict[str, float]:
        """Median and 10th percentile of τ and overlap over recorded iterations (NaN if none),
        plus the number of iterations and how many were below the floor."""
        taus = np.array([r.tau for r in self.records], dtype=np.float64)
        overlaps = np.array([r.overlap for r in self.records], dtype=np.float64)
        return {
            "iterations": float(len(self.records)),
            "tau_median": _nan_percentile(taus, 50),
            "tau_p10": _nan_percentile(taus, 10),
            "overlap_median": _nan_percentile(overlaps, 50),
            "overlap_p10": _nan_percentile(overlaps, 10),
            "below_floor": float(np.sum(taus[~np.isnan(taus)] < self.floor)),
        }

    def state_dict(self) -> dict[str, Any]:
        """Plain-data state for checkpoints."""
        return {
            "floor": self.floor,
            "records": [[r.iteration, r.tau, r.overlap] for r in self.records],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what state_dict() returned."""
        self.floor = float(state["floor"])
        self.records = [
            StalenessRecord(iteration=int(i), tau=float(t), overlap=float(o)) for i, t, o in state["records"]
        ]


def _nan_percentile(values: np.ndarray, q: float) -> float:
    finite = values[~np.isnan(values)]
    return float(np.percentile(finite, q)) if finite.size else math.nan
