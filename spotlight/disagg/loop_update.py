"""The training loop's update in mode disaggregated: θ_s → θ_{s+1} from groups as the backend delivers them.

`Trainer.update` calls `GroupedUpdate.update` with the backend's stream of complete groups. Each group
is checked by the version gate (no sample more than one version stale, one version per trajectory:
`StalenessError` otherwise), then forwarded and backpropagated at once (`LogicalBatchUpdate.add`), so
with GAP the trainer trains while generators still sample; after the last group, ONE optimizer step.
Without GAP the backend delivers the same groups, in prompt order, after the whole batch is scored
(the one-shot fallback): same samples, same loss, same step.

The loss is the group loss of `spotlight.disagg.group_loss`: NFT with forward-process noise keyed by
(run seed, step, generation id), so it does not depend on arrival order; Flow-GRPO at timesteps
chosen once per batch from the update's stream, as `grpo_update` chooses them. NFT's sampling policy
of a sample is the snapshot of the version that drew it: θ_s, or θ_{s-1} with one-step asynchrony,
so the update keeps the last two versions' weights.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterable
from typing import Any

import torch

from spotlight.diffusion.sampler import SamplingPlan
from spotlight.disagg.accumulate import LogicalBatchUpdate
from spotlight.disagg.group_loss import GrpoGroupLoss, NftGroupLoss, keyed_forward_noise
from spotlight.disagg.groups import AssembledGroup
from spotlight.disagg.versions import VersionGate
from spotlight.models.policy import Policy
from spotlight.models.weight_payload import copy_weights
from spotlight.rl.grpo import choose_train_timesteps

__all__ = ["GroupedUpdate"]


class GroupedUpdate:
    """Trains one logical batch per call from its groups; keeps θ_s and θ_{s-1} for NFT's sampling policies.

    ``section``: the run's ``train`` section (algorithm, NFT and GRPO fields, grad_clip). ``pack_timesteps``:
    TSP. ``gate``: the version gate of ``disagg.async_one_step``.
    """

    def __init__(self, model: Policy, reference: Policy | None, optimizer: torch.optim.Optimizer, section: Any,
                 run_seed: int, pack_timesteps: bool, gate: VersionGate) -> None:
        self.model, self.reference, self.optimizer = model, reference, optimizer
        self.section, self.run_seed, self.pack_timesteps, self.gate = section, run_seed, pack_timesteps, gate
        self._snapshots: dict[int, Policy] = {}
        self._spare: Policy | None = None

    def _snapshot(self, step: int) -> dict[int, Policy]:
        """θ_step (the weights now) and θ_{step-1} (kept from the last call), read-only copies."""
        keep = {v: m for v, m in self._snapshots.items() if v >= step - self.gate.max_lag and v != step}
        for version, spare in self._snapshots.items():
            if version not in keep:
                self._spare = spare
        current = self._spare if self._spare is not None else copy.deepcopy(self.model).requires_grad_(False)
        self._spare = None
        copy_weights(current, self.model)  # on the device, no host round trip (models/weight_payload.py)
        self._snapshots = {**keep, step: current.eval()}
        return self._snapshots

    def update(self, step: int, groups: Iterable[AssembledGroup], num_groups: int, plan: SamplingPlan,
               generator: torch.Generator) -> dict[str, float]:
        """θ_step → θ_step+1 from ``num_groups`` groups (consumed as they come); the update's metrics.

        ``time/train_s`` counts the trainer's forward/backward and step only, not waiting for groups.
        """
        section = self.section
        if section.algorithm == "nft":
            snapshots = self._snapshot(step)
            shape = self.model.latent_shape
            loss = NftGroupLoss(snapshots, lambda sample_id: keyed_forward_noise(
                self.run_seed, step, sample_id, section.nft_timesteps, shape), section.nft_beta,
                section.nft_adv_scale, section.nft_timesteps, pack_timesteps=self.pack_timesteps,
                weighting=section.nft_weighting)
        else:
            num_steps = plan.stochastic_steps if plan.stochastic_steps is not None else plan.num_steps
            timesteps = choose_train_timesteps(num_steps, section.timestep_fraction, generator,
                                               section.timestep_selection)
            loss = GrpoGroupLoss(timesteps, plan.sigmas(), plan.noise_level, section.clip_range, section.kl_beta,
                                 self.reference, pack_timesteps=self.pack_timesteps)
        batch = LogicalBatchUpdate(self.model, loss, num_groups)
        train_s, lags = 0.0, []
        for group in groups:
            self.gate.check_update(step, group.samples)
            lags.extend(step - sample.id.policy_version for sample in group.samples)
            started = time.perf_counter()
            batch.add(group)
            train_s += time.perf_counter() - started
        started = time.perf_counter()
        metrics = batch.commit(self.optimizer, section.grad_clip)
        train_s += time.perf_counter() - started
        metrics.update({"time/train_s": train_s, "disagg/max_version_lag": float(max(lags, default=0)),
                        "disagg/stale_fraction": sum(lag > 0 for lag in lags) / max(len(lags), 1)})
        return metrics
