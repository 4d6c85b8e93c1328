"""`spotlight.sim.scaling`: the ring all-reduce's closed form, the link it runs on, one iteration's terms on N ranks.

The workload is written here with round numbers (no folder), so every expected value is worked out by hand.
"""

from __future__ import annotations

import pytest

from spotlight.sim.planning.device_profiles import profile
from spotlight.sim.planning.folder_workload import FolderWorkload
from spotlight.sim.scaling import Interconnect, all_reduce_s, scaling_row, trajectory_bytes

LINK = Interconnect(gpus_per_node=8, nvlink_bytes_per_s=100e9, network_bytes_per_s=10e9, nvlink_hop_s=1e-6,
                    network_hop_s=2e-6)


def workload() -> FolderWorkload:
    """1 TFLOP a rollout image, 3 TFLOP an update sample, 1 M trained weights, 4 optimizer steps, 64 rows a minibatch
    of a 256-sample batch, micro-batches of 8 rows; 16 image tokens."""
    return FolderWorkload(
        folder=None, family="sd3", resolution=(64, 64), vae_scale_factor=8, image_tokens=16, text_tokens=8,
        text_tokens_source="", forward_flops=0.1e12, train_pass_flops=0.3e12, guidance_forwards=1,
        rollout_forwards_per_image=10, update_passes={}, update_flops_per_sample=3e12, optimizer_steps=4,
        parameters=10_000_000, trainable_parameters=1_000_000, text_encoder_parameters=0, vae_parameters=0, blocks=1,
        hidden=64, heads=1, memory=None, micro_batch=8, minibatch_rows=64)


def test_a_ring_all_reduce_moves_2_n_minus_1_over_n_of_the_bytes_on_nvlink_in_a_machine_the_network_past_it() -> None:
    assert all_reduce_s(4e9, 1, LINK) == 0.0
    assert all_reduce_s(4e9, 2, LINK) == pytest.approx(4e9 / 100e9 + 2 * 1e-6)
    assert all_reduce_s(4e9, 8, LINK) == pytest.approx(2 * 7 / 8 * 4e9 / 100e9 + 14 * 1e-6)
    assert all_reduce_s(4e9, 16, LINK) == pytest.approx(2 * 15 / 16 * 4e9 / 10e9 + 30 * 2e-6)


def test_one_iteration_on_n_ranks_is_its_share_of_compute_plus_the_exchange_and_the_all_reduces() -> None:
    device = profile("H100-SXM")
    work = workload()
    row = scaling_row(work, device, LINK, gpus=16, images=32, batch_images=256, latents=11)
    peak = device.peak_bf16_dense_tflops * 1e12
    assert row.rollout_s == pytest.approx(32 * 1e12 / (peak * device.rollout_efficiency))
    assert row.update_s == pytest.approx(32 * 3e12 / (peak * device.update_efficiency))
    # a rank's minibatch share: 64 x 32 / 256 = 8 rows, one micro-batch: one all-reduce per optimizer step
    assert row.all_reduces == 4
    assert row.all_reduce_s == pytest.approx(4 * all_reduce_s(4e6, 16, LINK))
    assert trajectory_bytes(work, 11) == 11 * 16 * 4 * 16 * 4  # 11 latents of 16 tokens x 4 pixels x 16 channels
    assert row.exchange_s == pytest.approx(2 * 15 * 32 * trajectory_bytes(work, 11) / 10e9)
    assert row.images_per_gpu_s == pytest.approx(32 / (row.rollout_s + row.update_s + row.all_reduce_s
                                                       + row.exchange_s))
    alone = scaling_row(work, device, LINK, gpus=1, images=32, batch_images=256, latents=11)
    assert alone.all_reduce_s == alone.exchange_s == 0.0 and alone.images_per_gpu_s > row.images_per_gpu_s


def test_the_assumed_interconnect_is_stated_from_the_profile() -> None:
    link = Interconnect.of(profile("H100-SXM"))
    assert link.describe().startswith("8 GPUs a machine on NVLink at 300 GB/s per GPU, machines on a network "
                                      "at 40 GB/s")
