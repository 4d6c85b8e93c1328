"""Tests for spotlight.sim.workload: tokens, FLOPs, step times, SP communication and training time by hand."""

from __future__ import annotations

import pytest

from spotlight.sim.workload import WorkloadSection, describe, device_times, forward_flops, sp_comm_bytes, tokens

# 24·L·d²·n + 4·L·n²·d at L = 60, d = 3072, n = 80² + 128 = 6528, multiplied out by hand:
# 24·60·3072²·6528 = 88 712 549 498 880 and 4·60·6528²·3072 = 31 419 027 947 520.
FLOPS_1280 = 88_712_549_498_880 + 31_419_027_947_520
H100_AT_40_PERCENT = 0.40 * 989e12


def test_tokens_are_vae_and_patch_downsampled_image_tokens_plus_text() -> None:
    assert tokens(WorkloadSection(resolution=512)) == 32 * 32 + 128
    assert tokens(WorkloadSection(resolution=1280)) == 80 * 80 + 128
    assert tokens(WorkloadSection(resolution=1280, text_tokens=0)) == 6400


def test_resolution_off_the_latent_grid_is_refused_with_the_fix() -> None:
    with pytest.raises(ValueError, match=r"resolution must be a multiple of .* = 16 \(got 1000\); round it to 992"):
        tokens(WorkloadSection(resolution=1000))


def test_forward_flops_of_a_toy_block_by_hand() -> None:
    # L = 1, d = 2, 32² image → (32/16)² = 4 tokens, no text: 24·1·4·4 + 4·1·16·2 = 384 + 128.
    toy = WorkloadSection(resolution=32, text_tokens=0, num_layers=1, hidden_size=2, num_heads=2)
    assert forward_flops(toy) == 512


def test_forward_flops_of_qwen_image_at_1280() -> None:
    assert forward_flops(WorkloadSection(resolution=1280)) == pytest.approx(FLOPS_1280, rel=1e-12)


def test_compute_bound_step_is_guided_forwards_over_sustained_flops() -> None:
    times = device_times(WorkloadSection(resolution=1280, sp_degree=1))
    assert times.step_s == pytest.approx(2 * FLOPS_1280 / H100_AT_40_PERCENT, rel=1e-12)  # 0.6073 s
    assert times.sp_efficiency == pytest.approx(1.0)
    assert times.sample_step_device_s == pytest.approx(times.step_s)


def test_ulysses_all_to_all_bytes_by_hand() -> None:
    # 4 all-to-alls × 60 layers, each (6528/4)·3072·2 bytes · 3/4 = 7 520 256 bytes.
    assert sp_comm_bytes(WorkloadSection(resolution=1280), 4) == pytest.approx(240 * 7_520_256)
    assert sp_comm_bytes(WorkloadSection(resolution=1280), 1) == 0.0


def test_sp_step_adds_all_to_all_time_over_nvlink_inside_a_machine() -> None:
    config = WorkloadSection(resolution=1280, sp_degree=4)
    times = device_times(config, gpus_per_machine=8)
    compute = 2 * FLOPS_1280 / (4 * H100_AT_40_PERCENT)
    comm = 2 * 240 * 7_520_256 / 300e9
    assert times.uses_nvlink
    assert times.step_s == pytest.approx(compute + comm, rel=1e-12)
    assert times.sp_efficiency == pytest.approx(compute / (compute + comm), rel=1e-12)  # 0.927


def test_sp_group_spanning_machines_pays_the_slower_network() -> None:
    config = WorkloadSection(resolution=1280, sp_degree=4)
    inside, across = device_times(config, gpus_per_machine=8), device_times(config, gpus_per_machine=1)
    assert not across.uses_nvlink
    comm_difference = 2 * 240 * 7_520_256 * (1 / 40e9 - 1 / 300e9)
    assert across.step_s - inside.step_s == pytest.approx(comm_difference, rel=1e-9)


def test_small_per_device_compute_is_bounded_below_by_reading_the_weights() -> None:
    # 512² over 8 devices: 2·16.6 TFLOP / (8 · 395.6 TFLOP/s) = 10.5 ms < 40 GB / 3.35 TB/s = 11.9 ms.
    config = WorkloadSection(resolution=512, sp_degree=8)
    times = device_times(config)
    comm = 2 * sp_comm_bytes(config, 8) / 300e9
    assert times.step_s == pytest.approx(20e9 * 2 / 3.35e12 + comm, rel=1e-12)


def test_batching_costs_only_communication_while_memory_bound() -> None:
    # 256²: (16² + 128) tokens; 2·b forwards over 8 devices stay under the 11.9 ms weight read for b ≤ 2.
    one = WorkloadSection(resolution=256, sp_degree=8, batch_size=1)
    two = one.model_copy(update={"batch_size": 2})
    step_one, step_two = device_times(one).step_s, device_times(two).step_s
    assert step_two - step_one == pytest.approx(2 * sp_comm_bytes(one, 8) / 300e9, rel=1e-9)
    assert device_times(two).sample_step_device_s < 0.6 * device_times(one).sample_step_device_s


def test_sp_degree_must_divide_the_heads() -> None:
    with pytest.raises(ValueError, match=r"sp_degree must divide num_heads = 24 .*got 5.*\[1, 2, 3, 4, 6, 8, 12, 24\]"):
        device_times(WorkloadSection(sp_degree=5))


def test_training_time_is_passes_over_trained_steps_plus_a_gradient_all_reduce() -> None:
    config = WorkloadSection(resolution=1280)
    times = device_times(config)
    per_sample = 10 * (3 + 1) * 2 * FLOPS_1280 / H100_AT_40_PERCENT  # steps · (fwd+bwd + reference) · CFG
    assert times.train_sample_device_s == pytest.approx(per_sample, rel=1e-12)
    all_reduce = 2 * 31 / 32 * 40e9 / 40e9
    assert times.train_s(config, 512, 32) == pytest.approx(512 * per_sample / 32 + all_reduce, rel=1e-12)
    without_kl = device_times(config.model_copy(update={"kl_reference": False}))
    assert without_kl.train_sample_device_s / times.train_sample_device_s == pytest.approx(3 / 4)


def test_training_needs_an_on_demand_device() -> None:
    config = WorkloadSection()
    with pytest.raises(ValueError, match="num_devices must be >= 1"):
        device_times(config).train_s(config, 8, 0)


def test_broadcast_moves_the_trainable_bf16_weights_once() -> None:
    assert device_times(WorkloadSection()).broadcast_s == pytest.approx(20e9 * 2 / 40e9)
    lora = device_times(WorkloadSection(trainable_params=200e6))
    assert lora.broadcast_s == pytest.approx(0.01)
    assert lora.weight_copy_s == pytest.approx(1.0)  # a joining device still needs all weights


def test_describe_reports_the_docstring_numbers() -> None:
    numbers = describe(WorkloadSection(resolution=1280))
    assert numbers["tokens"] == 6528
    assert numbers["tflop_per_forward"] == pytest.approx(120.13, abs=0.01)
    assert numbers["step_s"] == pytest.approx(0.607, abs=0.001)
    assert numbers["train_sample_device_s"] == pytest.approx(24.29, abs=0.01)
