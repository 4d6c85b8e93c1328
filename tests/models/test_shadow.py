"""Frozen versions of a LoRA policy share its one base; each behaves exactly as a deep copy would."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from spotlight.config import TrainConfig, parse_config
from spotlight.loop.pretrain import update_ema
from spotlight.models.pipelines.adapter import DiffusersPolicy
from spotlight.models.policy_section import PolicySection
from spotlight.models.rebuild import policy_from_config
from spotlight.models.shadow import LoraShadow, frozen_base, frozen_copy
from spotlight.tasks.shapes import VOCAB
from spotlight.trainer import Trainer


def toy_policy(family: str = "flux") -> DiffusersPolicy:
    """The tiny LoRA policy of configs/flux-tiny-lora.yaml with its LoRA drawn at random (as if trained)."""
    section = PolicySection(family=family, lora_rank=4, lora_alpha=8.0)
    policy = policy_from_config(section.diffusers_config("shapes", len(VOCAB), (32, 32)))
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for parameter in policy.trainable_parameters():
            parameter.copy_(0.1 * torch.randn(parameter.shape, generator=generator))
    return policy


def inputs(policy: DiffusersPolicy) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(4)
    x = torch.randn(2, *policy.latent_shape, generator=generator)
    tokens = torch.randint(1, len(VOCAB), (2, policy.config.max_text_len), generator=generator)
    return x, torch.tensor([0.3, 0.8]), tokens


def sgd_step(policy: DiffusersPolicy) -> None:
    x, sigma, tokens = inputs(policy)
    optimizer = torch.optim.SGD(policy.trainable_parameters(), lr=0.5)
    policy(x, sigma, tokens).pow(2).mean().backward()
    optimizer.step()
    optimizer.zero_grad()


def base_pointers(model: object) -> set[int]:
    """data_ptr of every base (non-LoRA) weight a frozen version computes with."""
    policy = model.policy if isinstance(model, LoraShadow) else model
    return {p.data_ptr() for name, p in policy.named_parameters() if "lora_" not in name}


@pytest.mark.parametrize("family", ["sd3", "flux"])
def test_copies_share_the_base_and_compute_like_deep_copies_after_the_policy_trains(family: str) -> None:
    policy = toy_policy(family)
    shadow, deep = frozen_copy(policy), copy.deepcopy(policy).requires_grad_(False)
    reference = frozen_base(policy)
    assert base_pointers(shadow) == base_pointers(reference) == base_pointers(policy)
    assert not base_pointers(deep) & base_pointers(policy)  # what a deep copy costs: a second base
    assert sum(p.numel() for p in shadow.parameters()) == sum(p.numel() for p in policy.trainable_parameters())
    x, sigma, tokens = inputs(policy)
    sgd_step(policy)  # the policy moves on; the copies keep the weights they were taken with
    with torch.no_grad():
        assert torch.equal(shadow(x, sigma, tokens), deep(x, sigma, tokens))
        assert not torch.equal(policy(x, sigma, tokens), deep(x, sigma, tokens))
        assert torch.equal(reference(x, sigma, tokens), policy.reference()(x, sigma, tokens))
    assert all(p.requires_grad for p in policy.trainable_parameters())  # the policy still trains


def test_a_shadow_call_between_forward_and_backward_leaves_the_gradients_alone() -> None:
    policy, twin = toy_policy(), toy_policy()
    shadow = frozen_copy(policy)
    with torch.no_grad():  # a shadow of other weights than the policy's, so a leak would show
        for parameter in shadow.parameters():
            parameter.mul_(-1.0)
    x, sigma, tokens = inputs(policy)
    loss = policy(x, sigma, tokens).pow(2).mean()
    shadow(x, sigma, tokens)
    frozen_base(policy)(x, sigma, tokens)
    loss.backward()
    twin(x, sigma, tokens).pow(2).mean().backward()
    for mine, theirs in zip(policy.trainable_parameters(), twin.trainable_parameters(), strict=True):
        assert torch.equal(mine.grad, theirs.grad)


def test_ema_and_broadcast_state_step_the_shadow_as_they_step_a_deep_copy() -> None:
    policy = toy_policy()
    shadow, deep = frozen_copy(policy), copy.deepcopy(policy)  # (a frozen DiffusersPolicy has no trainable tensors)
    sgd_step(policy)
    update_ema(shadow, policy, 0.7)
    update_ema(deep, policy, 0.7)
    assert shadow.broadcast_state().keys() == deep.broadcast_state().keys()
    for name, tensor in deep.broadcast_state().items():
        assert torch.equal(shadow.broadcast_state()[name], tensor), name
    other = frozen_copy(policy)
    other.load_broadcast_state(deep.broadcast_state())
    x, sigma, tokens = inputs(policy)
    with torch.no_grad():
        assert torch.equal(other(x, sigma, tokens), deep(x, sigma, tokens))


def test_a_shadow_exports_its_own_weights_for_diffusers(tmp_path: Path) -> None:
    policy = toy_policy()
    shadow, deep = frozen_copy(policy), copy.deepcopy(policy)
    sgd_step(policy)
    shadow.save_for_diffusers(tmp_path / "shadow")
    deep.save_for_diffusers(tmp_path / "deep")
    ours = load_file(str(tmp_path / "shadow" / "pytorch_lora_weights.safetensors"))
    theirs = load_file(str(tmp_path / "deep" / "pytorch_lora_weights.safetensors"))
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    with pytest.raises(ValueError, match="the frozen base has no LoRA state"):
        frozen_base(policy).broadcast_state()


def test_a_lora_run_holds_one_base_for_all_its_frozen_versions_and_trains(tmp_path: Path) -> None:
    config = parse_config(TrainConfig, {
        "mode": "vanilla", "run_dir": str(tmp_path / "run"), "iterations": 1, "num_threads": 1,
        "model": {"family": "flux", "lora_rank": 4, "lora_alpha": 8.0},
        "rollout": {"prompts_per_iteration": 2, "group_size": 2, "num_steps": 2, "sde_steps": None},
        "train": {"num_minibatches": 1, "num_epochs": 1, "ema_decay": 0.5, "old_policy_decay": 0.5,
                  "nft_kl_beta": 0.1},
        "eval": {"every": 1, "seeds_per_prompt": 1, "num_steps": 2, "grid_prompts": 1, "raw_model": False},
    })
    trainer = Trainer(config)
    versions = {"ema": trainer.ema, "sampler": trainer.sampler, "previous": trainer.previous,
                "reference": trainer.reference}
    assert all(version is not None and version is not trainer.model for version in versions.values())
    for name, version in versions.items():
        assert base_pointers(version) == base_pointers(trainer.model), name
    summary = trainer.run()
    assert summary.history[-1]["iteration"] == 1
    assert (tmp_path / "run" / "checkpoints" / "iter-000001" / "pytorch_lora_weights.safetensors").is_file()
