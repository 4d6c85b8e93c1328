"""Wan2.2 A14B's two experts (issue 45): a tiny two-expert ``WanPipeline`` folder against the pipeline itself.

The tiny ``wan22`` folder (`spotlight make-tiny-pipeline wan22`) holds Wan2.1's tiny parts, a second random
transformer (``transformer_2``) and A14B's ``boundary_ratio`` 0.875. Four steps of its schedule are timesteps
1000, 858, 602 and 9: the first is the high-noise expert's, the rest the low-noise one's, so an ODE rollout
equals ``WanPipeline.__call__`` only when the policy switches experts where the pipeline does, and with
``guidance_scale_2`` only when it guides each expert's steps at the pipeline's scale. A spot device's policy,
built around the broadcast LoRA of both experts, denoises as the trainer's. A LoRA
Spotlight exports for both experts loads with the pipeline's own ``load_lora_weights``; the memory estimate
and ``spotlight plan`` hold both experts.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from spotlight.cli import app
from spotlight.diffusion.noise import initial_latents
from spotlight.diffusion.sampler import SamplingPlan, sample
from spotlight.models.pipelines.family_config import DiffusersPolicyConfig
from spotlight.models.pipelines.folder import PipelineFolderError, read_pipeline_folder
from spotlight.models.rebuild import policy_from_config
from spotlight.models.video.experts import high_noise_rows
from spotlight.models.video.two_experts_policy import LOW_NOISE_LORA_FILE, TwoExpertsPolicy

PROMPT = "a red ball rolls left"
NEGATIVE = "blurry"
STEPS = 4
FRAMES = 5
LENGTH = 48
GUIDANCE = 3.0


def config_of(folder: Path, guidance_scale: float = 1.0, **fields) -> DiffusersPolicyConfig:
    return DiffusersPolicyConfig(family="wan", pretrained=str(folder), pipeline=True, resolution=(32, 32),
                                 num_frames=FRAMES, dtype="float32", guidance_scale=guidance_scale,
                                 negative_prompt=NEGATIVE, max_sequence_length=LENGTH, **fields)


def experts_policy(folder: Path, guidance_scale: float = 1.0, **fields) -> TwoExpertsPolicy:
    policy = policy_from_config(config_of(folder, guidance_scale, **fields))
    assert isinstance(policy, TwoExpertsPolicy)
    return policy.eval()


def plan_of(policy: TwoExpertsPolicy) -> SamplingPlan:
    schedule = policy.schedule()
    return SamplingPlan(num_steps=STEPS, shift=schedule.shift, sampler="ode", grid_end=schedule.grid_end,
                        shift_terminal=schedule.shift_terminal)


def spotlight_ode(policy: TwoExpertsPolicy, seed: int) -> torch.Tensor:
    tokens = policy.tokenize([PROMPT])
    return sample(lambda x, sigma: policy(x, sigma, tokens), [seed], plan_of(policy), policy.latent_shape).final


def pipeline_call(pipe, latents: torch.Tensor, guidance_scale: float,
                  guidance_scale_2: float | None = None) -> torch.Tensor:
    return pipe(PROMPT, negative_prompt=NEGATIVE, latents=latents, guidance_scale=guidance_scale,
                guidance_scale_2=guidance_scale_2, height=32, width=32, num_frames=FRAMES, num_inference_steps=STEPS,
                max_sequence_length=LENGTH, output_type="latent").frames


@pytest.fixture(scope="module")
def folder(tiny_pipeline) -> Path:
    return tiny_pipeline("wan22")


@pytest.fixture(scope="module")
def pipe(folder: Path):
    import diffusers

    loaded = diffusers.WanPipeline.from_pretrained(str(folder))
    loaded.set_progress_bar_config(disable=True)
    assert loaded.transformer_2 is not None and loaded.config.boundary_ratio == 0.875
    return loaded


@pytest.fixture(scope="module")
def one_scale_video(folder: Path, pipe) -> torch.Tensor:
    """WanPipeline's latents of seed 11 at guidance_scale 3, guidance_scale_2 unset (3 for both experts)."""
    return pipeline_call(pipe, initial_latents([11], experts_policy(folder).latent_shape), GUIDANCE)


def test_a_wan22_folder_reads_its_two_experts(folder: Path, tiny_pipeline) -> None:
    pipeline = read_pipeline_folder(folder)
    assert pipeline.experts == ("transformer", "transformer_2") and pipeline.boundary_ratio == 0.875
    single = read_pipeline_folder(tiny_pipeline("wan"))
    assert single.experts == ("transformer",) and single.boundary_ratio is None


