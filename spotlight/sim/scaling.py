"""Images per GPU-second of a data-parallel trainer on N GPUs: the rollout and update split over N ranks, the
gradient all-reduce and the batch exchange priced on the assumed interconnect.

The loop on N trainer ranks (`spotlight.ranks`): each rank samples and scores its share of the groups,
every rank then holds the whole scored batch (the update's shuffle is over all rows) and computes its
share of each minibatch's rows, the gradients summed by an all-reduce after every micro-batch backward.
Per iteration and rank, with ``images`` its share of the samples:

    rollout    images x rollout FLOPs per image / (peak x rollout efficiency)
    exchange   the other N - 1 ranks' samples as the update reads them (`spotlight.ranks.rollout.
               what_the_update_reads`: NFT the clean latent, Flow-GRPO all rollout.num_steps + 1, float32),
               twice: gathered on rank 0, then fetched by every rank so that it holds the whole batch, as
               the loop does now (Ray's object store: a rank fetches from any node that holds a copy)
    update     images x update FLOPs per sample / (peak x update efficiency)
    all-reduce optimizer steps x micro-batches x ring all-reduce of the trained weights' float32
               gradients: 2 (N - 1) / N x bytes / link bandwidth + 2 (N - 1) x hop latency, on NVLink
               within a machine of ``gpus_per_node`` GPUs, on the network (per GPU) across machines; no
               overlap with the backward is assumed (an upper bound: DDP overlaps its buckets)

The FLOPs and the trainable parameters are the folder's, counted on the meta device
(`spotlight.sim.planning.folder_workload`); the peak, the efficiencies and the link speeds are the GPU profile's
(`spotlight.sim.planning.device_profiles`), each with its source. Nothing here was measured on a GPU.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from spotlight.sim.planning.device_profiles import DeviceProfile
from spotlight.sim.planning.folder_workload import FLOAT32_BYTES, FolderWorkload

__all__ = ["Interconnect", "ScalingRow", "all_reduce_s", "scaling_row", "trajectory_bytes"]

LATENT_CHANNELS = 16  # SD3.5, FLUX and Qwen-Image's VAEs; a 2 x 2 patch makes one image token of 4 latent pixels
PATCH_PIXELS = 4


@dataclass(frozen=True)
class Interconnect:
    """The links an all-reduce runs on: per-GPU achieved bandwidths and one hop's latency on each."""

    gpus_per_node: int
    nvlink_bytes_per_s: float
    network_bytes_per_s: float
    nvlink_hop_s: float = 5e-6  # assumption: NCCL's per-step latency within a machine (a few µs)
    network_hop_s: float = 15e-6  # assumption: per ring step between machines over RDMA

    @classmethod
    def of(cls, device: DeviceProfile, gpus_per_node: int = 8) -> Interconnect:
        """The profile's achieved NVLink and network bandwidth per GPU, ``gpus_per_node`` GPUs a machine."""
        return cls(gpus_per_node, device.nvlink_achieved_gb_per_s * 1e9, device.network_achieved_gb_per_s * 1e9)

    def describe(self) -> str:
        """The assumption in one line, for a table's caption."""
        return (f"{self.gpus_per_node} GPUs a machine on NVLink at {self.nvlink_bytes_per_s / 1e9:.0f} GB/s per GPU, "
                f"machines on a network at {self.network_bytes_per_s / 1e9:.0f} GB/s per GPU; ring all-reduce, "
                f"{self.nvlink_hop_s * 1e6:.0f} / {self.network_hop_s * 1e6:.0f} µs a step")

    def link(self, gpus: int) -> tuple[float, float]:
        """(bandwidth, hop latency) of a ring over ``gpus``: NVLink within one machine, else the network's."""
        if gpus <= self.gpus_per_node:
            return self.nvlink_bytes_per_s, self.nvlink_hop_s
        return self.network_bytes_per_s, self.network_hop_s


def all_reduce_s(num_bytes: float, gpus: int, link: Interconnect) -> float:
    """Seconds of one ring all-reduce of ``num_bytes`` over ``gpus`` GPUs (0 for one GPU)."""
    if gpus == 1:
        return 0.0
    bandwidth, hop = link.link(gpus)
    return 2.0 * (gpus - 1) / gpus * num_bytes / bandwidth + 2.0 * (gpus - 1) * hop


def trajectory_bytes(work: FolderWorkload, latents: int) -> float:
    """Bytes of one sample as the update's batch holds it: ``latents`` float32 latents (NFT 1, Flow-GRPO K + 1)."""
    return latents * work.image_tokens * PATCH_PIXELS * LATENT_CHANNELS * FLOAT32_BYTES


@dataclass(frozen=True)
class ScalingRow:
    """One iteration on ``gpus`` trainer ranks, ``images`` samples on each (seconds per rank)."""

    gpus: int
    images: int
    rollout_s: float
    exchange_s: float
    update_s: float
    all_reduce_s: float
    all_reduces: int

    @property
    def iteration_s(self) -> float:
        return self.rollout_s + self.exchange_s + self.update_s + self.all_reduce_s

    @property
    def images_per_gpu_s(self) -> float:
        return self.images / self.iteration_s

    def as_dict(self) -> dict[str, float]:
        return {**asdict(self), "iteration_s": self.iteration_s, "images_per_gpu_s": self.images_per_gpu_s}


def scaling_row(work: FolderWorkload, device: DeviceProfile, link: Interconnect, gpus: int, images: int,
                batch_images: int, latents: int) -> ScalingRow:
    """One iteration on ``gpus`` ranks with ``images`` samples each (module docstring for each term).

    ``batch_images``: the samples of the iteration ``work`` was derived for (its ``minibatch_rows`` are that
    batch's), to scale a minibatch's rows to one rank's share; ``latents``: a sample's latents in the update's
    batch (NFT 1, Flow-GRPO rollout.num_steps + 1).
    """
    peak = device.peak_bf16_dense_tflops * 1e12
    rollout = images * work.rollout_flops_per_image / (peak * device.rollout_efficiency)
    update = images * work.update_flops_per_sample / (peak * device.update_efficiency)
    rank_rows = math.ceil(work.minibatch_rows * images / batch_images)
    reduces = work.optimizer_steps * math.ceil(rank_rows / work.micro_batch) if gpus > 1 else 0
    bandwidth, _ = link.link(gpus)
    exchange = 2.0 * (gpus - 1) * images * trajectory_bytes(work, latents) / bandwidth
    return ScalingRow(gpus=gpus, images=images, rollout_s=rollout, exchange_s=exchange, update_s=update,
                      all_reduce_s=reduces * all_reduce_s(work.gradient_bytes, gpus, link), all_reduces=reduces)
