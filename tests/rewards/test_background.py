"""The overlapped reward (the default): chunks scored on a background thread while the rollout samples, same scores."""

import pickle
import threading
import time

import pytest
import torch

from spotlight.config import TrainConfig, parse_config
from spotlight.diffusion.sampler import Trajectory
from spotlight.rewards.background import BackgroundReward
from spotlight.rewards.base import RewardOutput, guarded_score
from spotlight.rewards.overlap import sample_and_prefetch
from spotlight.rewards.registry import build_loop_reward, build_reward
from spotlight.rewards.section import RewardSection
from spotlight.task_presets import get_task
from spotlight.tasks.shapes import sample_prompts


def shapes_batch(count: int, seed: int) -> tuple[torch.Tensor, list[str]]:
    generator = torch.Generator().manual_seed(seed)
    return torch.rand(count, 3, 32, 32, generator=generator), sample_prompts(generator, count)


class SlowThreadRecorder:
    """A reward that takes its time and notes the thread it ran on and the batch sizes it saw."""

    name = "recorder"

    def __init__(self, seconds: float) -> None:
        self.seconds, self.threads, self.sizes = seconds, set(), []

    def score(self, images: torch.Tensor, prompts: list[str]) -> RewardOutput:
        time.sleep(self.seconds)
        self.threads.add(threading.current_thread().name)
        self.sizes.append(len(prompts))
        count = len(prompts)
        return RewardOutput(images.mean(dim=(1, 2, 3)), torch.zeros(count, dtype=torch.bool),
                            torch.ones(count, dtype=torch.bool))


def test_overlap_is_on_by_default_and_the_loop_reward_runs_on_a_background_thread():
    config = parse_config(TrainConfig, {})
    assert config.reward.overlap and config.reward.overlap_worker == "thread"
    assert config.reward.device == "cpu"  # null: the policy's device
    assert parse_config(TrainConfig, {"device": "cuda", "dtype": "bfloat16"}).reward.device == "cuda"
    assert parse_config(TrainConfig, {"device": "cuda", "reward": {"device": "cuda:1"}}).reward.device == "cuda:1"
    loop_reward = build_loop_reward(config.reward, get_task("shapes").make_reward)
    assert isinstance(loop_reward, BackgroundReward)
    assert not isinstance(build_reward(config.reward, get_task("shapes").make_reward), BackgroundReward)
    assert not isinstance(build_loop_reward(RewardSection(overlap=False), get_task("shapes").make_reward),
                          BackgroundReward)


def test_chunks_are_scored_while_the_next_samples_and_collected_without_a_second_decode():
    images, prompts = shapes_batch(12, 0)
    latents = images[:, None] * 2 - 1
    inner = SlowThreadRecorder(0.1)
    reward = BackgroundReward(inner)

    def sample_chunk(rows: slice) -> Trajectory:
        time.sleep(0.1)  # the sampler's time, during which the previous chunk is scored
        return Trajectory(latents[rows], torch.zeros(latents[rows].shape[0], 0), 0)

    started = time.perf_counter()
    trajectory = sample_and_prefetch(prompts, group_size=3, groups_per_chunk=1, sample_chunk=sample_chunk,
                                     to_images=lambda x: (x + 1) / 2, reward=reward)
    out = reward.collect(prompts, trajectory.final)
    elapsed = time.perf_counter() - started
    assert out is not None and reward.prefetched_used == 1
    assert inner.sizes == [3, 3, 3, 3] and all(name.startswith("reward") for name in inner.threads)
    # 4 chunks: sampling 0.4 s and scoring 0.4 s in sequence would be 0.8 s; overlapped ~0.5 s
    assert elapsed < 0.7, elapsed
    here = guarded_score(SlowThreadRecorder(0.0), images, prompts)
    assert torch.equal(out.rewards, here.rewards)


def test_the_shapes_reward_scores_the_same_overlapped_and_in_sequence():
    images, prompts = shapes_batch(16, 1)
    sequential = guarded_score(get_task("shapes").make_reward(0.5), images, prompts)
    reward = BackgroundReward(get_task("shapes").make_reward(0.5))
    for start in range(0, 16, 4):
        reward.prefetch(images[start : start + 4], prompts[start : start + 4])
    out = guarded_score(reward, images, prompts)
    assert reward.prefetched_used == 1
    assert torch.equal(out.rewards, sequential.rewards) and torch.equal(out.strict, sequential.strict)


def test_a_batch_other_than_the_prefetched_one_is_scored_afresh_and_a_pickled_one_is_the_reward():
    images, prompts = shapes_batch(6, 2)
    reward = BackgroundReward(get_task("shapes").make_reward(0.5))
    reward.prefetch(images, prompts)
    other, other_prompts = shapes_batch(6, 3)
    out = guarded_score(reward, other, other_prompts)
    assert reward.prefetched_used == 0
    assert torch.equal(out.rewards, guarded_score(get_task("shapes").make_reward(0.5), other, other_prompts).rewards)
    copy = pickle.loads(pickle.dumps(reward))
    assert isinstance(copy, BackgroundReward) and torch.equal(guarded_score(copy, other, other_prompts).rewards,
                                                              out.rewards)


def test_a_chunk_of_only_bad_samples_marks_only_those_as_one_call_would():
    class FailsOnDark:
        name = "fails-on-dark"

        def score(self, images: torch.Tensor, prompts: list[str]) -> RewardOutput:
            if (images.mean(dim=(1, 2, 3)) < 0.1).any():
                raise ValueError("too dark")
            count = len(prompts)
            return RewardOutput(images.mean(dim=(1, 2, 3)), torch.zeros(count, dtype=torch.bool),
                                torch.ones(count, dtype=torch.bool))

    images = torch.cat([torch.zeros(2, 3, 4, 4), torch.full((2, 3, 4, 4), 0.5)])
    reward = BackgroundReward(FailsOnDark())
    reward.prefetch(images[:2], ["a", "b"])
    reward.prefetch(images[2:], ["c", "d"])
    out = guarded_score(reward, images, ["a", "b", "c", "d"])
    assert out.valid.tolist() == [False, False, True, True]
    assert out.rewards.tolist() == pytest.approx([0.0, 0.0, 0.5, 0.5])