def test_an_ode_rollout_equals_wan_pipelines_two_expert_call(folder: Path, one_scale_video: torch.Tensor) -> None:
    policy = experts_policy(folder, GUIDANCE)  # WanPipeline's guidance_scale_2 left unset: one scale for both
    sigmas = plan_of(policy).sigmas()[:-1].float()
    assert high_noise_rows(sigmas, 0.875).tolist() == [True, False, False, False]  # both experts denoise
    expected = one_scale_video
    final = spotlight_ode(policy, seed=11)
    assert final.abs().max() > 0.5
    torch.testing.assert_close(final, expected, rtol=0, atol=1e-5)
    # the same rollout with the switch elsewhere (step 3's timestep 602 to the high-noise expert) is far off
    policy.experts.boundary_ratio = 0.5
    assert (spotlight_ode(policy, seed=11) - expected).abs().max() > 1e-2


def test_guidance_scale_2_guides_the_low_noise_experts_steps_as_wan_pipeline_does(folder: Path, pipe,
                                                                                 one_scale_video: torch.Tensor
                                                                                 ) -> None:
    """Step 0 (the high-noise expert's) at guidance_scale, steps 1-3 at guidance_scale_2: WanPipeline's rollout."""
    policy = experts_policy(folder, GUIDANCE, guidance_scale_2=1.5)
    expected = pipeline_call(pipe, initial_latents([11], policy.latent_shape), GUIDANCE, guidance_scale_2=1.5)
    final = spotlight_ode(policy, seed=11)
    torch.testing.assert_close(final, expected, rtol=0, atol=1e-5)
    assert (final - one_scale_video).abs().max() > 1e-2  # not the rollout at one scale
    # each guided row's scale is its expert's, picked on the device (a batch may straddle the boundary)
    assert policy.guidance_scale_at(torch.tensor([0.95, 0.875, 0.3])).tolist() == [GUIDANCE, GUIDANCE, 1.5]


def test_flow_grpo_scores_each_guided_step_at_the_scale_it_was_sampled_at(folder: Path) -> None:
    """The update's log-prob of an SDE step (step 0: the high-noise expert's, steps 1-2: the low-noise one's) is
    the one the sampler recorded; scored at one scale for both experts, a low-noise step's would not be."""
    from spotlight.rl.grpo import RolloutBatch, step_log_prob_and_mean

    policy = experts_policy(folder, GUIDANCE, guidance_scale_2=1.5)
    schedule = policy.schedule()
    plan = SamplingPlan(num_steps=3, shift=schedule.shift, sampler="sde", grid_end=schedule.grid_end,
                        shift_terminal=schedule.shift_terminal)  # timesteps 1000 | 751, 9
    tokens = policy.tokenize([PROMPT])
    trajectory = sample(lambda x, sigma: policy(x, sigma, tokens), [5], plan, policy.latent_shape)
    batch = RolloutBatch(latents=trajectory.latents, log_probs=trajectory.log_probs, tokens=tokens,
                         advantages=torch.zeros(1), sigmas=plan.sigmas(), noise_level=plan.noise_level)
    rows = torch.arange(1)
    with torch.no_grad():
        scored = [step_log_prob_and_mean(policy, batch, rows, step)[0] for step in range(3)]
        torch.testing.assert_close(torch.stack(scored, dim=1), trajectory.log_probs, rtol=0, atol=1e-6)
        policy.config = policy.config.model_copy(update={"guidance_scale_2": None})  # one scale for both
        one_scale = step_log_prob_and_mean(policy, batch, rows, 1)[0]
    # a log-prob is a mean over every latent cell, and a random tiny model's guidance moves it little (4e-4 here)
    assert (one_scale - trajectory.log_probs[:, 1]).abs().max() > 1e-4


