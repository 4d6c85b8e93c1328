"""GAP: the pipelined update (groups in any arrival order, one step per logical batch) equals the one-shot
update of the repository (`nft_update` / `grpo_update` at one epoch and one minibatch) on the same samples."""

import random

import pytest
import torch
from disagg_batches import PLAN, policy, scored_batch, twin

from spotlight.config import TrainSection
from spotlight.disagg.accumulate import LogicalBatchUpdate, one_shot_update
from spotlight.disagg.group_loss import ForwardNoise, GrpoGroupLoss, NftGroupLoss
from spotlight.disagg.groups import GroupAssembler
from spotlight.rl.advantages import group_advantages
from spotlight.rl.grpo import RolloutBatch, choose_train_timesteps, grpo_update
from spotlight.rl.nft import nft_update

GROUP_SIZE = 4


def rollout_batch(samples, section: TrainSection) -> RolloutBatch:
    """The one-shot path's batch: prompt-major rows, advantages of the whole (P, G) reward matrix."""
    rewards = torch.tensor([s.reward for s in samples]).reshape(-1, GROUP_SIZE)
    return RolloutBatch(
        latents=torch.stack([s.latents for s in samples]), log_probs=torch.stack([s.log_probs for s in samples]),
        tokens=torch.stack([s.tokens for s in samples]),
        advantages=group_advantages(rewards, None, section.adv_std, section.adv_clip).reshape(-1),
        sigmas=PLAN.sigmas(), noise_level=PLAN.noise_level, stochastic_steps=PLAN.num_steps)


def nft_update_draws(batch: RolloutBatch, samples, section: TrainSection, seed: int) -> dict:
    """The forward-process draws `nft_update` makes from generator ``seed`` (one epoch, one minibatch), per id."""
    generator = torch.Generator().manual_seed(seed)
    kept = torch.nonzero(batch.advantages != 0).squeeze(1)
    order = kept[torch.randperm(len(kept), generator=generator)]
    count, repeats = len(order), section.nft_timesteps
    shape = batch.latents.shape[2:]
    sigma = torch.rand(count * repeats, generator=generator)
    noise = torch.randn((count * repeats, *shape), generator=generator)
    draws = {}
    for i, row in enumerate(order.tolist()):
        rows = [t * count + i for t in range(repeats)]
        draws[samples[row].id] = ForwardNoise(sigmas=sigma[rows], noise=noise[rows])
    return draws


