"""Data-parallel rollouts: each of K trainer ranks samples and scores its share of an iteration's groups.

The iteration's prompts are split by rank into contiguous shares (`spotlight.rl.micro_batch.rank_rows`
over the prompts, so a group is never split); each rank samples its share with the seeds the loop chose
for those prompts (random, or picked by exploration on the spot devices: the seeds travel with their
prompts), decodes and scores it. A sample is a pure function of (weights, prompt, seed, plan)
(`spotlight.diffusion.noise`) and every rank's sampling policy equals the driver's, so K ranks draw the
samples one process would: the seeds' noise bit for bit, the denoised latents within the float rounding
of a forward batched over a share's rows instead of all of them (~1e-7 on the CPU).

What is gathered on rank 0 is what the update needs whole: the part of the trajectories it reads (every
rank's update draws the same shuffle over all rows, `spotlight.ranks.data_parallel`; NFT reads only the
clean samples, `what_the_update_reads`) and the rewards, P x G floats. The
group statistics and advantages are then computed once on the whole (P, G) reward table: a group's
mean and std need only its own row, and ``train.adv_std: global`` needs every group's, so computing
them where all rows already are is exact under both and costs nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from spotlight.diffusion.sampler import Trajectory
from spotlight.loop.rollout import group_requests, rollout_plan
from spotlight.models.generation import generate, images_of
from spotlight.models.loop_model import LoopModel
from spotlight.rewards.base import Reward, RewardOutput, guarded_score
from spotlight.rewards.overlap import sample_and_prefetch
from spotlight.rl.micro_batch import rank_rows

__all__ = ["concat_outputs", "concat_trajectories", "prompt_shares", "rank_reward", "sample_share", "score_share",
           "what_the_update_reads"]


def prompt_shares(num_prompts: int, world_size: int) -> list[slice]:
    """Each rank's contiguous share of the iteration's prompts (rank 0 first; the first ones take one more)."""
    return [rank_rows(num_prompts, rank, world_size) for rank in range(world_size)]


def score_share(model: LoopModel, prompts: Sequence[str], seeds: torch.Tensor, trajectory: Trajectory,
                reward: Reward) -> RewardOutput:
    """The reward of one share's samples (in `group_requests` order), decoded by ``model``'s VAE if it has one."""
    expanded, _ = group_requests(list(prompts), seeds)
    return guarded_score(reward, images_of(model, trajectory.final), expanded)


def sample_share(model: LoopModel, prompts: list[str], seeds: torch.Tensor, config: Any,
                 reward: Reward) -> tuple[Trajectory, RewardOutput]:
    """Sample one rank's share (seeds (P_r, G)) with ``model`` and score it; what a rank k ≥ 1 sends rank 0 (of the
    trajectory, `what_the_update_reads`).

    As the in-process backend samples: with ``reward.overlap`` the chunks are handed to the reward pool
    as they finish, so scoring overlaps the sampling of the next chunk.
    """
    expanded, flat_seeds = group_requests(prompts, seeds)
    plan = rollout_plan(config)
    trajectory = sample_and_prefetch(expanded, seeds.shape[1], config.reward.overlap_groups,
                                     lambda rows: generate(model, expanded[rows], flat_seeds[rows], plan),
                                     lambda latents: images_of(model, latents), reward)
    return what_the_update_reads(trajectory, config.train.algorithm), score_share(model, prompts, seeds, trajectory,
                                                                                 reward)


def what_the_update_reads(trajectory: Trajectory, algorithm: str) -> Trajectory:
    """The part of a share's trajectory the update reads, to gather and hand to every rank: NFT trains on the
    clean samples alone (`spotlight.rl.nft.nft_update` reads ``latents[:, -1]``), so its batch carries those (one
    latent a sample instead of ``num_steps + 1``); Flow-GRPO replays every step, so it carries them all.

    Copied, so that pickling it to another process sends these rows and not the whole trajectory's storage.
    """
    if algorithm != "nft":
        return trajectory
    steps = trajectory.latents.shape[1] - 1
    return Trajectory(trajectory.latents[:, -1:].clone(), trajectory.log_probs[:, :0].clone(),
                      trajectory.start_step + steps)


def concat_trajectories(parts: Sequence[Trajectory]) -> Trajectory:
    """The ranks' trajectories as one, in rank (= prompt) order."""
    return Trajectory(torch.cat([part.latents for part in parts]), torch.cat([part.log_probs for part in parts]),
                      parts[0].start_step)


def concat_outputs(parts: Sequence[RewardOutput]) -> RewardOutput:
    """The ranks' reward outputs as one, in rank order; a term one part lacks is 0 there, as `guarded_score` fills."""
    terms = sorted({term for part in parts for term in part.terms})
    return RewardOutput(
        rewards=torch.cat([part.rewards for part in parts]),
        strict=torch.cat([part.strict for part in parts]),
        valid=torch.cat([part.valid for part in parts]),
        errors=[error for part in parts for error in part.errors],
        terms={term: torch.cat([part.terms.get(term, torch.zeros_like(part.rewards)) for part in parts])
               for term in terms})


def rank_reward(config: Any) -> Reward:
    """The run's reward built on a rank from its config, as the trainer builds it (and bound to the same prompts'
    metadata): a rank on another node builds its own rather than receive a reward's pools or connections."""
    from spotlight.data import open_dataset
    from spotlight.data.metadata_reward import bind_metadata
    from spotlight.rewards.registry import build_loop_reward
    from spotlight.task_presets import get_task

    task = get_task(config.task)
    dataset = open_dataset(config.data.dataset) if config.data.dataset is not None else task.dataset()
    return bind_metadata(build_loop_reward(config.reward, task.make_reward), dataset)
