"""Wan2.2 A14B's two experts end to end (issue 45): a tiny two-expert ``WanPipeline`` folder trained on videos.

A vanilla run of NFT with LoRA on both experts moves the reward, every checkpoint holds each expert's LoRA in
diffusers' format, and both load with ``WanPipeline``'s own ``load_lora_weights`` (the second with
``load_into_transformer_2``) and change its video. A spotlight run trains too: its spot device builds the
two-expert policy from the broadcast description, takes both experts' LoRA from the broadcast weights, and
explores later iterations' seeds with both experts (two steps: timesteps 1000 and 9, one on each side of the
boundary), each guided at its own scale (``rollout.guidance_scale_2``).
"""

from __future__ import annotations

import pytest
import torch
from resume_helpers import metrics
from test_wan_train import assert_the_reward_moved, settings

from spotlight.components.checkpoint import latest_checkpoint, load_model
from spotlight.config import TrainConfig, parse_config
from spotlight.models.video.two_experts_policy import LOW_NOISE_LORA_FILE, TwoExpertsPolicy
from spotlight.trainer import train


@pytest.mark.slow
def test_vanilla_mode_trains_both_experts_and_their_lora_loads_into_wan_pipeline(tiny_pipeline, tmp_path) -> None:
    import diffusers
    import video_reward

    folder, run_dir = tiny_pipeline("wan22"), tmp_path / "run"
    video_reward.SEEN.clear()
    config = settings(folder, run_dir)
    config["rollout"]["num_steps"] = config["eval"]["num_steps"] = 4  # timesteps 1000 | 858, 602, 9: both experts
    config["train"]["nft_timesteps"] = 4  # noise levels per sample: an eighth of them (sigma >= 0.875) reach the
    # high-noise expert
    train(parse_config(TrainConfig, config))
    assert video_reward.SEEN and all(shape[1:] == (5, 3, 32, 32) for shape in video_reward.SEEN)
    assert_the_reward_moved(metrics(run_dir))
    checkpoint = latest_checkpoint(run_dir)
    trained = load_model(checkpoint)
    assert isinstance(trained, TwoExpertsPolicy)
    for index in (0, 1):  # each expert's LoRA B moved off its zero start
        assert any(tensor.abs().max() > 0 for name, tensor in trained.lora_state_dict().items()
                   if name.startswith(f"experts.{index}.") and "lora_B" in name)

    pipe = diffusers.WanPipeline.from_pretrained(str(folder))
    pipe.set_progress_bar_config(disable=True)

    def video() -> torch.Tensor:
        return pipe("a red ball", num_frames=5, height=32, width=32, num_inference_steps=4, guidance_scale=1.0,
                    max_sequence_length=32, output_type="latent", generator=torch.Generator().manual_seed(0)).frames

    before = video()
    pipe.load_lora_weights(str(checkpoint))
    high_only = video()
    pipe.load_lora_weights(str(checkpoint), weight_name=LOW_NOISE_LORA_FILE, load_into_transformer_2=True)
    both = video()
    assert (high_only - before).abs().max() > 1e-4 and (both - high_only).abs().max() > 1e-4


@pytest.mark.slow
def test_spotlight_mode_trains_both_experts_with_a_spot_device_exploring(tiny_pipeline, tmp_path) -> None:
    """Two iterations, the fewest in which a spot device explores: iteration 1 samples random seeds, and its
    round explores iteration 2's on the spot device with both experts (broadcast LoRA of each)."""
    import ray

    run_dir = tmp_path / "run"
    config = settings(tiny_pipeline("wan22"), run_dir, "spotlight")
    config.update(iterations=2, checkpoint_every=2)
    config["eval"]["every"] = 2  # validation before and after training only
    config["train"]["nft_timesteps"] = 4  # as the vanilla run: some noise levels reach the high-noise expert
    config["rollout"]["guidance_scale_2"] = 1.5  # the spot device guides each expert's step at its own scale
    summary = train(parse_config(TrainConfig, config))
    assert "planner/num_candidates" in summary.history[2]  # iteration 2's seeds were explored on the spot device
    records = metrics(run_dir)
    assert [record["iteration"] for record in records] == [0, 1, 2]
    assert all(record["rollout/invalid_samples"] == 0 for record in records[1:])
    assert records[2]["rollout/reward_mean"] > records[1]["rollout/reward_mean"]
    assert abs(records[2]["val/reward"] - records[0]["val/reward"]) > 1e-4  # the tiny VAE's scale (test_wan_train)
    trained = load_model(latest_checkpoint(run_dir))
    for index in (0, 1):  # each expert's LoRA B moved off its zero start
        assert any(tensor.abs().max() > 0 for name, tensor in trained.lora_state_dict().items()
                   if name.startswith(f"experts.{index}.") and "lora_B" in name)
    assert not ray.is_initialized()
