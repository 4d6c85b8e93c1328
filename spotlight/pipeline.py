"""The training loop: rollout -> reward -> GRPO update, with seed exploration in three modes.

    vanilla        random seeds for every group
    sync-explore   before each rollout, score N candidate seeds per prompt with the CURRENT weights
                   θ_i and keep the G with the largest reward variance (exploration on the critical path)
    stale-explore  the same, but with the PREVIOUS weights θ_{i-1}: what Spotlight runs on spot devices
                   while iteration i-1 trains. Here it runs in sequence, so that its effect on
                   convergence is measured apart from the systems effect.
    spot-rollout   (Ray) spot devices help the rollout and idle during training
    spotlight      (Ray) stale exploration on spot devices hidden behind training; see spotlight/spot_pipeline.py,
                   which runs this module's functions on the device pools

Every random choice of iteration i (its prompts, its candidate seeds, its shuffles) comes from
generators keyed by (run seed, i), so a resumed run continues with exactly the numbers it would have
had, and a run is fully described by its config.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from spotlight.base_policy import build_policy
from spotlight.config import TrainConfig, TrainSection, dump_config
from spotlight.diffusion.noise import stream_key
from spotlight.diffusion.sampler import SamplingPlan, Trajectory
from spotlight.evaluation import evaluate
from spotlight.explore.candidates import exploration_sampling, score_candidates
from spotlight.explore.planner import ExplorationPlanner, ExplorePlan
from spotlight.explore.selection import select_seeds
from spotlight.explore.staleness import StalenessMonitor
from spotlight.generation import generate, prompt_tokens, to_images
from spotlight.models.tinydit import TinyDiT
from spotlight.pretrain import ema_decay_at, update_ema
from spotlight.report.grid import save_grid
from spotlight.rewards.base import Reward, guarded_score
from spotlight.rl.advantages import group_advantages
from spotlight.rl.checkpoint import (
    latest_checkpoint,
    load_model,
    load_training_state,
    replace_model,
    save_training_checkpoint,
)
from spotlight.rl.grpo import RolloutBatch, grpo_update
from spotlight.rl.manifest import write_text_durably
from spotlight.rl.nft import nft_update
from spotlight.run_dir import RunDirLock, check_resume_config, read_metrics
from spotlight.runtime.cores import pinned
from spotlight.tasks.registry import get_task, task_of

GRID_SEEDS = 4  # columns of the validation sample grid: the first seeds of each shown prompt


class RunError(RuntimeError):
    """The run cannot go on; the message is one line naming the cause and the fix."""


def iteration_generator(run_seed: int, iteration: int, purpose: int) -> torch.Generator:
    """A generator for one purpose of one iteration (0 prompts, 1 seeds, 2 update, 3 selection)."""
    return torch.Generator().manual_seed(stream_key(run_seed * 16 + purpose, iteration))


def iteration_prompts(train_prompts: list[str], run_seed: int, iteration: int, count: int) -> list[str]:
    """The prompts of iteration i: ``count`` distinct train prompts drawn by (run seed, i)."""
    order = torch.randperm(len(train_prompts), generator=iteration_generator(run_seed, iteration, 0))
    return [train_prompts[int(j)] for j in order[:count]]


def candidate_seeds(run_seed: int, iteration: int, num_prompts: int, count: int) -> torch.Tensor:
    """(P, count) candidate noise seeds of iteration i; vanilla takes the first G of each row."""
    return torch.randint(0, 2**62, (num_prompts, count), generator=iteration_generator(run_seed, iteration, 1))


@dataclass
class Rollout:
    """A scored rollout: the update's batch plus the numbers logged about it."""

    batch: RolloutBatch
    metrics: dict[str, float]


def rollout_plan(config: TrainConfig) -> SamplingPlan:
    """The SDE sampling plan of GRPO rollouts (what every device that helps a rollout runs)."""
    section = config.rollout
    return SamplingPlan(num_steps=section.num_steps, shift=section.shift, sampler=config.rollout_sampler,
                        noise_level=section.noise_level, sde_steps=section.sde_steps)


def group_requests(prompts: list[str], seeds: torch.Tensor) -> tuple[list[str], list[int]]:
    """One (prompt, seed) pair per sample of the (P, G) groups, prompt-major: the rollout's sample order."""
    return [prompt for prompt in prompts for _ in range(seeds.shape[1])], seeds.reshape(-1).tolist()