def arrive_shuffled(samples, seed: int):
    """The complete groups, in the order a shuffled arrival of the samples completes them."""
    arrival = list(samples)
    random.Random(seed).shuffle(arrival)
    assembler = GroupAssembler(num_prompts=len(samples) // GROUP_SIZE, group_size=GROUP_SIZE)
    for sample in arrival:
        yield from assembler.add(sample)


def adamw(model):
    return torch.optim.AdamW(model.parameters(), lr=1e-3)


def assert_same_update(gap_model, reference_model, gap_metrics, reference_loss):
    assert gap_metrics["train/loss"] == pytest.approx(reference_loss, rel=1e-5)
    for (name, gap), reference in zip(gap_model.named_parameters(), reference_model.parameters(), strict=True):
        torch.testing.assert_close(gap.grad, reference.grad, rtol=1e-4, atol=1e-7, msg=f"gradient of {name}")
        torch.testing.assert_close(gap.detach(), reference.detach(), rtol=0, atol=1e-6, msg=f"weight {name}")


@pytest.mark.parametrize("pack_timesteps", [True, False])
@pytest.mark.parametrize("arrival_seed", [0, 1])
def test_gap_nft_update_equals_the_one_shot_nft_update(pack_timesteps, arrival_seed):
    section = TrainSection(algorithm="nft", num_epochs=1, num_minibatches=1, nft_timesteps=2, nft_kl_beta=0.0)
    model = policy(0)
    samples = scored_batch(model, GROUP_SIZE)
    batch = rollout_batch(samples, section)
    draws = nft_update_draws(batch, samples, section, seed=7)
    reference_model = twin(model)
    reference = nft_update(reference_model, twin(model), adamw(reference_model), batch, section,
                           torch.Generator().manual_seed(7))

    old = twin(model)
    loss = NftGroupLoss({0: old}, draws.__getitem__, section.nft_beta, section.nft_adv_scale, section.nft_timesteps,
                        pack_timesteps=pack_timesteps)
    update = LogicalBatchUpdate(model, loss, num_groups=len(samples) // GROUP_SIZE)
    for group in arrive_shuffled(samples, arrival_seed):
        update.add(group)
    metrics = update.commit(adamw(model), section.grad_clip)

    assert metrics["train/rows"] == reference["train/trained_samples"] * section.nft_timesteps
    assert_same_update(model, reference_model, metrics, reference["train/loss"])


@pytest.mark.parametrize("pack_timesteps", [True, False])
def test_gap_grpo_update_equals_the_one_shot_grpo_update(pack_timesteps):
    section = TrainSection(algorithm="flow-grpo", num_minibatches=1, timestep_fraction=0.6,
                           timestep_selection="random", kl_beta=0.5, clip_range=5e-3)
    sampler = policy(0)
    samples = scored_batch(sampler, GROUP_SIZE)
    model = twin(sampler)
    with torch.no_grad():  # the policy has moved since the rollout: ratios ≠ 1, some clipped
        for parameter in model.parameters():
            parameter.add_(0.01 * torch.randn_like(parameter))
    reference_policy = policy(3)
    batch = rollout_batch(samples, section)
    reference_model = twin(model)
    reference = grpo_update(reference_model, reference_policy, adamw(reference_model), batch, section,
                            torch.Generator().manual_seed(11))

    timesteps = choose_train_timesteps(PLAN.num_steps, section.timestep_fraction, torch.Generator().manual_seed(11),
                                       section.timestep_selection)
    loss = GrpoGroupLoss(timesteps, PLAN.sigmas(), PLAN.noise_level, section.clip_range, section.kl_beta,
                         reference_policy, pack_timesteps=pack_timesteps)
    update = LogicalBatchUpdate(model, loss, num_groups=len(samples) // GROUP_SIZE)
    for group in arrive_shuffled(samples, 3):
        update.add(group)
    metrics = update.commit(adamw(model), section.grad_clip)

    assert 0 < reference["train/clip_fraction"] < 1
    assert metrics["train/clip_fraction"] == pytest.approx(reference["train/clip_fraction"])
    assert metrics["train/kl"] == pytest.approx(reference["train/kl"], rel=1e-5)
    assert_same_update(model, reference_model, metrics, reference["train/loss"])


def test_the_one_shot_fallback_equals_the_pipelined_update():
    section = TrainSection(algorithm="nft", num_epochs=1, num_minibatches=1, nft_timesteps=2, nft_kl_beta=0.0)
    model = policy(0)
    samples = scored_batch(model, GROUP_SIZE)
    groups = list(arrive_shuffled(samples, 5))
    old = twin(model)
    draws = {}

    def noise(sample_id):
        return draws.setdefault(sample_id, ForwardNoise(torch.rand(2), torch.randn(2, *samples[0].latents.shape[1:])))

    loss = NftGroupLoss({0: old}, noise, section.nft_beta, section.nft_adv_scale, 2)
    fallback_model = twin(model)
    fallback = one_shot_update(fallback_model, loss, groups, adamw(fallback_model), section.grad_clip)
    update = LogicalBatchUpdate(model, loss, num_groups=len(groups))
    for group in groups:
        update.add(group)
    assert_same_update(model, fallback_model, update.commit(adamw(model), section.grad_clip), fallback["train/loss"])


def test_the_step_waits_for_the_whole_logical_batch():
    model = policy(0)
    samples = scored_batch(model, GROUP_SIZE)
    groups = list(arrive_shuffled(samples, 0))
    loss = GrpoGroupLoss([0], PLAN.sigmas(), PLAN.noise_level, 1e-2)
    update = LogicalBatchUpdate(model, loss, num_groups=len(groups))
    update.add(groups[0])
    with pytest.raises(RuntimeError, match="must wait"):
        update.commit(adamw(model), 1.0)
    with pytest.raises(ValueError, match="added twice"):
        update.add(groups[0])


def test_exactly_one_optimizer_step_per_logical_batch():
    model = policy(0)
    samples = scored_batch(model, GROUP_SIZE)
    optimizer = adamw(model)
    loss = GrpoGroupLoss([0, 2], PLAN.sigmas(), PLAN.noise_level, 1e-2)
    update = LogicalBatchUpdate(model, loss, num_groups=len(samples) // GROUP_SIZE)
    for group in arrive_shuffled(samples, 2):
        update.add(group)
    update.commit(optimizer, 1.0)
    assert {int(state["step"]) for state in optimizer.state.values()} == {1}
