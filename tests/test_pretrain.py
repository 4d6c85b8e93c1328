"""Pre-training: the flow-matching loss, its data, and the reproducibility promise of the shipped base model."""

from __future__ import annotations

import torch

from spotlight.components.checkpoint import load_model
from spotlight.config import ConfigError, PretrainConfig, parse_config
from spotlight.loop.pretrain import ema_decay_at, flow_matching_loss, pretrain


def tiny(tmp_path, steps: int, eval_every: int = 100) -> PretrainConfig:
    return parse_config(PretrainConfig, {
        "steps": steps, "batch_size": 4, "warmup_steps": 1, "num_threads": 1, "eval_every": eval_every,
        "out_dir": str(tmp_path / f"pre-{steps}"), "storage_dtype": "float32",
        "model": {"dim": 32, "depth": 1, "num_heads": 2},
        "eval": {"seeds_per_prompt": 1, "num_steps": 1},
    })


def test_the_model_at_step_k_equals_the_final_model_of_a_run_of_k_steps(tmp_path):
    """Constant LR after warm-up and an EMA keyed by step: a checkpoint is reproducible by its config."""

    pretrain(tiny(tmp_path, 2))
    pretrain(tiny(tmp_path, 3, eval_every=2))
    two = load_model(tmp_path / "pre-2" / "final").state_dict()
    step_two_of_three = load_model(tmp_path / "pre-3" / "step-000002").state_dict()
    three = load_model(tmp_path / "pre-3" / "final").state_dict()
    assert all(torch.equal(two[k], step_two_of_three[k]) for k in two)
    assert any(not torch.equal(two[k], three[k]) for k in two)


def test_the_flow_matching_loss_is_zero_for_the_true_velocity():
    images = torch.rand(3, 3, 8, 8) * 2 - 1
    sigma = torch.tensor([0.2, 0.5, 0.9])
    generator = torch.Generator().manual_seed(0)
    noise = torch.randn(images.shape, generator=torch.Generator().manual_seed(0))

    class Oracle(torch.nn.Module):
        def forward(self, x, s, tokens):  # x = (1-s) x0 + s n  =>  v = n - x0 = (x - x0) / s
            return (x - images) / s[:, None, None, None]

    loss = flow_matching_loss(Oracle(), images, torch.zeros(3, 2, dtype=torch.long), sigma, generator)
    assert loss.item() < 1e-10
    assert torch.equal(noise, torch.randn(images.shape, generator=torch.Generator().manual_seed(0)))


def test_ema_warm_up_follows_the_step_then_caps_at_the_decay():
    assert ema_decay_at(0, 0.999) == 0.1
    assert ema_decay_at(90, 0.999) == 0.91
    assert ema_decay_at(100_000, 0.999) == 0.999


def test_a_later_stage_starts_from_the_init_checkpoint_weights(tmp_path):
    first = pretrain(tiny(tmp_path, 2))
    stage = tiny(tmp_path, 1).model_copy(update={"init_checkpoint": str(first), "learning_rate": 1e-12,
                                                  "out_dir": str(tmp_path / "stage-2")})
    second = pretrain(stage)
    before, after = load_model(first).state_dict(), load_model(second).state_dict()
    assert all(torch.allclose(before[k], after[k], atol=1e-6) for k in before)
    scratch = load_model(pretrain(tiny(tmp_path, 1))).state_dict()
    assert any(not torch.allclose(scratch[k], before[k], atol=1e-6) for k in before)  # not a fresh start


def test_a_later_stage_with_another_geometry_is_a_config_error(tmp_path):
    first = pretrain(tiny(tmp_path, 1))
    stage = tiny(tmp_path, 1)
    wider = stage.model.model_copy(update={"dim": 48})
    stage = stage.model_copy(update={"init_checkpoint": str(first), "model": wider})
    try:
        pretrain(stage)
    except ConfigError as error:
        assert "init_checkpoint" in str(error) and "model" in str(error)
    else:
        raise AssertionError("a geometry mismatch must be refused")
