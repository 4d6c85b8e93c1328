"""The pooled reward: a worker process that scores chunks while the caller samples, with the same numbers."""

import time

import pytest
import torch

from spotlight.diffusion.sampler import Trajectory
from spotlight.rewards.base import RewardError, guarded_score
from spotlight.rewards.overlap import sample_and_prefetch
from spotlight.rewards.pool import PooledReward
from spotlight.rewards.registry import build_reward
from spotlight.rewards.section import RewardSection
from spotlight.task_presets import get_task
from spotlight.tasks.shapes import sample_prompts


@pytest.fixture(scope="module")
def pooled():
    reward = PooledReward(build_reward, RewardSection(overlap=True), get_task("shapes").make_reward)
    yield reward
    reward.close()


def shapes_batch(count: int, seed: int) -> tuple[torch.Tensor, list[str]]:
    generator = torch.Generator().manual_seed(seed)
    prompts = sample_prompts(generator, count)
    return torch.rand(count, 3, 32, 32, generator=generator), prompts


def test_the_worker_scores_exactly_as_the_reward_in_this_process(pooled):
    images, prompts = shapes_batch(12, 0)
    here = guarded_score(get_task("shapes").make_reward(0.5), images, prompts)
    there = guarded_score(pooled, images, prompts)
    assert pooled.name == "pooled[" + get_task("shapes").make_reward(0.5).name + "]"
    assert torch.equal(here.rewards, there.rewards) and torch.equal(here.strict, there.strict)


def test_chunks_handed_over_during_sampling_are_what_score_collects(pooled):
    images, prompts = shapes_batch(12, 1)
    latents = images[:, None] * 2 - 1  # a one-step "trajectory" whose final latent is the image

    def sample_chunk(rows: slice) -> Trajectory:
        time.sleep(0.05)  # the sampler's time, during which the worker scores the previous chunk
        return Trajectory(latents[rows], torch.zeros(latents[rows].shape[0], 0), 0)

    trajectory = sample_and_prefetch(prompts, group_size=3, groups_per_chunk=2, sample_chunk=sample_chunk,
                                     to_images=lambda x: (x + 1) / 2, reward=pooled)
    assert len(pooled._prefetched) == 2 and torch.equal(trajectory.latents, latents)
    out = guarded_score(pooled, (trajectory.final + 1) / 2, prompts)
    assert pooled._prefetched == []  # collected, not scored again
    here = guarded_score(get_task("shapes").make_reward(0.5), images, prompts)
    assert torch.equal(out.rewards, here.rewards)


def test_a_batch_other_than_the_prefetched_one_is_scored_afresh(pooled):
    images, prompts = shapes_batch(6, 2)
    pooled.prefetch(images, prompts)
    other, other_prompts = shapes_batch(6, 3)
    out = guarded_score(pooled, other, other_prompts)
    assert torch.equal(out.rewards, guarded_score(get_task("shapes").make_reward(0.5), other, other_prompts).rewards)


def test_a_worker_that_cannot_build_its_reward_fails_in_one_line(tmp_path):
    with pytest.raises(RewardError, match=r"reward worker: RewardError: reward.models.clip .* does not exist"):
        PooledReward(build_reward, RewardSection(name="clipscore", models={"clip": str(tmp_path / "none")}))


def test_metadata_added_only_at_scoring_time_is_scored_afresh_not_taken_from_the_prefetch():
    reward = build_reward(RewardSection(name="reward_functions:brightness", overlap=True, overlap_worker="process"))
    assert isinstance(reward, PooledReward)
    try:
        images = torch.stack([torch.full((3, 4, 4), 0.25), torch.full((3, 4, 4), 0.5)])
        reward.prefetch(images, ["a", "b"])  # no metadata yet: bonus 0
        out = guarded_score(reward, images, ["a", "b"], [{"bonus": 1}, {}])
        torch.testing.assert_close(out.rewards, torch.tensor([1.25, 0.5]))
        with pytest.raises(RewardError, match="set reward.overlap false"):
            import pickle
            pickle.dumps(reward)
    finally:
        reward.close()
