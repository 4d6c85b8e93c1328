"""The memory estimate: counts read from a folder's headers match the loaded models; the sum matches hand arithmetic."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from spotlight.config import TrainConfig, load_config
from spotlight.models.pipelines.adapter import DiffusersPolicy
from spotlight.models.pipelines.family_config import DEFAULT_LORA_TARGETS, DiffusersPolicyConfig
from spotlight.models.pipelines.memory_estimate import (
    ModelSizes,
    choose_micro_batch,
    estimate_training_memory,
    model_sizes,
    run_memory_estimate,
)
from spotlight.models.pipelines.tiny import save_tiny_pipeline

GIB = 1024**3


@pytest.fixture(scope="session")
def sd3_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_pipeline("sd3", tmp_path_factory.mktemp("memory") / "sd3")


def test_counts_from_the_headers_equal_the_loaded_models_parameters(sd3_folder: Path) -> None:
    from diffusers import DiffusionPipeline

    sizes = model_sizes(sd3_folder, DEFAULT_LORA_TARGETS, rank=4)
    pipe = DiffusionPipeline.from_pretrained(str(sd3_folder))

    def held(*modules: torch.nn.Module) -> int:  # parameters and persistent buffers (SD3's pos_embed), tied once
        return sum({t.data_ptr(): t.numel() for m in modules for t in m.state_dict().values()}.values())

    assert sizes.transformer == held(pipe.transformer) > sum(p.numel() for p in pipe.transformer.parameters())
    assert sizes.vae == held(pipe.vae)
    assert sizes.text_encoders == held(pipe.text_encoder, pipe.text_encoder_2, pipe.text_encoder_3)
    policy = DiffusersPolicy.from_config(DiffusersPolicyConfig(family="sd3", pretrained=str(sd3_folder),
                                                               dtype="float32", lora_rank=4, latent_size=16))
    assert sizes.lora == sum(p.numel() for p in policy.trainable_parameters())  # peft's own count
    assert (sizes.blocks, sizes.hidden) == (2, 16)  # 2 joint blocks of 2 heads x 8


# SD3.5-Medium-like sizes, so the hand arithmetic below reads like the real case
SIZES = ModelSizes(transformer=2_500_000_000, text_encoders=5_000_000_000, vae=84_000_000, lora=20_000_000,
                   blocks=24, hidden=1536, lora_inputs=(24 * 4 * 1536, 24 * 4 * 1536, 0),
                   lora_weights=24 * 8 * 1536 * 1536, vae_channels=128)


def test_a_lora_run_in_bfloat16_adds_up_by_hand() -> None:
    estimate = estimate_training_memory(SIZES, dtype="bfloat16", finetune="lora", optimizer="adamw",
                                        frozen_copies=3, reference=True, tokens=1357, rows=4,
                                        gradient_checkpointing=False, text_tokens=333, sample_rows=64,
                                        merged_lora=True, pixels=512 * 512)
    assert estimate.parts == {
        "transformer": 5_000_000_000, "vae": 168_000_000,
        "trained": 80_000_000, "gradients": 80_000_000, "optimizer": 160_000_000,
        "frozen copies": 240_000_000,  # EMA, θ_old, θ_{i-1} as LoRA tensors; the reference is free
        "cuda context": GIB // 2,
    }
    activations = 6_803_324_928  # 34 x 1357 x 1536 x 24 layers x 4 rows (2-byte activations)
    lora_inputs = 4 * 4 * 24 * 4 * 1536 * (1024 + 333)  # float32 x 4 rows x 96 layers per stream x width x tokens
    assert estimate.phases == {
        "update activations": activations + lora_inputs,
        "sampling": 10 * 64 * 1357 * 1536 * 2 + 24 * 8 * 1536 * 1536 * 2,  # 64 rows' block tensors + merged copies
        "vae decode": 4 * 8 * 512 * 512 * 128 * 2,  # 4 maps of 8 images at 128 channels
        "text encoders": 10_000_000_000,  # on the device while encoding only
    }
    assert estimate.peak_phase == "update activations"  # just above the text encoders' 10 GB
    assert estimate.total == sum(estimate.parts.values()) + activations + lora_inputs
    assert "+ update activations 9.3 GiB (the largest phase; sampling" in estimate.summary()
    checkpointed = estimate_training_memory(SIZES, dtype="bfloat16", finetune="lora", optimizer="adamw",
                                            frozen_copies=3, reference=True, tokens=1357, rows=4,
                                            gradient_checkpointing=True, text_tokens=333)
    # 2 x 1357 x 1536 x 24 x 4 (block inputs) + 34 x 1357 x 1536 x 4 (the block being recomputed), and the
    # recomputed block's LoRA inputs
    assert checkpointed.phases["update activations"] == 400_195_584 + 283_471_872 + lora_inputs // 24


def test_full_fine_tuning_keeps_float32_weights_and_copies() -> None:
    estimate = estimate_training_memory(SIZES, dtype="bfloat16", finetune="full", optimizer="sgd",
                                        frozen_copies=1, reference=True, tokens=1357, rows=4,
                                        gradient_checkpointing=False)
    assert estimate.parts["transformer"] == 10_000_000_000
    assert estimate.parts["trained"] == 0
    assert estimate.parts["gradients"] == estimate.parts["optimizer"] == 10_000_000_000  # sgd: one momentum
    assert estimate.parts["frozen copies"] == 20_000_000_000  # θ_{i-1} and the reference base
    assert estimate.phases["update activations"] == 6_803_324_928  # no LoRA, no float32 adapter inputs


def test_fsdp_shards_the_training_state_beside_one_whole_copy_to_sample_with() -> None:
    """A full fine-tune on 8 FSDP2 ranks with bf16 whole weights: 1/8 of θ, gradients, AdamW's moments and the
    three frozen copies (EMA, θ_old, reference) in float32, one bf16 transformer, two bf16 blocks gathered."""
    common = {"dtype": "bfloat16", "finetune": "full", "optimizer": "adamw", "frozen_copies": 2, "reference": True,
              "tokens": 1357, "rows": 4, "gradient_checkpointing": False}
    whole = estimate_training_memory(SIZES, **common)
    sharded = estimate_training_memory(SIZES, **common, shards=8, whole_bytes=2)
    assert sharded.parts == {
        "transformer (whole, sampling)": 5_000_000_000, "vae": 168_000_000,
        "trained shard": 1_250_000_000, "gradients": 1_250_000_000, "optimizer": 2_500_000_000,
        "frozen copies": 3_750_000_000,  # 3 x 10 GB / 8
        "gathered blocks": 2 * 5_000_000_000 // 24,
        "cuda context": GIB // 2,
    }
    assert sharded.phases == whole.phases  # activations are a rank's own micro-batch either way
    held = sum(whole.parts.values()) - sum(sharded.parts.values())
    assert held > 5 * 10**10  # 70.7 GB held by one process, 14.9 GB by each of the 8 ranks
    assert "transformer (whole, sampling) 4.7 GiB" in sharded.summary()


def test_fsdp_counts_the_start_up_and_the_refresh_of_the_sampling_copy() -> None:
    """The start-up holds the loaded float32 transformer, then the bf16 sampler beside θ's and the three frozen
    copies' shards (no gradient or moment yet), one block in flight; a refresh gathers one bf16 block
    (its shard, the all-gather's output and the block's tensors) beside the held training state. An iteration
    needs more on 8 ranks; on 32 ranks with one token to train the loaded float32 transformer sets the total."""
    common = {"dtype": "bfloat16", "finetune": "full", "optimizer": "adamw", "frozen_copies": 2, "reference": True,
              "tokens": 1357, "rows": 4, "gradient_checkpointing": False}
    block = 2_500_000_000 // 24
    eight = estimate_training_memory(SIZES, **common, shards=8, whole_bytes=2)
    # the loaded float32 transformer (10 GB) beside the first block's four shards (2 blocks' bytes), or the sampler
    # beside four versions' shards (5 + 5 GB) and the last block in float32 (2 bytes more a parameter): equal here
    assert eight.peaks["start-up"] == GIB // 2 + 10_000_000_000 + 4 * block * 4 // 8
    assert eight.peaks["start-up"] == GIB // 2 + 5_000_000_000 + 5_000_000_000 + 2 * block
    held = sum(eight.parts.values()) - eight.parts["gathered blocks"]
    assert eight.peaks["refresh"] == held + block * 2 * 17 // 8
    assert eight.total == eight.running > eight.peaks["refresh"] > eight.peaks["start-up"]
    assert "= 23.2 GiB; start-up peak 10.0 GiB, refresh peak 13.9 GiB" in eight.summary()
    two = estimate_training_memory(SIZES, **common, shards=2, whole_bytes=2)
    assert two.peaks["start-up"] == GIB // 2 + 5_000_000_000 + 4 * 5_000_000_000 + 2 * block
    idle = {**common, "tokens": 1, "rows": 1}
    many = estimate_training_memory(replace(SIZES, text_encoders=0), **idle, shards=32, whole_bytes=2)
    assert many.total == many.peaks["start-up"] > many.running
    assert f"start-up peak {many.total / GIB:.1f} GiB, refresh peak" in many.summary()
    assert many.summary().endswith(f": {many.total / GIB:.1f} GiB in all")


def test_a_runs_estimate_reads_its_resolution_text_length_and_minibatch(sd3_folder: Path) -> None:
    config = load_config(TrainConfig, None, [f"model.pretrained={sd3_folder}", "rollout.resolution=32",
                                             "train.ema_decay=null", "train.old_policy_decay=0"])
    estimate = run_memory_estimate(config)
    assert estimate is not None
    sizes = model_sizes(sd3_folder, DEFAULT_LORA_TARGETS, 4)
    # 32 px / VAE 2 = 16 x 16 latents = 64 tokens of 2x2, + 256 T5 + 77 CLIP; 16 x 8 samples / 4 minibatches
    # x 2 NFT noise levels = 64 rows
    image_in, text_in, _ = sizes.lora_inputs
    lora_inputs = 4 * 64 * (image_in * 64 + text_in * 333)
    assert estimate.phases["update activations"] == 34 * (64 + 333) * 16 * 2 * 64 * 4 // 2 + lora_inputs
    assert estimate.parts["frozen copies"] == 1 * 4 * sizes.lora  # θ_{i-1} alone (no EMA, no trailing θ_old)
    assert estimate.summary().startswith("memory estimate (trainer device): transformer ")
    assert "more than the device's 1.0 GiB" not in estimate.summary(100 * GIB)
    assert "more than the device's 0.0 MiB: lower train.micro_batch_size" in estimate.summary(1)
    assert run_memory_estimate(load_config(TrainConfig, None, [])) is None  # the toy model
    sliced = load_config(TrainConfig, None, [f"model.pretrained={sd3_folder}", "rollout.resolution=32",
                                             "train.micro_batch_size=8"])
    assert run_memory_estimate(sliced).phases["update activations"] == \
        34 * (64 + 333) * 16 * 2 * 8 * 4 // 2 + 4 * 8 * (image_in * 64 + text_in * 333)
    bad = load_config(TrainConfig, None, [f"model.pretrained={sd3_folder}", "rollout.resolution=33"])
    assert run_memory_estimate(bad) is None  # the run's start-up names the resolution in one line


def test_lora_inputs_are_counted_per_stream(sd3_folder: Path) -> None:
    sizes = model_sizes(sd3_folder, DEFAULT_LORA_TARGETS, 4)
    # 2 joint blocks of width 16: to_q, to_k, to_v, to_out.0 on the image stream, add_* and to_add_out on the text
    # (SD3's last block has no to_add_out: context_pre_only)
    assert sizes.lora_inputs[0] == 2 * 4 * 16
    assert 0 < sizes.lora_inputs[1] <= 2 * 4 * 16 and sizes.lora_inputs[2] == 0
    assert sizes.vae_channels > 0


def test_the_micro_batch_chosen_from_the_estimate_is_the_largest_that_fits(sd3_folder: Path) -> None:
    config = load_config(TrainConfig, None, [f"model.pretrained={sd3_folder}", "rollout.resolution=32",
                                             "model.max_sequence_length=16"])
    def total(rows: int) -> int:
        return run_memory_estimate(config, micro_batch_size=rows).total

    assert total(40) > total(20)  # the update's activations set the peak here
    device = int(total(20) / 0.9) + 1
    chosen = choose_micro_batch(config, device)
    assert chosen is not None and 20 <= chosen < 64
    assert total(chosen) <= 0.9 * device < total(chosen + 1)
    assert choose_micro_batch(config, 1) is None  # not even one row fits
    assert choose_micro_batch(config, 10**15) == 64  # everything: the minibatch's 64 rows at once


def test_a_cuda_run_without_a_micro_batch_gets_the_chosen_one(sd3_folder: Path, monkeypatch) -> None:
    from spotlight.models.pipelines import memory_estimate

    fields = [f"model.pretrained={sd3_folder}", "rollout.resolution=32", "model.max_sequence_length=16"]
    cuda = load_config(TrainConfig, None, [*fields, "device=cuda"])
    device = int(run_memory_estimate(cuda, micro_batch_size=20).total / 0.9) + 1
    monkeypatch.setattr(memory_estimate, "cuda_memory_bytes", lambda name: device if name == "cuda" else None)
    chosen = memory_estimate.with_estimated_micro_batch(cuda)
    assert chosen.train.micro_batch_size == choose_micro_batch(cuda, device) >= 20
    assert chosen.model == cuda.model and chosen.rollout == cuda.rollout  # nothing else changes
    assert memory_estimate.with_estimated_micro_batch(load_config(TrainConfig, None, fields)).train.micro_batch_size \
        is None  # a CPU run keeps its configuration
    set_by_user = load_config(TrainConfig, None, [*fields, "device=cuda", "train.micro_batch_size=3"])
    assert memory_estimate.with_estimated_micro_batch(set_by_user).train.micro_batch_size == 3
