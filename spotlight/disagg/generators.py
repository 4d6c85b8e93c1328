"""A generation worker: holds one weight snapshot, draws fragments with it, logs the version of every step.

Generators receive weights as numbered snapshots (`SnapshotStore`) and load one only between
trajectories, so every trajectory comes from one version; the version read at each denoising step
is logged in the sample (`ScoredSample.step_versions`) so that the update's staleness check can
prove it rather than trust it. The trainer's TAG helper (`spotlight.disagg.assisted`) draws through
the same `generate_fragment`, so its samples are scored and assembled exactly as a generator's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from spotlight.diffusion.sampler import SamplingPlan, sample
from spotlight.disagg.samples import GenerationId, ScoredSample
from spotlight.disagg.versions import VersionGate
from spotlight.models.policy import Policy

# Scores final latents (B, C, H, W) of the (prompt, sample) pairs given: one (reward, valid) per row.
ScoreFn = Callable[[torch.Tensor, Sequence[tuple[int, int]]], list[tuple[float, bool]]]


@dataclass(frozen=True)
class WeightSnapshot:
    """θ_version as published by the trainer (tensors owned by the store, never written after publishing)."""

    version: int
    state: dict[str, torch.Tensor]


class SnapshotStore:
    """The published weights generators may use: the newest ``max_lag + 1`` versions under ``gate``."""

    def __init__(self, gate: VersionGate) -> None:
        self.gate = gate
        self._snapshots: dict[int, WeightSnapshot] = {}

    def publish(self, version: int, state: dict[str, torch.Tensor]) -> None:
        """Publish θ_version (a copy of a policy's ``broadcast_state()``), in order, one step at a time."""
        newest = max(self._snapshots, default=version - 1)
        if version != newest + 1:
            raise ValueError(f"published θ_{version} after θ_{newest}: weights are published once per step, in order")
        self._snapshots[version] = WeightSnapshot(version, {k: v.detach().clone() for k, v in state.items()})
        for old in [v for v in self._snapshots if v < version - self.gate.max_lag]:
            del self._snapshots[old]

    def acquire(self, update_step: int) -> WeightSnapshot | None:
        """The newest snapshot a unit of batch ``update_step`` may start with, or None (wait for a publish)."""
        allowed = [v for v in self._snapshots if self.gate.may_start(update_step, v)]
        return self._snapshots[max(allowed)] if allowed else None


def generate_fragment(
    model: Policy, version: int, members: Sequence[tuple[int, int]], tokens: torch.Tensor,
    seeds: torch.Tensor, plan: SamplingPlan, score: ScoreFn, produced_by: str,
    version_now: Callable[[], int] | None = None,
) -> list[ScoredSample]:
    """Draw and score the generations ``members`` ((prompt, sample) pairs) with ``model`` holding θ_version.

    ``tokens`` (P, L) are the batch's prompts, ``seeds`` (P, G) their seeds: a generation is a pure
    function of (weights, prompt, seed), so the same member drawn on any device with the same weights
    gives the same sample. ``version_now`` reads the version the worker holds at each step (default:
    ``version``); it is what the staleness check later compares.
    """
    read_version = version_now or (lambda: version)
    member_tokens = torch.stack([tokens[p] for p, _ in members])
    step_versions: list[int] = []

    def velocity(x: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        step_versions.append(read_version())
        return model(x, sigma, member_tokens)

    trajectory = sample(velocity, [int(seeds[p, g]) for p, g in members], plan, model.latent_shape)
    scores = score(trajectory.final, members)
    return [ScoredSample(id=GenerationId(p, g, version), latents=trajectory.latents[i],
                         log_probs=trajectory.log_probs[i], tokens=tokens[p], reward=reward, valid=valid,
                         produced_by=produced_by, step_versions=tuple(step_versions))
            for i, ((p, g), (reward, valid)) in enumerate(zip(members, scores, strict=True))]


class GenerationWorker:
    """A generator device: loads a snapshot between trajectories and draws fragments with it."""

    def __init__(self, model: Policy) -> None:
        self.model = model
        self.version: int | None = None

    def load(self, snapshot: WeightSnapshot) -> None:
        self.model.load_broadcast_state(snapshot.state)
        self.version = snapshot.version

    def generate(self, members: Sequence[tuple[int, int]], tokens: torch.Tensor, seeds: torch.Tensor,
                 plan: SamplingPlan, score: ScoreFn) -> list[ScoredSample]:
        if self.version is None:
            raise RuntimeError("this generation worker holds no weights yet: load a published snapshot first")
        return generate_fragment(self.model, self.version, members, tokens, seeds, plan, score, "generator",
                                 version_now=lambda: self.version)
