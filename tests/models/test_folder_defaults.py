"""A key a component's config leaves out means its class's default, as diffusers reads the folder."""

from __future__ import annotations

import inspect
import json
import math
import shutil
from pathlib import Path

import diffusers
import pytest

from spotlight.models.folder_defaults import CLASS_DEFAULTS
from spotlight.models.pipelines.folder import read_pipeline_folder


def _plain(value):
    return list(value) if isinstance(value, tuple) else value


@pytest.mark.parametrize("class_name", sorted(CLASS_DEFAULTS))
def test_the_defaults_are_the_installed_classes_own(class_name: str) -> None:
    parameters = inspect.signature(getattr(diffusers, class_name).__init__).parameters
    for key, value in CLASS_DEFAULTS[class_name].items():
        assert key in parameters, f"{class_name} takes no {key}"
        assert _plain(parameters[key].default) == value, f"{class_name}.{key}"


def test_a_dynamic_shift_without_max_shift_shifts_as_diffusers_pipeline_does(tiny_pipeline, tmp_path: Path) -> None:
    """SD3's pipeline asks the scheduler's config for max_shift (1.16 only if absent); the scheduler records
    its own default, 1.15, so that is the shift diffusers samples with."""
    folder = tmp_path / "sd3"
    shutil.copytree(tiny_pipeline("sd3"), folder)
    written = {"_class_name": "FlowMatchEulerDiscreteScheduler", "shift": 3.0, "use_dynamic_shifting": True}
    (folder / "scheduler" / "scheduler_config.json").write_text(json.dumps(written))
    config = diffusers.FlowMatchEulerDiscreteScheduler.from_config(written).config
    latent = (16, 16)
    tokens = (latent[0] // 2) * (latent[1] // 2)
    base, top = config.get("base_image_seq_len", 256), config.get("max_image_seq_len", 4096)
    low, high = config.get("base_shift", 0.5), config.get("max_shift", 1.16)  # StableDiffusion3Pipeline's calls
    slope = (high - low) / (top - base)
    expected = math.exp(tokens * slope + low - slope * base)
    assert read_pipeline_folder(folder).schedule(latent).shift == pytest.approx(expected, rel=1e-12)
