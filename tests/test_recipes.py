"""The GPU recipes the README points at (configs/*-lora.yaml, for real pipeline folders) load with the real loader.

Every field must exist (the config sections forbid unknown keys, so a typo fails here, not on a user's GPU),
the settings the README promises must be the ones shipped, and the placeholder pipeline folder must stop a run
with one line that names the field and the fix.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from spotlight.config import TrainConfig, load_config
from spotlight.models.pipelines.folder import PipelineFolderError, read_pipeline_folder
from spotlight.schema import ConfigError

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
RECIPES = ("sd35m-ocr-lora", "flux-dev-geneval-lora", "qwen-image-ocr-lora", "flux-kontext-edit-lora",
           "qwen-image-edit-lora")


@pytest.mark.parametrize("name", RECIPES)
def test_recipe_loads_with_every_field_known(name: str) -> None:
    config = load_config(TrainConfig, CONFIGS / f"{name}.yaml")
    assert config.device == "cuda" and config.dtype == "bfloat16" and config.model.finetune == "lora"
    assert config.model.pretrained.startswith("/path/to/"), "model.pretrained must be a placeholder the user overrides"
    assert config.rollout.resolution_hw == (512, 512)


def test_a_misspelt_field_fails_the_loader(tmp_path: Path) -> None:
    """The check above can fail: an unknown key is refused, naming it."""
    text = (CONFIGS / "qwen-image-ocr-lora.yaml").read_text().replace("lora_rank: 64", "lora_rnak: 64")
    (tmp_path / "typo.yaml").write_text(text)
    with pytest.raises(ConfigError, match="lora_rnak"):
        load_config(TrainConfig, tmp_path / "typo.yaml")


def test_qwen_image_recipe_is_verl_omnis_setting() -> None:
    """Issue 32: 512², 10 steps, true CFG 4, group 16, LoRA rank 64, OCR reward."""
    config = load_config(TrainConfig, CONFIGS / "qwen-image-ocr-lora.yaml")
    assert (config.rollout.num_steps, config.rollout.guidance_scale, config.rollout.group_size) == (10, 4.0, 16)
    assert config.model.lora_rank == 64 and config.reward.name == "ocr" and config.data.dataset == "ocr"


def test_recipe_rewards_and_prompts() -> None:
    sd35 = load_config(TrainConfig, CONFIGS / "sd35m-ocr-lora.yaml")
    flux = load_config(TrainConfig, CONFIGS / "flux-dev-geneval-lora.yaml")
    assert (sd35.reward.name, sd35.data.dataset, sd35.rollout.guidance_scale) == ("ocr", "ocr", 4.5)
    assert (flux.reward.name, flux.data.dataset) == ("geneval", "geneval")
    assert flux.reward.models.detector and flux.reward.models.colour_clip


@pytest.mark.parametrize("name", RECIPES)
def test_the_placeholder_folder_is_one_line_naming_the_field(name: str) -> None:
    config = load_config(TrainConfig, CONFIGS / f"{name}.yaml")
    with pytest.raises(PipelineFolderError) as raised:
        read_pipeline_folder(config.model.pretrained)
    message = str(raised.value)
    assert "\n" not in message and message.startswith(f"model.pretrained {config.model.pretrained} is not a folder")


def test_kontext_recipe_trains_edits_of_the_shipped_edit_set() -> None:
    """Issue 45: FLUX.1 Kontext on rows of instruction + source image, rewarded by the edit reward."""
    config = load_config(TrainConfig, CONFIGS / "flux-kontext-edit-lora.yaml")
    assert (config.reward.name, config.data.dataset, config.rollout.guidance_scale) == ("edit", "shapes-edit", 2.5)
    assert config.reward.models.clip and config.model.pretrained.endswith("FLUX.1-Kontext-dev")