def rollout(model: TinyDiT, prompts: list[str], seeds: torch.Tensor, config: TrainConfig, reward: Reward) -> Rollout:
    """SDE-sample each prompt's group (seeds (P, G)), score it, and compute group advantages."""
    expanded, flat_seeds = group_requests(prompts, seeds)
    return score_rollout(model, prompts, seeds, generate(model, expanded, flat_seeds, rollout_plan(config)),
                         config, reward)


def score_rollout(model: TinyDiT, prompts: list[str], seeds: torch.Tensor, trajectory: Trajectory,
                  config: TrainConfig, reward: Reward) -> Rollout:
    """Score sampled groups (``trajectory`` in `group_requests` order, from any devices) and compute advantages."""
    num_prompts, group_size = seeds.shape
    section = config.rollout
    plan = rollout_plan(config)
    expanded, _ = group_requests(prompts, seeds)
    scored = guarded_score(reward, to_images(trajectory.final), expanded)
    rewards = scored.rewards.reshape(num_prompts, group_size)
    valid = scored.valid.reshape(num_prompts, group_size)
    advantages = group_advantages(rewards, valid, config.train.adv_std, config.train.adv_clip)
    valid_rewards = torch.where(valid, rewards, torch.nan)
    group_std = valid_rewards.nan_to_num(0).std(dim=1, unbiased=False)
    metrics = {
        "rollout/reward_mean": float(scored.rewards[scored.valid].mean()) if scored.valid.any() else float("nan"),
        "rollout/strict_accuracy": float(scored.strict[scored.valid].float().mean()) if scored.valid.any() else 0.0,
        "rollout/group_reward_std": float(group_std.mean()),
        "rollout/group_reward_var": float(group_std.pow(2).mean()),
        "rollout/zero_std_groups": float((group_std < 1e-6).float().mean()),
        "rollout/invalid_samples": float((~scored.valid).sum()),
    }
    batch = RolloutBatch(
        latents=trajectory.latents, log_probs=trajectory.log_probs, tokens=prompt_tokens(model, expanded),
        advantages=advantages.reshape(-1), sigmas=plan.sigmas(), noise_level=section.noise_level,
        stochastic_steps=plan.stochastic_steps,
    )
    return Rollout(batch=batch, metrics=metrics)


@dataclass
class Exploration:
    """Seeds chosen for a rollout and what exploration measured."""

    seeds: torch.Tensor
    metrics: dict[str, float] = field(default_factory=dict)


def explore(
    explorer: TinyDiT, prompts: list[str], candidates: torch.Tensor, plan: ExplorePlan, config: TrainConfig,
    reward: Reward, generator: torch.Generator,
) -> tuple[Exploration, torch.Tensor]:
    """Score every candidate seed (P, N) under ``plan`` with ``explorer``'s weights; keep the G most varied.

    Returns the exploration and the (P, N) candidate rewards (the staleness monitor compares them).
    """
    sampling = exploration_sampling(plan, rollout_plan(config))
    rewards = score_candidates(explorer, prompts, candidates, sampling, reward)
    return select_explored(rewards, candidates, config, generator), rewards


def select_explored(rewards: torch.Tensor, candidates: torch.Tensor, config: TrainConfig,
                    generator: torch.Generator) -> Exploration:
    """Keep the G most varied of each prompt's scored candidates (rewards and seeds (P, N)), wherever scored."""
    selection = select_seeds(rewards, candidates, config.rollout.group_size, generator)
    metrics = {
        "explore/selected_reward_std": float(selection.variance.sqrt().mean()),
        "explore/candidate_reward_std": float(rewards.nan_to_num(0).std(dim=1, unbiased=False).mean()),
        "explore/degenerate_prompts": float(selection.degenerate.float().mean()),
    }
    return Exploration(seeds=selection.seeds, metrics=metrics)


def build_optimizer(model: torch.nn.Module, section: TrainSection) -> torch.optim.Optimizer:
    """The update's optimizer: AdamW, or SGD with momentum (``train.optimizer``)."""
    if section.optimizer == "sgd":
        return torch.optim.SGD(model.parameters(), lr=section.learning_rate, momentum=section.momentum,
                               weight_decay=section.weight_decay)
    return torch.optim.AdamW(model.parameters(), lr=section.learning_rate, weight_decay=section.weight_decay)


@dataclass
class RunSummary:
    run_dir: Path
    history: list[dict[str, Any]]
    validation: list[dict[str, float]]


