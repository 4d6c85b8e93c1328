"""A rollout's sampling plan, its sample order, and its scoring: reward → group advantages → the update's batch.

Written once for every backend: a rollout sampled whole in this process and one sampled in parts on
several devices are scored by the same `score_rollout`, in the same (prompt-major) sample order.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from spotlight.config import TrainConfig
from spotlight.diffusion.sampler import SamplingPlan, Trajectory
from spotlight.disagg.groups import AssembledGroup
from spotlight.models.generation import generate, images_of, prompt_tokens
from spotlight.models.loop_model import LoopModel
from spotlight.models.pipelines.folder import read_pipeline_folder
from spotlight.rewards.base import Reward, RewardOutput, guarded_score
from spotlight.rewards.composite import term_metrics
from spotlight.rl.advantages import group_advantages, per_term_advantages
from spotlight.rl.grpo import RolloutBatch

__all__ = ["Rollout", "group_metrics", "group_requests", "rollout", "rollout_metrics", "rollout_plan", "score_rollout"]


@dataclass
class Rollout:
    """A scored rollout: the update's batch plus the numbers logged about it.

    ``rewards``: (P, G) each sample's reward, NaN where scoring failed (what exploration's preview is checked against).
    """

    batch: RolloutBatch
    metrics: dict[str, float]
    rewards: torch.Tensor | None = None


def rollout_plan(config: TrainConfig) -> SamplingPlan:
    """The sampling plan of rollouts (what every device that helps a rollout runs), with ``rollout.sample_batch``
    rows per sampling forward, so every process chunks a rollout's rows alike (`generate`).

    With ``model.pretrained`` the sigma schedule is the pipeline scheduler's at the rollout's latent size
    (its static shift or resolution-dependent ``mu``, its grid and terminal stretch: what ``pipe(...)``
    samples on; ``rollout.shift`` is not used), read from the folder's JSON alone.
    """
    section = config.rollout
    shift, grid_end, shift_terminal = section.shift, None, None
    if config.model.pretrained is not None:
        folder = read_pipeline_folder(config.model.pretrained)
        schedule = folder.schedule(folder.latent_size(section.resolution_hw or folder.default_resolution))
        shift, grid_end, shift_terminal = schedule.shift, schedule.grid_end, schedule.shift_terminal
    return SamplingPlan(num_steps=section.num_steps, shift=shift, sampler=config.rollout_sampler,
                        noise_level=section.noise_level, sde_steps=section.sde_steps, grid_end=grid_end,
                        shift_terminal=shift_terminal, sample_batch=section.sample_batch)


def group_requests(prompts: list[str], seeds: torch.Tensor) -> tuple[list[str], list[int]]:
    """One (prompt, seed) pair per sample of the (P, G) groups, prompt-major: the rollout's sample order."""
    return [prompt for prompt in prompts for _ in range(seeds.shape[1])], seeds.reshape(-1).tolist()


def rollout(model: LoopModel, prompts: list[str], seeds: torch.Tensor, config: TrainConfig,
            reward: Reward) -> Rollout:
    """Sample each prompt's group (seeds (P, G)) in this process, score it, and compute group advantages."""
    expanded, flat_seeds = group_requests(prompts, seeds)
    return score_rollout(model, prompts, seeds, generate(model, expanded, flat_seeds, rollout_plan(config)),
                         config, reward)


def rollout_metrics(rewards: torch.Tensor, valid: torch.Tensor, strict: torch.Tensor) -> dict[str, float]:
    """What is logged about a scored rollout: rewards, valid and strict flags (P, G) of its groups."""
    valid_rewards = torch.where(valid, rewards, torch.nan)
    group_std = valid_rewards.nan_to_num(0).std(dim=1, unbiased=False)
    flat_rewards, flat_valid, flat_strict = rewards.reshape(-1), valid.reshape(-1), strict.reshape(-1)
    return {
        "rollout/reward_mean": float(flat_rewards[flat_valid].mean()) if flat_valid.any() else float("nan"),
        "rollout/strict_accuracy": float(flat_strict[flat_valid].float().mean()) if flat_valid.any() else 0.0,
        "rollout/group_reward_std": float(group_std.mean()),
        "rollout/group_reward_var": float(group_std.pow(2).mean()),
        "rollout/zero_std_groups": float((group_std < 1e-6).float().mean()),
        "rollout/invalid_samples": float((~flat_valid).sum()),
    }


