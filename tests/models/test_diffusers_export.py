"""A diffusers policy's checkpoints load into the family's own pipeline and reproduce the policy exactly."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from spotlight.components.checkpoint import checkpoint_problem, replace_model, save_training_checkpoint
from spotlight.components.manifest import MANIFEST_FILE
from spotlight.models.pipelines.adapter import DiffusersPolicy
from spotlight.models.pipelines.export import DIFFUSERS_LORA_FILE, save_transformer_folder
from spotlight.models.pipelines.family_config import DiffusersPolicyConfig
from spotlight.models.pipelines.inputs import PromptEmbeddings, transformer_velocity
from spotlight.models.pipelines.tiny import FAMILIES, save_tiny_pipeline

LATENT = 16  # the tiny pipelines' 32-pixel images


@pytest.fixture(scope="session")
def pipeline_folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One tiny pipeline folder per family, built once per test session (a few seconds each)."""
    root = tmp_path_factory.mktemp("pipelines")
    return {family: save_tiny_pipeline(family, root / family) for family in FAMILIES}


def trained_policy(folder: Path, family: str) -> DiffusersPolicy:
    """A policy on the folder's transformer whose LoRA (rank 4, alpha 8: scale 2) is drawn at random, as if trained."""
    policy = DiffusersPolicy.from_config(DiffusersPolicyConfig(
        family=family, pretrained=str(folder), dtype="float32", lora_rank=4, lora_alpha=8.0, latent_size=LATENT))
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for parameter in policy.lora_parameters().values():
            parameter.copy_(0.1 * torch.randn(parameter.shape, generator=generator))
    return policy


def fixed_inputs(policy: DiffusersPolicy) -> tuple[torch.Tensor, torch.Tensor, PromptEmbeddings]:
    generator = torch.Generator().manual_seed(2)
    width, pooled = policy.prompt_dims
    frames = (3,) if policy.family == "wan" else ()  # a video transformer denoises (B, C, f, h, w)
    x = torch.randn(2, policy.channels, *frames, LATENT, LATENT, generator=generator)
    cond = PromptEmbeddings(torch.randn(2, 7, width, generator=generator),
                            None if pooled is None else torch.randn(2, pooled, generator=generator),
                            torch.ones(2, 7, dtype=torch.bool) if pooled is None else None)
    return x, torch.tensor([0.3, 0.8]), cond


@pytest.mark.parametrize("family", FAMILIES)
def test_every_lora_checkpoint_loads_into_the_pipeline_as_the_trained_policy(
        pipeline_folders: dict[str, Path], tmp_path: Path, family: str) -> None:
    from diffusers import DiffusionPipeline

    folder = pipeline_folders[family]
    policy = trained_policy(folder, family)
    optimizer = torch.optim.AdamW(policy.trainable_parameters())
    checkpoint = save_training_checkpoint(tmp_path / "run", 3, policy, optimizer, None, {})
    replace_model(tmp_path / "run" / "checkpoints" / "best", policy, {"iteration": 3})
    x, sigma, cond = fixed_inputs(policy)
    with torch.no_grad():
        expected = policy(x, sigma, cond)
        base = policy.reference()(x, sigma, cond)
    assert (expected - base).abs().max() > 1e-3  # the LoRA changes the output: the comparison can fail
    assert DIFFUSERS_LORA_FILE in (checkpoint / MANIFEST_FILE).read_text()
    for exported in (checkpoint, tmp_path / "run" / "checkpoints" / "best"):
        with safe_open(str(exported / DIFFUSERS_LORA_FILE), framework="pt") as handle:
            assert all(key.startswith("transformer.") for key in handle.keys())  # noqa: SIM118
        pipe = DiffusionPipeline.from_pretrained(str(folder))
        pipe.load_lora_weights(str(exported))
        with torch.no_grad():
            loaded = transformer_velocity(pipe.transformer, family, x, sigma, cond, policy.config.guidance_scale)
        torch.testing.assert_close(loaded, expected, rtol=0, atol=1e-6)  # alpha / rank scale included


def test_a_fully_fine_tuned_checkpoint_holds_a_transformer_folder_that_from_pretrained_loads(
        pipeline_folders: dict[str, Path], tmp_path: Path) -> None:
    from diffusers import DiffusionPipeline, SD3Transformer2DModel

    folder = pipeline_folders["sd3"]
    policy = DiffusersPolicy.from_config(DiffusersPolicyConfig(
        family="sd3", pretrained=str(folder), dtype="float32", finetune="full", latent_size=LATENT))
    with torch.no_grad():  # as if trained: every weight moved
        for parameter in policy.trainable_parameters():
            parameter.add_(0.01)
    checkpoint = save_training_checkpoint(tmp_path / "run", 1, policy, torch.optim.SGD(policy.trainable_parameters()),
                                          None, {})
    loaded = SD3Transformer2DModel.from_pretrained(str(checkpoint / "transformer"))
    pipe = DiffusionPipeline.from_pretrained(str(folder), transformer=loaded)
    x, sigma, cond = fixed_inputs(policy)
    with torch.no_grad():
        torch.testing.assert_close(transformer_velocity(pipe.transformer, "sd3", x, sigma, cond),
                                   policy(x, sigma, cond), rtol=0, atol=1e-6)
    save_transformer_folder(policy.transformer, checkpoint)  # a second export replaces the first whole
    assert not list(checkpoint.glob(".transformer-*"))
    assert checkpoint_problem(checkpoint) is None  # the manifest lists transformer/'s files
    weights = checkpoint / "transformer" / "diffusion_pytorch_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-10])
    assert "transformer/diffusion_pytorch_model.safetensors has" in checkpoint_problem(checkpoint)
