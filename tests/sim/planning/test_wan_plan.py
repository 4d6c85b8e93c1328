"""`spotlight plan` and the memory estimate on Wan2.1 text-to-video (issue 45): video tokens, FLOPs, the 14B.

The meta-device count of a tiny Wan folder's forward (5 frames: 3 latent frames of 16 x 24 latents)
must be within 5% of torch's FlopCounterMode over the loaded policy's real forward, and `plan` prices
the shipped config-only Wan2.1-T2V-14B folder from its configs alone.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode
from typer.testing import CliRunner

from spotlight.cli import app
from spotlight.config import TrainConfig, load_config
from spotlight.models.pipelines.family_config import DiffusersPolicyConfig
from spotlight.models.pipelines.folder import read_pipeline_folder
from spotlight.models.rebuild import policy_from_config
from spotlight.sim.planning.forward_flops import count_forward_flops, text_tokens
from spotlight.sim.planning.model_folders import model_folder

RESOLUTION = (32, 48)  # not square: catches a swapped height and width
FRAMES = 5
LENGTH = 24


def test_meta_count_of_a_wan_video_forward_is_within_5_percent_of_torchs_counter(tiny_pipeline) -> None:
    folder = tiny_pipeline("wan")
    config = DiffusersPolicyConfig(family="wan", pretrained=str(folder), pipeline=True, resolution=RESOLUTION,
                                   num_frames=FRAMES, dtype="float32", lora_rank=4, max_sequence_length=LENGTH)
    policy = policy_from_config(config).eval()
    rows = policy.tokenize(["a red ball rolls left"] * 2, guided=False)
    latents = torch.randn(2, *policy.latent_shape)
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        policy(latents, torch.full((2,), 0.5), rows)
    real = float(counter.get_total_flops())
    pipeline = read_pipeline_folder(folder)
    tokens = text_tokens(pipeline, LENGTH, 0)
    assert tokens == policy.prompts.embeddings(rows[:, 0]).embeds.shape[1]  # UMT5 padded to max_sequence_length
    counted = count_forward_flops(pipeline, RESOLUTION, tokens, batch=2, lora=(4, config.target_modules),
                                  num_frames=FRAMES)
    assert counted.image_tokens == 3 * 8 * 12  # latent frames x (h / 2) x (w / 2)
    assert counted.flops == pytest.approx(real, rel=0.05)
    assert counted.lora_parameters == sum(p.numel() for name, p in policy.transformer.named_parameters()
                                          if ".lora_" in name) > 0


def test_the_shipped_wan21_14b_configs_count_its_14b_transformer() -> None:
    folder = read_pipeline_folder(model_folder("wan2.1-t2v-14b"))
    assert folder.family == "wan" and folder.latent_shape((480, 832), 33) == (16, 9, 60, 104)
    count = count_forward_flops(folder, (480, 832), 226, num_frames=33)
    assert count.parameters == pytest.approx(14.29e9, rel=0.01)  # Wan2.1's "14B"
    n, d, layers = 9 * 30 * 52, 5120, 40
    assert count.image_tokens == n
    # linear layers: 2 FLOPs per parameter per video token, less the weights that see the 226 text tokens only
    # (each block's cross-attention keys and values, the text embedder); self-attention 4 n^2 d per block
    text_only = 2 * layers * d * d + 4096 * d + d * d
    assert count.flops == pytest.approx(2 * (count.parameters - text_only) * n + 4 * layers * n * n * d, rel=0.02)


def test_spotlight_plan_prices_wan21_14b_from_its_configs() -> None:
    result = CliRunner().invoke(app, [
        "plan", "24", "--json", "-s", "model.pretrained=wan2.1-t2v-14b", "-s", "rollout.resolution=[480,832]",
        "-s", "rollout.num_frames=33", "-s", "model.gradient_checkpointing=true", "-s", "rollout.group_size=8",
        "-s", "rollout.prompts_per_iteration=1", "-s", "rollout.guidance_scale=5.0",
        "-s", "model.max_sequence_length=226"])
    assert result.exit_code == 0, result.output
    start = result.output.index("{")
    plan = json.loads(result.output[start:])
    text = json.dumps(plan)
    assert "14040" in text and '"wan"' in text, text[:2000]


def test_the_wan_recipe_loads_with_a_placeholder_folder() -> None:
    config = load_config(TrainConfig, Path(__file__).resolve().parents[3] / "configs" / "wan21-t2v-1.3b-lora.yaml")
    assert config.model.pretrained.startswith("/path/to/")
    assert config.rollout.resolution_hw == (480, 832) and config.rollout.num_frames == 33
    assert config.reward.frames == "min" and set(config.reward.weights) == {"pickscore", "temporal"}
