"""Seconds per piece of a disaggregated step, from FLOPs and bytes (the assumptions in `ladder_config`).

Generation: one sample is ``sampling_steps`` denoising steps of ``guidance_forwards`` forwards on one
device at ``generate_mfu``. Training: each trained timestep of a sample is a forward + backward
(``train_pass_factor`` forwards) plus ``reference_forwards`` frozen forwards, with guidance, at
``train_mfu``; the trainer is FSDP sharded inside a machine (HSDP: shards over NVLink, replicas across
machines), so every pass all-gathers the weights for the forward, the backward and each reference
forward and reduce-scatters the gradient: ``fsdp_exposed_fraction`` of that is not hidden behind
compute. Timestep packing (TSP) puts up to ``tsp_max_pack`` timesteps of a sample in one pass, so
those collectives are paid once per pack instead of once per timestep; the compute is the same.
A step ends with the all-reduce of gradient shards across replicas and, when disaggregated, a
broadcast of the weights to the generators. Moving the trainer's optimizer state and gradients to
the host and back (colocated generation each step, or a TAG burst) goes over PCIe.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from spotlight.disagg.ladder_config import Costs, DiTModel, Hardware
from spotlight.sim.workload import WorkloadSection, forward_flops


@dataclass(frozen=True)
class StepCosts:
    """Seconds (one device unless said): ``generate_sample_s`` one sample; ``train_row_s`` the compute of one
    trained (sample, timestep); ``pass_comm_s`` the exposed collectives of one training pass;
    ``commit_s`` the end of a step on the trainer; ``publish_s`` weights to the generators;
    ``offload_restore_s`` training state to the host and back; ``trained_timesteps`` per sample."""

    generate_sample_s: float
    train_row_s: float
    pass_comm_s: float
    commit_s: float
    publish_s: float
    offload_restore_s: float
    trained_timesteps: int

    def passes_per_sample(self, tsp: bool, max_pack: int) -> int:
        """Training passes per sample: one per trained timestep, or one per pack of ≤ ``max_pack`` with TSP."""
        return math.ceil(self.trained_timesteps / max_pack) if tsp else self.trained_timesteps

    def pass_s(self, tsp: bool, max_pack: int) -> float:
        """One pass on one device: its share of the sample's rows plus the pass's exposed collectives."""
        passes = self.passes_per_sample(tsp, max_pack)
        return self.trained_timesteps / passes * self.train_row_s + self.pass_comm_s

    def train_sample_s(self, tsp: bool, max_pack: int) -> float:
        """One sample's training on one trainer device: its rows' compute plus one pass's collectives per pass."""
        return self.passes_per_sample(tsp, max_pack) * self.pass_s(tsp, max_pack)

    def train_chunk_s(self, samples: int, devices: int, tsp: bool, max_pack: int) -> float:
        """Training ``samples`` on ``devices`` data-parallel devices: the passes (a timestep, or a TSP pack,
        of one sample) are spread over the devices, so a chunk with fewer passes than devices leaves some
        idle. With TSP the pack size (1 .. max_pack) is chosen per chunk: big packs save collectives, but
        a small chunk of big packs leaves devices idle."""
        packs = range(1, max_pack + 1) if tsp else [1]
        return min(math.ceil(samples * self.passes_per_sample(True, pack) / devices) * self.pass_s(True, pack)
                   for pack in packs)


def forward_s(model: DiTModel, hardware: Hardware, mfu: float) -> float:
    """One guided forward of one sample (all ``guidance_forwards``) at ``mfu``."""
    workload = WorkloadSection(resolution=model.resolution, text_tokens=model.text_tokens,
                              num_layers=model.num_layers, hidden_size=model.hidden_size, params=model.params)
    return model.guidance_forwards * forward_flops(workload) / (mfu * hardware.peak_flops)


def step_costs(model: DiTModel, hardware: Hardware, costs: Costs, sampling_steps: int, trained_fraction: float,
               trainer_devices: int) -> StepCosts:
    """The `StepCosts` of one setting with ``trainer_devices`` training devices."""
    if trainer_devices < 1:
        raise ValueError(f"a trainer needs ≥ 1 device (got {trainer_devices})")
    weight_bytes = model.params * costs.bytes_per_param
    shard = min(trainer_devices, hardware.devices_per_machine)
    replicas = max(1, trainer_devices // shard)
    collective_s = weight_bytes * (shard - 1) / shard / hardware.nvlink_bandwidth
    # all-gathers for the forward, the backward and each reference forward; one gradient reduce-scatter
    collectives_per_pass = 2 + costs.reference_forwards + 1
    cross_replica_s = 2 * (replicas - 1) / replicas * weight_bytes / shard / hardware.network_bandwidth
    state_bytes = model.params * (costs.optimizer_bytes_per_param + costs.bytes_per_param) / shard
    return StepCosts(
        generate_sample_s=sampling_steps * forward_s(model, hardware, hardware.generate_mfu),
        train_row_s=(costs.train_pass_factor + costs.reference_forwards)
        * forward_s(model, hardware, hardware.train_mfu),
        pass_comm_s=costs.fsdp_exposed_fraction * collectives_per_pass * collective_s,
        commit_s=cross_replica_s,
        publish_s=weight_bytes / hardware.network_bandwidth,
        offload_restore_s=2 * state_bytes / hardware.pcie_bandwidth + collective_s,
        trained_timesteps=max(1, math.ceil(trained_fraction * sampling_steps)),
    )