class Trainer:
    """Owns the models, optimizer and run directory of one ``spotlight train`` run."""

    def __init__(self, config: TrainConfig, reward: Reward | None = None, resume: bool = False) -> None:
        self.config = config
        torch.manual_seed(config.seed)
        torch.set_num_threads(1 if config.pin_devices else config.num_threads)
        self.run_dir = Path(config.run_dir)
        self._lock = RunDirLock(self.run_dir)  # one writer per run directory, until `run` ends
        try:
            if resume:  # before anything is loaded or written: a resume must not change what ran
                check_resume_config(self.run_dir / "config.yaml", config)
            self._setup(config, reward, resume)
        except BaseException:
            self._lock.release()
            raise

    def _setup(self, config: TrainConfig, reward: Reward | None, resume: bool) -> None:
        task = get_task(config.task)
        self.reward = reward if reward is not None else task.make_reward(config.reward.strict_weight)
        self.train_prompts, self.val_prompts = task.split()
        self.model = build_policy(config)
        if task_of(self.model) is not task:
            raise RunError(f"base_checkpoint {config.base_checkpoint} is a {task_of(self.model).name!r} model, "
                           f"but task is {config.task!r}: set task to {task_of(self.model).name!r} or pick "
                           f"a {config.task!r} model")
        uses_reference = config.train.algorithm == "flow-grpo" and config.train.kl_beta > 0
        self.reference = build_policy(config).requires_grad_(False) if uses_reference else None
        self.ema = copy.deepcopy(self.model).requires_grad_(False) if config.train.ema_decay else None
        self.previous = copy.deepcopy(self.model).requires_grad_(False)  # θ_{i-1} for stale exploration
        self.optimizer = build_optimizer(self.model, config.train)
        self.monitor = StalenessMonitor(config.explore.staleness_floor)
        self.planner = ExplorationPlanner(config.explore.planner) if config.explore.planner is not None else None
        self.budget_s = config.explore.initial_budget_s  # the training time exploration must fit in
        self.start_iteration = 0
        self.best_accuracy = float("-inf")
        self.history: list[dict[str, Any]] = []
        if resume:
            self._resume()
        elif (self.run_dir / "metrics.jsonl").exists():
            raise RunError(f"run directory {self.run_dir} already has a run: pass --resume to continue it, "
                           "or choose another run_dir")
        dump_config(config, self.run_dir / "config.yaml")

    def _resume(self) -> None:
        checkpoint = latest_checkpoint(self.run_dir)
        if checkpoint is None:
            raise RunError(f"--resume: {self.run_dir} has no checkpoint yet; run without --resume to start it")
        self.model.load_state_dict(load_model(checkpoint).state_dict())
        state = load_training_state(checkpoint)
        self.optimizer.load_state_dict(state.optimizer)
        if self.ema is not None and state.ema is not None:
            self.ema.load_broadcast_state(state.ema)
        self.previous.load_broadcast_state(state.extra["previous"])
        self.monitor.load_state_dict(state.extra["monitor"])
        if self.planner is not None:
            self.planner.load_state_dict(state.extra["planner"])
        self.budget_s = state.extra.get("budget_s", self.budget_s)
        torch.set_rng_state(state.rng["torch"])
        self.start_iteration = state.iteration
        metrics_path = self.run_dir / "metrics.jsonl"
        kept = read_metrics(metrics_path)
        self.history = [record for record in kept if record["iteration"] <= state.iteration]
        self.best_accuracy = max((r["val/strict_accuracy"] for r in self.history if "val/strict_accuracy" in r),
                                 default=float("-inf"))
        write_text_durably(metrics_path, "".join(json.dumps(record) + "\n" for record in self.history))

    @property
    def eval_model(self) -> TinyDiT:
        return self.ema if self.ema is not None else self.model

    def validate(self, iteration: int) -> dict[str, float]:
        """Strict validation accuracy (ODE, fixed seeds) of the EMA and the raw weights; a sample grid.

        Keeps the best EMA so far in ``checkpoints/best`` (a run can pass its peak; the best is what
        a user ships).
        """
        section = self.config.eval
        result = evaluate(self.eval_model, self.val_prompts, self.reward, section.seeds_per_prompt,
                          section.num_steps, self.config.rollout.shift)
        columns = min(section.seeds_per_prompt, GRID_SEEDS)
        shown = [p * section.seeds_per_prompt + s for p in range(section.grid_prompts) for s in range(columns)]
        shown = [index for index in shown if index < len(result.prompts)]
        save_grid(result.images[shown], [result.prompts[i] for i in shown],
                  self.run_dir / "samples" / f"iter-{iteration:05d}.png", columns=columns)
        metrics = result.metrics()
        if section.raw_model and self.ema is not None:
            raw = evaluate(self.model, self.val_prompts, self.reward, section.seeds_per_prompt, section.num_steps,
                           self.config.rollout.shift)
            metrics.update(raw.metrics(prefix="val_raw"))
        if metrics["val/strict_accuracy"] > self.best_accuracy:
            self.best_accuracy = metrics["val/strict_accuracy"]
            replace_model(self.run_dir / "checkpoints" / "best", self.eval_model,
                          {"iteration": iteration, "val/strict_accuracy": self.best_accuracy})
        return metrics

    def explore_plan(self, num_prompts: int) -> tuple[ExplorePlan | None, dict[str, float]]:
        """This iteration's exploration plan: the planner's choice within the budget, or the fixed plan."""
        section = self.config.explore
        if self.planner is None:
            return ExplorePlan(section.num_candidates, section.num_steps, section.sampler), {}
        decision = self.planner.choose(self.budget_s, num_devices=1, num_prompts=num_prompts)
        metrics = {"planner/budget_s": self.budget_s, "planner/predicted_s": decision.predicted_time_s,
                   "planner/feasible_arms": float(len(decision.feasible_arms))}
        if decision.plan is not None:
            metrics.update({"planner/num_candidates": float(decision.plan.num_candidates),
                            "planner/num_steps": float(decision.plan.num_steps)})
        return decision.plan, metrics

    def choose_seeds(self, iteration: int, prompts: list[str]) -> tuple[Exploration, ExplorePlan | None]:
        """Seeds for iteration i's groups according to the mode, and the exploration plan that chose them."""
        config = self.config
        group_size = config.rollout.group_size
        random_seeds = candidate_seeds(config.seed, iteration, len(prompts), group_size)
        if config.mode == "vanilla":
            return Exploration(seeds=random_seeds), None
        plan, plan_metrics = self.explore_plan(len(prompts))
        if plan is None:  # nothing fits the budget: random seeds, as vanilla
            return Exploration(seeds=random_seeds, metrics=plan_metrics), None
        candidates = candidate_seeds(config.seed, iteration, len(prompts), plan.num_candidates)
        generator = iteration_generator(config.seed, iteration, 3)
        explorer = self.model if config.mode == "sync-explore" else self.previous
        started = time.perf_counter()
        exploration, rewards = explore(explorer, prompts, candidates, plan, config, self.reward, generator)
        elapsed = time.perf_counter() - started
        if self.planner is not None:
            self.planner.observe_cost(plan, elapsed, len(prompts) * plan.num_candidates, plan.num_steps)
        exploration.metrics.update({"time/explore_s": elapsed, **plan_metrics})
        if config.mode == "stale-explore":
            exploration.metrics.update(self._measure_staleness(iteration, prompts, candidates, rewards,
                                                               exploration.seeds, plan))
        return exploration, plan

    def _measure_staleness(self, iteration: int, prompts: list[str], candidates: torch.Tensor,
                           stale_rewards: torch.Tensor, stale_seeds: torch.Tensor,
                           plan: ExplorePlan) -> dict[str, float]:
        """Rank a sample of prompts' candidates with the fresh weights too; log Kendall τ and overlap."""
        sample = min(self.config.explore.monitor_prompts, len(prompts))
        if sample == 0:
            return {}
        generator = iteration_generator(self.config.seed, iteration, 3)
        fresh, fresh_rewards = explore(self.model, prompts[:sample], candidates[:sample], plan, self.config,
                                       self.reward, generator)
        record = self.monitor.record(iteration, stale_rewards[:sample], fresh_rewards, stale_seeds[:sample],
                                     fresh.seeds)
        return {"staleness/kendall_tau": record.tau, "staleness/selection_overlap": record.overlap}

    def run(self, on_iteration: Callable[[int, dict[str, Any]], None] | None = None,
            step: Callable[[int], dict[str, Any]] | None = None, max_wall_s: float | None = None) -> RunSummary:
        """Train from the current iteration to ``config.iterations``; returns the history.

        ``step`` runs one iteration (default `iteration`; the Ray runtime passes its own, which
        distributes the same calls). With ``max_wall_s`` the run ends after the iteration that
        passes that wall time, validated and checkpointed like a last iteration; with
        ``eval.target_accuracy`` it also ends at the first validation that reaches it. ``time/wall_s``
        is the iterations' own wall time: validation (a measurement, 1,600 samples twice) and
        checkpoint writes are left out, so time to a target does not depend on how often one looks.
        """
        config = self.config
        step = step or self.iteration
        metrics_file = (self.run_dir / "metrics.jsonl").open("a")
        wall_s = self.history[-1]["time/wall_s"] if self.history else 0.0
        try:
            if self.start_iteration == 0:
                record = {"iteration": 0, "time/wall_s": 0.0, **self.validate(0)}
                self._log(metrics_file, record, on_iteration)
            for iteration in range(self.start_iteration, config.iterations):
                step_started = time.perf_counter()
                record = step(iteration)
                wall_s += time.perf_counter() - step_started
                record["time/wall_s"] = wall_s
                done = iteration + 1
                last = done == config.iterations or (max_wall_s is not None and record["time/wall_s"] >= max_wall_s)
                if done % config.eval.every == 0 or last:
                    eval_started = time.perf_counter()
                    record.update(self.validate(done))
                    record["time/eval_s"] = time.perf_counter() - eval_started
                    target = config.eval.target_accuracy
                    last = last or (target is not None and record["val/strict_accuracy"] >= target)
                self._log(metrics_file, record, on_iteration)
                if done % config.checkpoint_every == 0 or last:
                    save_training_checkpoint(self.run_dir, done, self.model, self.optimizer, self.ema, {
                        "previous": self.previous.broadcast_state(), "monitor": self.monitor.state_dict(),
                        "planner": None if self.planner is None else self.planner.state_dict(),
                        "budget_s": self.budget_s})
                if last:
                    break
        finally:
            metrics_file.close()
            self._lock.release()
        validation = [r for r in self.history if "val/strict_accuracy" in r]
        return RunSummary(run_dir=self.run_dir, history=self.history, validation=validation)

    def iteration(self, iteration: int) -> dict[str, Any]:
        """One GRPO iteration: choose seeds, roll out, update. Returns its metrics (iteration = i + 1)."""
        config = self.config
        timings: dict[str, float] = {}
        prompts = iteration_prompts(self.train_prompts, config.seed, iteration, config.rollout.prompts_per_iteration)
        exploration, plan = self.choose_seeds(iteration, prompts)
        started = time.perf_counter()
        scored = rollout(self.model, prompts, exploration.seeds, config, self.reward)
        timings["time/rollout_s"] = time.perf_counter() - started
        if self.planner is not None and plan is not None:
            self.planner.observe_reward(plan, scored.metrics["rollout/group_reward_var"])
        update = self.train_step(iteration, scored)
        return {"iteration": iteration + 1, **scored.metrics, **exploration.metrics, **update, **timings}

    def train_step(self, iteration: int, scored: Rollout) -> dict[str, float]:
        """θ_i → θ_{i+1} on a scored rollout (θ_i kept as ``previous``); the update's metrics and time/train_s.

        The training time becomes the next exploration budget: what exploration hides behind.
        """
        section = self.config.train
        self.previous.load_broadcast_state(self.model.broadcast_state())
        generator = iteration_generator(self.config.seed, iteration, 2)
        started = time.perf_counter()
        if section.algorithm == "nft":  # θ_i (previous) drew the rollout: NFT's sampling policy
            update = nft_update(self.model, self.previous, self.optimizer, scored.batch, section, generator)
        else:
            update = grpo_update(self.model, self.reference, self.optimizer, scored.batch, section, generator)
        self.budget_s = time.perf_counter() - started
        if self.ema is not None:
            update_ema(self.ema, self.model, ema_decay_at(iteration, section.ema_decay))
        return {**update, "time/train_s": self.budget_s}

    def _log(self, metrics_file, record: dict[str, Any], on_iteration) -> None:
        self.history.append(record)
        metrics_file.write(json.dumps(record) + "\n")
        metrics_file.flush()
        if on_iteration is not None:
            on_iteration(record["iteration"], record)


def train(config: TrainConfig, resume: bool = False, reward: Reward | None = None,
          on_iteration: Callable[[int, dict[str, Any]], None] | None = None) -> RunSummary:
    """Run ``spotlight train`` for a config: a thin wrapper for the CLI and tests.

    Modes spot-rollout and spotlight (and the others with ``runtime.use_ray``) run on the Ray
    runtime (`spotlight.spot_pipeline`); the rest in this process.
    """
    from spotlight.spot_pipeline import run_on_ray, uses_ray

    with pinned(config.device_core(0), config.num_threads):  # this process is the trainer's device
        if uses_ray(config):
            return run_on_ray(config, resume=resume, reward=reward, on_iteration=on_iteration)
        return Trainer(config, reward=reward, resume=resume).run(on_iteration, max_wall_s=config.runtime.max_wall_s)
