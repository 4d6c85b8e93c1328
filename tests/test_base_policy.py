"""build_policy: the run's starting policy from the config, a TinyDiT base checkpoint or a tiny diffusers family."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from spotlight.config import ConfigError, TrainConfig, load_config
from spotlight.loop.base_policy import build_policy
from spotlight.models.pipelines.adapter import DiffusersPolicy
from spotlight.models.policy import Policy
from spotlight.models.tinydit import TinyDiT
from spotlight.tasks.shapes import VOCAB

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


@pytest.mark.parametrize("family", ["sd3", "flux", "qwen-image"])
def test_each_lora_config_builds_a_policy_of_the_task_images_that_starts_as_its_base(family: str) -> None:
    config = load_config(TrainConfig, CONFIGS / f"{family}-tiny-lora.yaml")
    policy = build_policy(config)
    assert isinstance(policy, DiffusersPolicy) and isinstance(policy, Policy)
    assert policy.latent_shape == (3, 32, 32)  # the shapes task's RGB images, no VAE
    assert policy.config.vocab_size == len(VOCAB) and policy.config.task == "shapes"
    again = build_policy(config)  # the frozen reference of the loop: the same base, LoRA B at zero
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    tokens = torch.tensor([[1, 2, 3] + [0] * 9, [4] * 12])
    with torch.no_grad():
        velocity = policy(x, torch.tensor([0.9, 0.2]), tokens)
        assert torch.equal(velocity, again(x, torch.tensor([0.9, 0.2]), tokens))
        assert torch.equal(velocity, policy.reference()(x, torch.tensor([0.9, 0.2]), tokens))
    other_seed = build_policy(load_config(TrainConfig, CONFIGS / f"{family}-tiny-lora.yaml", ["model.init_seed=1"]))
    with torch.no_grad():
        assert not torch.equal(other_seed(x, torch.tensor([0.9, 0.2]), tokens), velocity)


def test_the_default_model_is_the_base_checkpoints_tinydit(tiny_base_model: Path) -> None:
    policy = build_policy(load_config(TrainConfig, None, [f"base_checkpoint={tiny_base_model}"]))
    assert isinstance(policy, TinyDiT)


def test_model_section_refuses_transformer_overrides_for_tinydit() -> None:
    with pytest.raises(ConfigError, match="model.transformer overrides a diffusers architecture"):
        load_config(TrainConfig, None, ["model.transformer={num_layers: 1}"])


def test_a_non_square_task_is_refused_for_a_diffusers_family() -> None:
    config = load_config(TrainConfig, CONFIGS / "sd3-tiny-lora.yaml", ["task=ocr"])
    with pytest.raises(ValueError, match="square images only"):
        build_policy(config)
