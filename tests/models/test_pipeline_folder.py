"""Reading a pipeline folder: its family, latent geometry and sigma schedule, and the one-line refusals."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from spotlight.diffusion.sampler import SamplingPlan
from spotlight.models.pipelines.folder import PipelineFolderError, read_pipeline_folder

FAMILIES = ("sd3", "flux", "qwen-image")


@pytest.mark.parametrize("family", FAMILIES)
def test_the_family_and_latent_geometry_come_from_the_folder(family: str, tiny_pipeline) -> None:
    folder = read_pipeline_folder(tiny_pipeline(family))
    assert folder.family == family
    assert folder.vae_scale_factor == 2  # two VAE levels (Qwen-Image: one temporal-downsample flag)
    assert folder.latent_channels == 4
    assert folder.latent_size((32, 48)) == (16, 24)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("num_steps", [1, 3, 10])
def test_the_schedule_equals_the_one_the_family_pipeline_sets(family: str, num_steps: int, tiny_pipeline) -> None:
    """The pipeline's own calls (sigmas = linspace(1, 1/N, N) and mu for FLUX / Qwen-Image; the
    scheduler's default grid for SD3) through diffusers' scheduler are the independent reference."""
    import numpy as np
    from diffusers import FlowMatchEulerDiscreteScheduler
    from diffusers.pipelines.flux.pipeline_flux import calculate_shift

    path = tiny_pipeline(family)
    folder = read_pipeline_folder(path)
    scheduler = FlowMatchEulerDiscreteScheduler.from_pretrained(str(path / "scheduler"))
    latent = folder.latent_size((32, 32))
    if family == "sd3":
        scheduler.set_timesteps(num_steps)
    else:
        tokens = (latent[0] // 2) * (latent[1] // 2)
        config = scheduler.config
        mu = calculate_shift(tokens, config.base_image_seq_len, config.max_image_seq_len, config.base_shift,
                             config.max_shift)
        scheduler.set_timesteps(num_steps, sigmas=np.linspace(1.0, 1 / num_steps, num_steps), mu=mu)
    schedule = folder.schedule(latent)
    plan = SamplingPlan(num_steps=num_steps, shift=schedule.shift, grid_end=schedule.grid_end,
                        shift_terminal=schedule.shift_terminal)
    torch.testing.assert_close(plan.sigmas().float(), scheduler.sigmas, rtol=0, atol=1e-6)


def test_shift_terminal_stretches_the_last_sigma_to_it(tiny_pipeline, tmp_path: Path) -> None:
    from diffusers import FlowMatchEulerDiscreteScheduler

    path = tmp_path / "qwen"
    shutil.copytree(tiny_pipeline("qwen-image"), path)
    config_file = path / "scheduler" / "scheduler_config.json"
    config = json.loads(config_file.read_text()) | {"shift_terminal": 0.02}
    config_file.write_text(json.dumps(config))
    scheduler = FlowMatchEulerDiscreteScheduler.from_pretrained(str(path / "scheduler"))
    schedule = read_pipeline_folder(path).schedule((16, 16))
    scheduler.set_timesteps(4, sigmas=[1.0, 0.75, 0.5, 0.25], mu=__import__("math").log(schedule.shift))
    plan = SamplingPlan(num_steps=4, shift=schedule.shift, shift_terminal=schedule.shift_terminal)
    torch.testing.assert_close(plan.sigmas().float(), scheduler.sigmas, rtol=0, atol=1e-6)
    assert float(plan.sigmas()[-2]) == pytest.approx(0.02)


def test_a_folder_without_model_index_is_refused_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "transformer").mkdir()
    with pytest.raises(PipelineFolderError, match="no model_index.json") as error:
        read_pipeline_folder(tmp_path)
    assert "\n" not in str(error.value)


def test_a_missing_folder_is_refused_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(PipelineFolderError, match="is not a folder"):
        read_pipeline_folder(tmp_path / "gone")


def test_an_unsupported_family_is_refused_naming_the_supported_ones(tmp_path: Path) -> None:
    (tmp_path / "model_index.json").write_text(json.dumps({"_class_name": "StableDiffusionXLPipeline"}))
    with pytest.raises(PipelineFolderError, match="StableDiffusionXLPipeline.*FluxPipeline") as error:
        read_pipeline_folder(tmp_path)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(("family", "resolution", "needed"), [("flux", (30, 32), "divisible by 4"),
                                                              ("sd3", (4096, 4096), "at most 128")])
def test_a_resolution_the_model_cannot_take_is_one_line(family: str, resolution: tuple[int, int], needed: str,
                                                        tiny_pipeline) -> None:
    with pytest.raises(PipelineFolderError, match=needed):
        read_pipeline_folder(tiny_pipeline(family)).latent_size(resolution)
