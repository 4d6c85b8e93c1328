"""A tiny Wan2.1 text-to-video folder as a policy, against ``WanPipeline`` itself as the reference (issue 45).

A sample is a video: latents (C, f, h, w) of ``num_frames`` frames, decoded to (F, 3, H, W). Spotlight's
ODE rollout (its sampler, schedule and CFG) equals ``WanPipeline.__call__`` from the same initial
latents, its decode equals the pipeline's ``pt`` output, and a LoRA Spotlight exports loads with the
pipeline's own ``load_lora_weights`` and changes its video as it changes Spotlight's.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from spotlight.diffusion.noise import initial_latents
from spotlight.diffusion.sampler import SamplingPlan, sample
from spotlight.models.pipelines.family_config import DiffusersPolicyConfig
from spotlight.models.pipelines.folder import PipelineFolderError, read_pipeline_folder
from spotlight.models.pipelines.policy import PipelinePolicy
from spotlight.models.rebuild import policy_from_config
from spotlight.sim.planning.model_folders import model_folder

PROMPT = "a red ball rolls left"
NEGATIVE = "blurry"
STEPS = 2
FRAMES = 5  # 3 latent frames through the tiny VAE's temporal scale 2
LENGTH = 48


def wan_policy(folder: Path, guidance_scale: float = 1.0, **fields) -> PipelinePolicy:
    config = DiffusersPolicyConfig(family="wan", pretrained=str(folder), pipeline=True, resolution=(32, 32),
                                   num_frames=FRAMES, dtype="float32", guidance_scale=guidance_scale,
                                   negative_prompt=NEGATIVE, max_sequence_length=LENGTH, **fields)
    policy = policy_from_config(config)
    assert isinstance(policy, PipelinePolicy)
    return policy.eval()


@pytest.fixture(scope="module")
def pipe(tiny_pipeline):
    import diffusers

    loaded = diffusers.WanPipeline.from_pretrained(str(tiny_pipeline("wan")))
    loaded.set_progress_bar_config(disable=True)
    return loaded


def spotlight_ode(policy: PipelinePolicy, seed: int) -> torch.Tensor:
    schedule = policy.schedule()
    plan = SamplingPlan(num_steps=STEPS, shift=schedule.shift, sampler="ode", grid_end=schedule.grid_end,
                        shift_terminal=schedule.shift_terminal)
    tokens = policy.tokenize([PROMPT])
    return sample(lambda x, sigma: policy(x, sigma, tokens), [seed], plan, policy.latent_shape).final


def pipeline_call(pipe, latents: torch.Tensor, guidance_scale: float, output_type: str, **options) -> torch.Tensor:
    return pipe(PROMPT, negative_prompt=NEGATIVE, latents=latents, guidance_scale=guidance_scale, height=32, width=32,
                num_frames=FRAMES, num_inference_steps=STEPS, max_sequence_length=LENGTH,
                output_type=output_type, **options).frames


def test_a_wan_folder_reads_as_a_video_family(tiny_pipeline) -> None:
    folder = read_pipeline_folder(tiny_pipeline("wan"))
    assert folder.family == "wan" and folder.is_video
    assert folder.latent_shape((32, 32), FRAMES) == (4, 3, 16, 16)
    with pytest.raises(PipelineFolderError, match="num_frames - 1 divisible by 2"):
        folder.latent_shape((32, 32), 4)


@pytest.mark.parametrize("guidance_scale", [1.0, 4.0])
def test_an_ode_rollout_equals_wan_pipelines_own_call(guidance_scale: float, tiny_pipeline, pipe) -> None:
    policy = wan_policy(tiny_pipeline("wan"), guidance_scale)
    final = spotlight_ode(policy, seed=11)
    assert final.shape == (1, 4, 3, 16, 16)
    expected = pipeline_call(pipe, initial_latents([11], policy.latent_shape), guidance_scale, "latent")
    assert final.abs().max() > 0.5
    torch.testing.assert_close(final, expected, rtol=0, atol=1e-5)


def test_guidance_scale_2_is_refused_for_a_folder_of_one_transformer(tiny_pipeline, pipe) -> None:
    """WanPipeline refuses guidance_scale_2 without a second expert; the policy does too, before loading weights."""
    with pytest.raises(ValueError, match="guidance_scale_2"):
        pipeline_call(pipe, initial_latents([0], (16, 3, 4, 4)), 3.0, "latent", guidance_scale_2=1.5)
    with pytest.raises(PipelineFolderError, match="low-noise expert .* has one transformer"):
        wan_policy(tiny_pipeline("wan"), 3.0, guidance_scale_2=1.5)


def test_decoded_videos_equal_the_pipelines_pt_output(tiny_pipeline, pipe) -> None:
    policy = wan_policy(tiny_pipeline("wan"), 2.0)
    videos = policy.decode_images(spotlight_ode(policy, seed=5))
    expected = pipeline_call(pipe, initial_latents([5], policy.latent_shape), 2.0, "pt")
    assert videos.shape == (1, FRAMES, 3, 32, 32)
    torch.testing.assert_close(videos, expected, rtol=0, atol=1e-5)


def test_an_exported_lora_loads_into_wan_pipeline_and_changes_its_video(tiny_pipeline, tmp_path: Path) -> None:
    import diffusers

    policy = wan_policy(tiny_pipeline("wan"), lora_rank=2, lora_alpha=4.0)
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        for parameter in policy.trainable_parameters():
            parameter.normal_(0.0, 0.3)
    policy.save_for_diffusers(tmp_path)
    trained = spotlight_ode(policy, seed=3)
    base = diffusers.WanPipeline.from_pretrained(str(tiny_pipeline("wan")))
    base.set_progress_bar_config(disable=True)
    latents = initial_latents([3], policy.latent_shape)
    before = pipeline_call(base, latents, 1.0, "latent")
    base.load_lora_weights(str(tmp_path))
    after = pipeline_call(base, latents, 1.0, "latent")
    assert (after - before).abs().max() > 1e-2  # the LoRA reached the pipeline's transformer
    torch.testing.assert_close(after, trained, rtol=0, atol=1e-4)  # ... at the trained scale alpha / rank


def test_make_tiny_pipeline_wan_writes_a_folder_wan_pipeline_loads(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from spotlight.cli import app

    result = CliRunner().invoke(app, ["make-tiny-pipeline", "wan", str(tmp_path / "wan")])
    assert result.exit_code == 0, result.output
    folder = read_pipeline_folder(tmp_path / "wan")
    assert folder.family == "wan" and folder.vae["scale_factor_spatial"] == 2 == folder.vae["scale_factor_temporal"]


def test_the_memory_estimate_counts_every_latent_frames_tokens(tiny_pipeline) -> None:
    from spotlight.config import TrainConfig, parse_config
    from spotlight.models.pipelines.memory_estimate import run_memory_estimate

    def estimate(frames: int) -> float:
        config = parse_config(TrainConfig, {"model": {"pretrained": str(tiny_pipeline("wan"))},
                                            "rollout": {"resolution": 32, "num_frames": frames}})
        result = run_memory_estimate(config)
        assert result is not None
        return result.total

    assert estimate(9) > estimate(5) > estimate(1)  # 5, 3 and 1 latent frames of 16 x 16


def test_a_wan22_folder_without_its_second_experts_config_is_refused_in_one_line(tmp_path: Path) -> None:
    """Two-expert folders are read (tests/models/test_wan22_experts.py); one listing a transformer_2 it lacks is not."""
    import json
    import shutil

    source = read_pipeline_folder(model_folder("wan2.1-t2v-14b")).path
    shutil.copytree(source, tmp_path / "wan22")
    index = json.loads((tmp_path / "wan22" / "model_index.json").read_text())
    index.update(transformer_2=["diffusers", "WanTransformer3DModel"], boundary_ratio=0.875)
    (tmp_path / "wan22" / "model_index.json").write_text(json.dumps(index))
    with pytest.raises(PipelineFolderError, match="has no transformer_2/config.json .*: pass a complete diffusers"):
        read_pipeline_folder(tmp_path / "wan22")
