"""Micro-batches change memory, not the update: NFT and Flow-GRPO steps with ``train.micro_batch_size``
equal the whole-minibatch steps (the reference is the same update without micro-batches)."""

from __future__ import annotations

import copy

import pytest
import torch
from random_models import TINY_SHAPES_CONFIG, randomised_tinydit

from spotlight.config import TrainSection
from spotlight.diffusion.sampler import SamplingPlan
from spotlight.models.generation import generate
from spotlight.rl.grpo import RolloutBatch, grpo_update
from spotlight.rl.micro_batch import micro_batches
from spotlight.rl.nft import nft_update
from spotlight.tasks.shapes import tokenize

PROMPTS = ["a red circle", "two blue squares", "a green circle above a yellow triangle", "a yellow square",
           "a red square", "three green circles"]


def rollout_batch(model) -> RolloutBatch:
    """Six real SDE samples of the model (2 steps) with varied advantages."""
    plan = SamplingPlan(num_steps=2, shift=1.0, sampler="sde", noise_level=0.7)
    with torch.no_grad():
        trajectory = generate(model, PROMPTS, list(range(len(PROMPTS))), plan)
    return RolloutBatch(latents=trajectory.latents, log_probs=trajectory.log_probs,
                        tokens=tokenize(PROMPTS, TINY_SHAPES_CONFIG.max_text_len),
                        advantages=torch.tensor([1.0, -0.5, 2.0, -1.5, 0.7, -1.7]), sigmas=plan.sigmas(),
                        noise_level=0.7, stochastic_steps=2)


def updated(algorithm: str, micro_batch_size: int | None) -> tuple[torch.nn.Module, dict[str, float]]:
    model = randomised_tinydit(TINY_SHAPES_CONFIG, seed=3, std=0.05)
    old, reference = copy.deepcopy(model), copy.deepcopy(model)
    batch = rollout_batch(model)
    with torch.no_grad():  # a reference away from the model, so the KL terms carry gradient
        for parameter in reference.parameters():
            parameter.add_(0.01)
    config = TrainSection(algorithm=algorithm, num_minibatches=1, num_epochs=1, nft_timesteps=2, nft_kl_beta=0.3,
                          kl_beta=0.5, clip_range=0.2, micro_batch_size=micro_batch_size)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    generator = torch.Generator().manual_seed(7)
    if algorithm == "nft":
        metrics = nft_update(model, old, optimizer, batch, config, generator, reference)
    else:
        metrics = grpo_update(model, reference, optimizer, batch, config, generator)
    return model, metrics


@pytest.mark.parametrize("algorithm", ["nft", "flow-grpo"])
def test_a_micro_batched_update_equals_the_whole_minibatch_update(algorithm: str) -> None:
    whole, whole_metrics = updated(algorithm, None)
    micro, micro_metrics = updated(algorithm, 4)  # nft: 12 rows in slices of 4; grpo: 6 rows as 4 + 2
    start = randomised_tinydit(TINY_SHAPES_CONFIG, 3, 0.05)
    pairs = zip(whole.parameters(), start.parameters(), strict=True)
    moved = max(float((a - b).detach().abs().max()) for a, b in pairs)
    assert moved > 1e-3  # the update did something
    for a, b in zip(whole.parameters(), micro.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    for name, value in whole_metrics.items():
        assert micro_metrics[name] == pytest.approx(value, rel=1e-5, abs=1e-7), name


def test_micro_batches_cover_the_rows_once_in_order() -> None:
    config = TrainSection(micro_batch_size=4)
    assert micro_batches(10, config) == [slice(0, 4), slice(4, 8), slice(8, 10)]
    assert micro_batches(10, TrainSection()) == [slice(0, 10)]