@pytest.mark.parametrize(("folder_kind", "guidance", "match"), [
    ("wan", {"guidance_scale": 3.0, "guidance_scale_2": 1.5}, "error: rollout.guidance_scale_2 guides the "
                                                               "low-noise expert of a two-expert Wan2.2 folder"),
    ("wan22", {"guidance_scale_2": 4.0}, "error: rollout.guidance_scale_2 4.0 would be ignored: WanPipeline guides "
                                        "only when guidance_scale > 1"),
    (None, {"guidance_scale_2": 4.0}, "error: rollout.guidance_scale_2 applies to a pipeline folder"),
])
def test_guidance_scale_2_that_nothing_would_use_is_refused_in_one_line(folder_kind: str | None, guidance: dict,
                                                                         match: str, folder: Path,
                                                                         tmp_path: Path) -> None:
    one_expert = tmp_path / "wan21"  # the folder without its second expert (weights linked, not copied)
    shutil.copytree(folder, one_expert, ignore=shutil.ignore_patterns("transformer_2", "model_index.json"),
                    copy_function=os.symlink)
    index = json.loads((folder / "model_index.json").read_text())
    del index["transformer_2"], index["boundary_ratio"]
    (one_expert / "model_index.json").write_text(json.dumps(index))
    model = ["model.family=sd3"] if folder_kind is None else [
        f"model.pretrained={one_expert if folder_kind == 'wan' else folder}", "rollout.resolution=32",
        f"rollout.num_frames={FRAMES}"]
    settings = [*model, *(f"rollout.{key}={value}" for key, value in guidance.items()), "mode=vanilla",
                f"run_dir={tmp_path / 'run'}"]
    result = CliRunner().invoke(app, ["train", *(arg for setting in settings for arg in ("-s", setting))])
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1 and lines[0].startswith(match), result.output


def test_a_batch_straddling_the_boundary_runs_each_row_on_its_expert(folder: Path) -> None:
    """NFT draws a noise level per row: a batch mixes the experts, each row as if it were alone."""
    policy = experts_policy(folder, 2.0)
    tokens = policy.tokenize([PROMPT, "a blue cube"])
    latents = torch.randn(2, *policy.latent_shape, generator=torch.Generator().manual_seed(0))
    sigma = torch.tensor([0.95, 0.3])
    with torch.no_grad():
        together = policy(latents, sigma, tokens)
        alone = torch.cat([policy(latents[i:i + 1], sigma[i:i + 1], tokens[i:i + 1]) for i in range(2)])
        policy.experts.boundary_ratio = 0.2  # row 1 to the high-noise expert: another velocity
        moved = policy(latents, sigma, tokens)
    torch.testing.assert_close(together, alone, rtol=0, atol=1e-5)
    torch.testing.assert_close(moved[0], together[0], rtol=0, atol=1e-5)
    assert (moved[1] - together[1]).abs().max() > 1e-2


def test_a_spot_device_policy_on_the_broadcast_weights_denoises_as_the_trainers(folder: Path) -> None:
    """What a spot device builds from a broadcast (`policy_on_weights`): the two-expert policy of the description,
    both experts' LoRA the broadcast tensors, each row on its expert at its expert's guidance scale."""
    from spotlight.models.spec import policy_on_weights

    policy = experts_policy(folder, GUIDANCE, guidance_scale_2=1.5, lora_rank=2, lora_alpha=4.0)
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        for parameter in policy.trainable_parameters():
            parameter.normal_(0.0, 0.3)
    weights = policy.broadcast_state()
    assert {name.split(".")[1] for name in weights} == {"0", "1"}  # experts.0 (high noise), experts.1 (low)
    spot = policy_on_weights(policy.describe(), weights, copy=False, cache={})
    assert isinstance(spot, TwoExpertsPolicy) and spot.config.guidance_scale_2 == 1.5
    latents = torch.randn(2, *policy.latent_shape, generator=torch.Generator().manual_seed(1))
    sigma = torch.tensor([0.95, 0.3])  # one row for each expert
    with torch.no_grad():
        expected = policy(latents, sigma, policy.tokenize([PROMPT, PROMPT]))
        torch.testing.assert_close(spot(latents, sigma, spot.tokenize([PROMPT, PROMPT])), expected, rtol=0, atol=1e-5)
        for name, tensor in weights.items():  # the high-noise expert's LoRA zeroed in place: the spot policy's own
            if name.startswith("experts.0.") and "lora_B" in name:
                tensor.zero_()
        moved = spot(latents, sigma, spot.tokenize([PROMPT, PROMPT]))
    assert (moved[0] - expected[0]).abs().max() > 1e-3  # the high-noise row ran the high-noise expert's LoRA ...
    torch.testing.assert_close(moved[1], expected[1], rtol=0, atol=1e-5)  # ... and the low-noise row did not