def group_metrics(groups: Sequence[AssembledGroup]) -> dict[str, float]:
    """`rollout_metrics` of a batch delivered as assembled groups (mode disaggregated), in prompt order."""
    ordered = sorted(groups, key=lambda group: group.prompt_index)
    rewards = torch.tensor([[s.reward for s in g.samples] for g in ordered], dtype=torch.float32)
    valid = torch.tensor([[s.valid for s in g.samples] for g in ordered])
    strict = torch.tensor([[s.strict for s in g.samples] for g in ordered])
    return rollout_metrics(rewards, valid, strict)


def _advantages(scored: RewardOutput, rewards: torch.Tensor, valid: torch.Tensor, config: TrainConfig) -> torch.Tensor:
    """GRPO advantages (P, G): of the weighted sum (`reward.normalize: joint`), or of each weighted term on its
    own and then weighted (`per_term`, a composite's `terms`; `spotlight.rl.advantages.per_term_advantages`)."""
    weights = config.reward.weights
    if config.reward.normalize == "joint" or not weights:
        return group_advantages(rewards, valid, config.train.adv_std, config.train.adv_clip)
    terms = {term: values.reshape(rewards.shape) for term, values in scored.terms.items()}
    return per_term_advantages(terms, weights, valid, config.train.adv_std, config.train.adv_clip)


def score_rollout(model: LoopModel, prompts: list[str], seeds: torch.Tensor, trajectory: Trajectory,
                  config: TrainConfig, reward: Reward, scored: RewardOutput | None = None) -> Rollout:
    """Score sampled groups (``trajectory`` in `group_requests` order, from any devices) and compute advantages.

    ``scored``: the samples' rewards when they were scored where they were sampled (K trainer ranks,
    `spotlight.ranks.rollout`); the advantages are still computed here, on the whole (P, G) table.
    """
    num_prompts, group_size = seeds.shape
    section = config.rollout
    plan = rollout_plan(config)
    expanded, _ = group_requests(prompts, seeds)
    timings = {}
    collect = getattr(reward, "collect", None)  # an overlapped reward scored the chunks as they were sampled
    if scored is None and callable(collect):
        started = time.perf_counter()
        scored = collect(expanded, trajectory.final)
        timings = {"time/decode_s": 0.0, "time/reward_s": time.perf_counter() - started}  # the wait for the last
    if scored is None:
        started = time.perf_counter()
        images = images_of(model, trajectory.final)  # on the CPU: the decode has finished
        decoded = time.perf_counter()
        scored = guarded_score(reward, images, expanded)
        timings = {"time/decode_s": decoded - started, "time/reward_s": time.perf_counter() - decoded}
    rewards = scored.rewards.reshape(num_prompts, group_size)
    valid = scored.valid.reshape(num_prompts, group_size)
    advantages = _advantages(scored, rewards, valid, config)
    metrics = rollout_metrics(rewards, valid, scored.strict.reshape(num_prompts, group_size))
    metrics.update(term_metrics(scored))  # a composite reward's terms, one by one
    metrics.update(timings)  # beside time/rollout_s: where the rollout's time went (time/sample_s: the loop's)
    batch = RolloutBatch(
        # nft trains the conditional velocity (CFG-free, as DiffusionNFT); flow-grpo the guided step it sampled
        latents=trajectory.latents, log_probs=trajectory.log_probs,
        tokens=prompt_tokens(model, expanded, guided=config.train.algorithm != "nft"),
        advantages=advantages.reshape(-1), sigmas=plan.sigmas(), noise_level=section.noise_level,
        stochastic_steps=plan.stochastic_steps,
    )
    return Rollout(batch=batch, metrics=metrics, rewards=torch.where(valid, rewards, torch.nan))