def test_the_exported_lora_of_both_experts_loads_into_wan_pipeline(folder: Path, tmp_path: Path) -> None:
    import diffusers

    policy = experts_policy(folder, lora_rank=2, lora_alpha=4.0)
    names = policy.lora_state_dict().keys()
    assert any(n.startswith("experts.0.") for n in names) and any(n.startswith("experts.1.") for n in names)
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        for parameter in policy.trainable_parameters():
            parameter.normal_(0.0, 0.3)
    policy.save_for_diffusers(tmp_path)
    trained = spotlight_ode(policy, seed=3)
    base = diffusers.WanPipeline.from_pretrained(str(folder))
    base.set_progress_bar_config(disable=True)
    latents = initial_latents([3], policy.latent_shape)
    before = pipeline_call(base, latents, 1.0)
    base.load_lora_weights(str(tmp_path))
    high_only = pipeline_call(base, latents, 1.0)
    base.load_lora_weights(str(tmp_path), weight_name=LOW_NOISE_LORA_FILE, load_into_transformer_2=True)
    after = pipeline_call(base, latents, 1.0)
    assert (high_only - before).abs().max() > 1e-2 and (after - high_only).abs().max() > 1e-2  # each file counts
    torch.testing.assert_close(after, trained, rtol=0, atol=1e-4)


def test_make_tiny_pipeline_wan22_writes_a_two_expert_folder(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["make-tiny-pipeline", "wan22", str(tmp_path / "wan22")])
    assert result.exit_code == 0, result.output
    assert read_pipeline_folder(tmp_path / "wan22").experts == ("transformer", "transformer_2")


@pytest.mark.parametrize(("change", "match"), [
    ({"boundary_ratio": None}, "transformer_2 without boundary_ratio"),
    ({"boundary_ratio": 1.5}, "boundary_ratio 1.5: write a number in \\(0, 1\\)"),
    ({"transformer_2": [None, None]}, "boundary_ratio without transformer_2"),
    ({"expand_timesteps": True}, "TI2V pipeline \\(expand_timesteps\\)"),
])
def test_a_malformed_two_expert_folder_is_refused_in_one_line(change: dict, match: str, folder: Path,
                                                             tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy, ignore=shutil.ignore_patterns("*.safetensors"))
    index = json.loads((copy / "model_index.json").read_text())
    index.update(change)
    (copy / "model_index.json").write_text(json.dumps(index))
    with pytest.raises(PipelineFolderError, match=match):
        read_pipeline_folder(copy)


def test_experts_of_two_architectures_are_refused(folder: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy, ignore=shutil.ignore_patterns("*.safetensors"))
    config = json.loads((copy / "transformer_2" / "config.json").read_text())
    (copy / "transformer_2" / "config.json").write_text(json.dumps({**config, "num_layers": 3}))
    with pytest.raises(PipelineFolderError, match="transformer_2/config.json differs"):
        read_pipeline_folder(copy)


def test_the_memory_estimate_and_plan_hold_both_experts(folder: Path, tiny_pipeline) -> None:
    from spotlight.models.pipelines.memory_estimate import model_sizes

    one, two = (model_sizes(path, ("attn1.to_q",), 2) for path in (tiny_pipeline("wan"), folder))
    assert (two.transformer, two.lora, two.lora_weights) == (2 * one.transformer, 2 * one.lora, 2 * one.lora_weights)
    assert (two.blocks, two.hidden, two.lora_inputs) == (one.blocks, one.hidden, one.lora_inputs)  # one runs

    def workload(path: Path) -> dict:
        result = CliRunner().invoke(app, ["plan", "1", "--json", "-s", f"model.pretrained={path}",
                                          "-s", "rollout.resolution=[32,32]", "-s", f"rollout.num_frames={FRAMES}",
                                          "-s", "convergence.vanilla_iterations=20"])  # short sims: workload read
        assert result.exit_code == 0, result.output
        return json.loads(result.output[result.output.index("{"):])["workload"]

    single, double = workload(tiny_pipeline("wan")), workload(folder)
    assert double["parameters"] == 2 * single["parameters"] > 0
    assert double["trainable_parameters"] == 2 * single["trainable_parameters"] > 0
    assert double["tflop_per_forward"] == single["tflop_per_forward"]  # a forward runs one expert


def test_a_fully_fine_tuned_policy_exports_both_experts_as_transformer_folders(folder: Path, tmp_path: Path) -> None:
    from diffusers import WanTransformer3DModel

    policy = experts_policy(folder, finetune="full")
    high, low = policy.experts.experts
    with torch.no_grad():
        low.proj_out.bias.add_(1.0)  # a change to the low-noise expert only
    policy.save_for_diffusers(tmp_path)
    saved = {part: WanTransformer3DModel.from_pretrained(str(tmp_path / part)) for part in ("transformer",
                                                                                             "transformer_2")}
    assert torch.equal(saved["transformer"].proj_out.bias, high.proj_out.bias)
    assert torch.equal(saved["transformer_2"].proj_out.bias, low.proj_out.bias)
    assert not torch.equal(saved["transformer"].proj_out.bias, saved["transformer_2"].proj_out.bias)
