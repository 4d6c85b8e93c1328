"""The training loop: one iteration for every mode, written once (`Trainer.iteration`).

    vanilla        random seeds for every group
    sync-explore   before each rollout, score N candidate seeds per prompt with the CURRENT weights
                   θ_i and keep the G with the largest reward variance (exploration on the critical path)
    stale-explore  the same, but with the PREVIOUS weights θ_{i-1}: what Spotlight runs on spot devices
                   while iteration i-1 trains. Here it runs in sequence, so that its effect on
                   convergence is measured apart from the systems effect.
    spot-rollout   (Ray) spot devices help the rollout and idle during training
    spotlight      (Ray) stale exploration on spot devices hidden behind training

    disaggregated  (Ray) generator devices apart from the trainer (DigenRL): groups are trained as they
                   complete while generators sample the rest (`spotlight.backends.disaggregated`)

What differs between modes is where sampling runs and with which weights: a backend
(`spotlight.backends`: this process, the Ray device pools, or disaggregated generators) behind one
interface. The loop owns the models, the optimizer, the run directory, validation and checkpoints.

The update consumes the rollout as the backend delivers it. One-shot backends deliver the whole
scored batch (`Rollout`) before training starts and the update is the repository's `nft_update` /
`grpo_update`. The disaggregated backend delivers a stream of complete groups (`GroupStream`) that the
update (`spotlight.disagg.loop_update.GroupedUpdate`) trains one by one, taking one optimizer step
once the last is in; its rollout metrics are complete once the stream is consumed, which is why the
iteration reads them after the update.

Every random choice of iteration i (its prompts, its candidate seeds, its shuffles) comes from
generators keyed by (run seed, i) (`spotlight.loop.streams`), so a resumed run continues with exactly the
numbers it would have had, and a run is fully described by its config.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from spotlight.backends import TrainerView, check_backend, open_backend
from spotlight.backends.disaggregated_stream import GroupStream
from spotlight.components.checkpoint import latest_checkpoint, load_training_state, replace_model
from spotlight.components.fingerprint import record_model
from spotlight.components.guard import GuardVerdict, RunGuard
from spotlight.components.manifest import write_text_durably
from spotlight.components.run_dir import RunDirLock, check_resume_config, read_metrics, write_failed
from spotlight.components.stop_signals import StopRequest, stoppable
from spotlight.config import TrainConfig, dump_config
from spotlight.cores import pinned
from spotlight.data import open_dataset
from spotlight.data.metadata_reward import bind_metadata
from spotlight.diffusion.sampler import Trajectory
from spotlight.disagg.loop_update import GroupedUpdate
from spotlight.disagg.versions import VersionGate
from spotlight.explore.fidelity import preview_fidelity
from spotlight.explore.planner import ExplorationPlanner, PlannerSection
from spotlight.explore.staleness import StalenessMonitor
from spotlight.loop.base_policy import build_policy
from spotlight.loop.evaluation import describe_score, evaluate, validated, validation_score, validation_subset
from spotlight.loop.guard_actions import act_on_verdict
from spotlight.loop.policy_versions import PolicyVersions
from spotlight.loop.rollout import Rollout, rollout_plan, score_rollout
from spotlight.loop.seed_choice import Exploration
from spotlight.loop.streams import Stream, iteration_generator, iteration_prompts
from spotlight.loop.text_encoders import place_text_encoders
from spotlight.models.loop_model import LoopModel
from spotlight.models.pipelines.memory_estimate import out_of_memory_message, with_estimated_micro_batch
from spotlight.models.weight_payload import pack_weights
from spotlight.ranks.group import TrainerRanks
from spotlight.ranks.rollout import score_share
from spotlight.report.grid import save_grid
from spotlight.rewards.base import Reward, RewardOutput
from spotlight.rewards.registry import build_loop_reward, build_reward
from spotlight.rl.kl_control import AdaptiveTrust
from spotlight.rl.rollout_update import build_optimizer, rollout_update
from spotlight.run_error import RunError
from spotlight.task_presets import get_task, task_of
from spotlight.tracking import TrackerHub, check_trackers
from spotlight.tracking.loop_hooks import final_summary, grid_caption, open_trackers

__all__ = ["RunError", "RunSummary", "Trainer", "build_optimizer", "describe_score", "planner_config", "train"]

GRID_SEEDS = 4  # columns of the validation sample grid: the first seeds of each shown prompt

logger = logging.getLogger(__name__)


def planner_config(config: TrainConfig) -> PlannerSection | None:
    """The exploration planner's grid: ``explore.planner``; on Ray exploring modes always plan (runtime.planner)."""
    if config.explore.planner is not None:
        return config.explore.planner
    return config.runtime.planner if config.uses_ray and config.mode.explores else None


@dataclass
class RunSummary:
    """What a finished run returns: its directory, every logged record, and the validated ones.

    ``stopped`` is the guard's one line when it ended a dying run (`spotlight.components.guard`), else None.
    """

    run_dir: Path
    history: list[dict[str, Any]]
    validation: list[dict[str, float]]
    stopped: str | None = None

    @property
    def best(self) -> dict[str, float] | None:
        """The validation record with the highest score (what ``checkpoints/best`` holds; `validation_score`)."""
        return max(self.validation, key=validation_score, default=None)


class Trainer:
    """Owns the models, optimizer and run directory of one ``spotlight train`` run."""

    def __init__(self, config: TrainConfig, reward: Reward | None = None, resume: bool = False) -> None:
        check_backend(config, resume)
        self.config = config
        self.stop = StopRequest(config.runtime.stop_grace_s)  # `train` sets the one its signal handlers feed
        torch.manual_seed(config.seed)
        torch.set_num_threads(1 if config.device_core(0) is not None else config.num_threads)  # CUDA: unpinned
        self.run_dir = Path(config.run_dir)
        self.trackers: TrackerHub | None = None  # log.trackers, opened once the run has started
        self._lock = RunDirLock(self.run_dir)  # one writer per run directory, until `run` ends
        try:
            missing_tracker = check_trackers(config.log)  # a tracker's missing library: one line, before any work
            if missing_tracker is not None:
                raise RunError(missing_tracker)
            if resume:  # before anything is loaded or written: a resume must not change what ran
                check_resume_config(self.run_dir / "config.yaml", config)
            else:  # damaged model files named before a library reads them; their fingerprint kept for --resume
                record_model(self.run_dir, config)
            self._setup(config, reward, resume)
            self.ranks = None  # trainer.devices K > 1: this process is rank 0 of K (spotlight/ranks/group.py)
            # the Ray nodes either starts on this machine never offer a rank this process's GPU (ranks/placement.py)
            self.backend = open_backend(TrainerView(
                config, self.sampler, self.previous, self.eval_model, self.reward, self.train_prompts,
                self.planner, self.monitor, self.run_dir))
            if config.trainer.in_group:
                self.ranks = TrainerRanks(config, self.model, self.optimizer,
                                         None if reward is None else self.reward)
            if resume:  # what it had in flight (spotlight's next seeds)
                self.backend.load_state_dict(self.backend_state)
            if self.ranks is not None:
                if self.ranks.versions is None:
                    self.ranks.synchronise()
                else:  # fsdp: θ and its versions sharded over the ranks, from the start or the checkpoint
                    self.versions, self.optimizer = self.ranks.versions, self.ranks.optimizer
                    if resume:
                        checkpoint, state = self.restored_from
                        self.versions.restore(checkpoint, self.optimizer, state)
                    else:
                        self.versions.start()
            # last: nothing after it can fail the start, so a failed start leaves no tracker run behind
            self.trackers = open_trackers(config, self.run_dir, resume, self.start_iteration)
        except BaseException:
            try:  # a start that fails half-way (a rank that dies restoring, a checkpoint it cannot read) leaves no Ray
                if getattr(self, "ranks", None) is not None:
                    self.ranks.close()
                if getattr(self, "backend", None) is not None:
                    self.backend.close()
            finally:
                self._lock.release()
            raise

    def _setup(self, config: TrainConfig, reward: Reward | None, resume: bool) -> None:
        task = get_task(config.task)
        self.reward = reward if reward is not None else build_loop_reward(config.reward, task.make_reward)
        # the prompts: data.dataset, or the task's preset; a metadata reward reads each prompt's record from it
        self.dataset = open_dataset(config.data.dataset) if config.data.dataset is not None else task.dataset()
        self.reward = bind_metadata(self.reward, self.dataset)
        held_out = config.eval.held_out_reward  # validation's watch on reward hacking (eval.held_out_reward)
        self.held_out = None if held_out is None else bind_metadata(build_reward(held_out, task.make_reward),
                                                                     self.dataset)
        self.train_prompts = self.dataset.train
        self.val_prompts = validation_subset(self.dataset.test, config.eval.prompts)
        if config.data.train_kinds is not None:
            try:
                self.train_prompts = self.dataset.train_of_kinds(config.data.train_kinds)
            except ValueError as error:
                raise RunError(str(error)) from None
        model = build_policy(config)
        if task_of(model) is not task:
            raise RunError(f"base_checkpoint {config.base_checkpoint} is a {task_of(model).name!r} model, "
                           f"but task is {config.task!r}: set task to {task_of(model).name!r} or pick "
                           f"a {config.task!r} model")
        place_text_encoders(model, config, [*self.train_prompts, *self.val_prompts])  # none moves in the loop
        # θ and its sampling, previous, reference and EMA versions (shared base, LoRA deltas)
        sharded = config.trainer.sharding == "fsdp"  # θ and its versions are made, sharded, by the ranks
        self.versions = PolicyVersions.sampling_only(model) if sharded else PolicyVersions.of(model, config.train)
        self.optimizer = build_optimizer(self.model, config.train)
        self.grouped = GroupedUpdate(self.model, self.reference, self.optimizer, config.train, config.seed,
                                     config.disagg.tsp, VersionGate(config.disagg.async_one_step))
        self.monitor = StalenessMonitor(config.explore.staleness_floor)
        self.guard = RunGuard(config.guard)
        # the trust term's weight (nft): fixed at nft_kl_beta, or adapted towards nft_kl_target (rl/kl_control.py)
        self.trust = AdaptiveTrust(config.train.nft_kl_beta,
                                   config.train.nft_kl_target if config.train.algorithm == "nft" else None)
        self.stopped: str | None = None
        planner = planner_config(config)
        self.planner = ExplorationPlanner(planner) if planner is not None else None
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
        state = load_training_state(checkpoint)
        self.restored_from = checkpoint, state  # fsdp: the ranks restore their versions once they have joined
        if self.config.trainer.sharding != "fsdp":
            self.versions.restore(checkpoint, self.optimizer, state)
        self.monitor.load_state_dict(state.extra["monitor"])
        if "guard" in state.extra:
            self.guard.load_state_dict(state.extra["guard"])
        if "trust" in state.extra:
            self.trust.load_state_dict(state.extra["trust"])
        if self.planner is not None:
            self.planner.load_state_dict(state.extra["planner"])
        self.budget_s = state.extra.get("budget_s", self.budget_s)
        self.backend_state = state.extra.get("backend") or {}
        torch.set_rng_state(state.rng["torch"])
        self.start_iteration = state.iteration
        metrics_path = self.run_dir / "metrics.jsonl"
        kept = read_metrics(metrics_path)
        self.history = [record for record in kept if record["iteration"] <= state.iteration]
        # the score validate() compares (strict accuracy, or the mean reward without a strict flag)
        self.best_accuracy = max(map(validation_score, validated(self.history)), default=float("-inf"))
        write_text_durably(metrics_path, "".join(json.dumps(record) + "\n" for record in self.history))

    # the versions by name, read by the backends' view and by tests; PolicyVersions owns them
    @property
    def model(self) -> LoopModel:
        return self.versions.model

    @property
    def sampler(self) -> LoopModel:
        return self.versions.sampler

    @property
    def previous(self) -> LoopModel:
        return self.versions.previous

    @property
    def reference(self) -> Any:
        return self.versions.reference

    @property
    def ema(self) -> LoopModel | None:
        return self.versions.ema

    @property
    def eval_model(self) -> LoopModel:
        return self.versions.evaluated

    def validate(self, iteration: int) -> dict[str, float]:
        """Strict validation accuracy (ODE, fixed seeds) of the EMA and the raw weights; a sample grid.

        Keeps the best EMA so far in ``checkpoints/best`` (a run can pass its peak; the best is what
        a user ships).
        """
        section = self.config.eval
        with self.versions.evaluating() as evaluated:  # fsdp: the EMA gathered into the whole sampler
            result = self._evaluate(evaluated)
            columns = min(section.seeds_per_prompt, GRID_SEEDS)
            shown = [p * section.seeds_per_prompt + s for p in range(section.grid_prompts) for s in range(columns)]
            shown = [index for index in shown if index < len(result.prompts)]
            grid = self.run_dir / "samples" / f"iter-{iteration:05d}.png"
            save_grid(result.images[shown], [result.prompts[i] for i in shown], grid, columns=columns)
            if self.trackers is not None:
                self.trackers.image(iteration, "val/samples", grid, grid_caption(result, shown, columns))
            if result.score > self.best_accuracy:  # strict accuracy, or the mean of a reward without one
                self.best_accuracy = result.score
                replace_model(self.run_dir / "checkpoints" / "best", evaluated,
                              {"iteration": iteration, "val/strict_accuracy": self.best_accuracy})
        metrics = result.metrics()
        if section.raw_model and self.ema is not None:
            with self.versions.evaluating(raw=True) as raw:
                metrics.update(self._evaluate(raw).metrics(prefix="val_raw"))
        return metrics

    def _evaluate(self, model: LoopModel) -> Any:
        section = self.config.eval
        # sampled where the backend says (Ray: shared with the spot devices), the same bits as here;
        # the disaggregated backend's generators keep to training, so it validates on the trainer
        sampler = getattr(self.backend, "validation_samples", None)
        return evaluate(model, self.val_prompts, self.reward, section.seeds_per_prompt, section.num_steps,
                        self.config.rollout.shift, self.dataset.kind_of, rollout_plan(self.config), sampler,
                        self.held_out, section.select_by == "held_out")  # held_out: a reward it does not train on

    def run(self, on_iteration: Callable[[int, dict[str, Any]], None] | None = None,
            max_wall_s: float | None = None) -> RunSummary:
        """Train from the current iteration to ``config.iterations``; returns the history.

        Validate, then per iteration: `iteration`, log, validate and checkpoint when due; the backend
        is closed at the end (a Ray run's totals go to summary.json). With ``max_wall_s`` the run ends
        after the iteration that passes that wall time, validated and checkpointed like a last iteration; with
        ``eval.target_accuracy`` it also ends at the first validation that reaches it. ``time/wall_s``
        is the iterations' own wall time: validation (a measurement, 1,600 samples twice) and
        checkpoint writes are left out, so time to a target does not depend on how often one looks.
        """
        config = self.config
        metrics_file = (self.run_dir / "metrics.jsonl").open("a")
        wall_s = self.history[-1]["time/wall_s"] if self.history else 0.0
        try:
            if self.start_iteration == 0 and not self.history:  # (a run stopped at 0 has its validation)
                record = {"iteration": 0, "time/wall_s": 0.0, **self.validate(0)}
                self._log(metrics_file, record, on_iteration)
            for iteration in range(self.start_iteration, config.iterations):
                self.stop.check(iteration, self.run_dir, self.checkpoint)  # SIGTERM/SIGINT: save, end
                step_started = time.perf_counter()
                with self.stop.abandonable():  # past the grace, a stop signal's timer cuts the iteration
                    record = self.iteration(iteration)
                wall_s += time.perf_counter() - step_started
                record["time/wall_s"] = wall_s
                done = iteration + 1
                verdict = self.guard.observe(record)
                last = done == config.iterations or (max_wall_s is not None and record["time/wall_s"] >= max_wall_s)
                if verdict is not None:
                    record["guard/action"] = verdict.action
                    if verdict.action == "stop":  # the best model back in place before the final validation
                        self.act_on(verdict)
                        last = True
                if done % config.eval.every == 0 or last:
                    eval_started = time.perf_counter()
                    record.update(self.validate(done))
                    record["time/eval_s"] = time.perf_counter() - eval_started
                    target = config.eval.target_accuracy
                    last = last or (target is not None and record["val/strict_accuracy"] >= target)
                self._log(metrics_file, record, on_iteration)
                if verdict is not None and verdict.action != "stop":
                    self.act_on(verdict)
                if done % config.checkpoint_every == 0 or last:
                    self.checkpoint(done)
                if last:
                    break
        finally:
            try:
                metrics_file.close()
            except OSError:  # the failed write's bytes are still buffered; the error is already on its way
                pass
            try:
                if self.ranks is not None:
                    self.ranks.close()
                self.backend.close()  # a Ray run's totals (summary.json) are written now, for the trackers
                if self.trackers is not None:  # the final summary, then the trackers' runs closed
                    self.trackers.finish(final_summary(self.run_dir, self.history, self.stopped))
                    self.trackers.close()
            finally:
                self._lock.release()
        validation = validated(self.history)
        return RunSummary(run_dir=self.run_dir, history=self.history, validation=validation, stopped=self.stopped)

    def act_on(self, verdict: GuardVerdict) -> None:
        """Roll back to ``checkpoints/best``, or stop with it as the final model (`act_on_verdict`)."""
        act_on_verdict(self, verdict)

    def iteration(self, iteration: int) -> dict[str, Any]:
        """One iteration in every mode: seeds → rollout → reward, advantages → update → EMA. Its metrics (i + 1)."""
        config, backend = self.config, self.backend
        prompts = iteration_prompts(self.train_prompts, config.seed, iteration, config.rollout.prompts_per_iteration)
        backend.start_iteration(iteration)  # θ_old,i to every device that samples with it
        seeds = backend.choose_seeds(iteration, prompts, self.budget_s)  # random, or explored with θ_i / θ_{i-1}
        scored = self.rollout(iteration, prompts, seeds.seeds)  # G samples per prompt with θ_i, scored
        self.observe_plan(seeds, scored)
        backend.training_started(iteration, self.budget_s)  # spotlight: spot devices explore P_{i+1} with θ_i
        update = self.update(iteration, scored)  # θ_i → θ_{i+1}
        self.update_ema(iteration)  # and θ_old,i → θ_old,i+1
        usage = backend.training_ended(iteration)
        return {"iteration": iteration + 1, **scored.metrics, **seeds.metrics, **update, **usage}

    def rollout(self, iteration: int, prompts: list[str], seeds: torch.Tensor) -> Rollout | GroupStream:
        """The scored rollout: sampled and scored whole now, or (disaggregated) groups streamed to the update."""
        if self.config.mode.streams_groups:
            return self.backend.rollout_stream(iteration, prompts, seeds, self.optimizer)
        if self.ranks is not None:  # K ranks: each samples and scores its share of the groups (spotlight/ranks/)
            def here(part_prompts: list[str], part_seeds: torch.Tensor) -> tuple[Trajectory, RewardOutput]:
                samples = self.backend.rollout(iteration, part_prompts, part_seeds)  # with any spot devices
                return samples, score_share(self.model, part_prompts, part_seeds, samples, self.reward)

            trailing = pack_weights(self.sampler) if self.versions.ships_sampler else None
            samples, rewards = self.ranks.rollout(iteration, prompts, seeds, trailing, here)
            return score_rollout(self.model, prompts, seeds, samples, self.config, self.reward, rewards)
        started = time.perf_counter()
        samples = self.backend.rollout(iteration, prompts, seeds)  # on the CPU: sampling has finished
        sample_s = time.perf_counter() - started
        scored = score_rollout(self.model, prompts, seeds, samples, self.config, self.reward)  # reward → advantages
        scored.metrics["time/sample_s"] = sample_s
        return scored

    def observe_plan(self, seeds: Exploration, scored: Rollout | GroupStream) -> None:
        """Tell the planner the reward variance its plan's seeds gave (its bandit's reward), and how well its
        preview predicted their rollout rewards (`explore.fidelity`; logged as ``explore/preview_fidelity``)."""
        if seeds.plan is None:  # random seeds
            return
        if self.planner is not None:
            self.planner.observe_reward(seeds.plan, scored.metrics["rollout/group_reward_var"])
        rewards = getattr(scored, "rewards", None)  # a streamed rollout's groups are scored as they train
        if seeds.preview is not None and rewards is not None and seeds.preview.shape == rewards.shape:
            fidelity = preview_fidelity(seeds.preview, rewards)
            scored.metrics["explore/preview_fidelity"] = fidelity
            if self.planner is not None:
                self.planner.observe_fidelity(seeds.plan, fidelity)

    def update(self, iteration: int, scored: Rollout | GroupStream) -> dict[str, float]:
        """θ_i → θ_{i+1} on a scored rollout (θ_old,i kept as ``previous``); the update's metrics and time/train_s.

        ``previous`` holds the sampling policy that drew the rollout: NFT's ``v_old`` and, for stale
        exploration, the weights of the iteration before. The training time becomes the next
        exploration budget: what exploration hides behind.
        """
        section = self.config.train
        if self.trust.beta != section.nft_kl_beta:  # the adapted weight of the trust term
            section = section.model_copy(update={"nft_kl_beta": self.trust.beta})
        self.versions.hand_over()  # the sampling policy that drew this rollout is θ_old,i
        generator = iteration_generator(self.config.seed, iteration, Stream.UPDATE)
        if isinstance(scored, GroupStream):  # groups trained as they arrive; one optimizer step
            update = self.grouped.update(iteration, scored, scored.num_groups, rollout_plan(self.config), generator)
            self.budget_s = update["time/train_s"]
            return update
        started = time.perf_counter()

        def step(model: torch.nn.Module, share: Any) -> dict[str, float]:  # θ_old,i (previous) drew the rollout
            return rollout_update(model, self.previous, self.reference, self.optimizer, scored.batch, share, generator)

        if self.ranks is None:
            update = step(self.model, section)
        else:  # K ranks: each its share of every minibatch's rows, the gradients summed (spotlight/ranks/)
            update = self.ranks.update(iteration, scored.batch, step, section)  # θ_old,i: set by their rollout
        self.budget_s = time.perf_counter() - started
        if self.trust.target is not None:
            update["train/kl_beta"] = self.trust.beta
            self.trust.observe(update.get("train/kl"))
        return {**update, "time/train_s": self.budget_s}

    def update_ema(self, iteration: int) -> None:
        """Move the EMA (what validation samples) and a trailing sampling policy θ_old towards θ_{i+1}."""
        self.versions.after_update(iteration, self.config.train)

    def checkpoint(self, done: int) -> None:
        """Write the checkpoint after ``done`` iterations: weights, optimizer, EMA and the loop's state."""
        started = time.perf_counter()  # a stop signal keeps back twice this of its grace
        try:
            self.versions.save_checkpoint(self.run_dir, done, self.optimizer, {
                "monitor": self.monitor.state_dict(),
                "guard": self.guard.state_dict(), "trust": self.trust.state_dict(),
                "planner": None if self.planner is None else self.planner.state_dict(), "budget_s": self.budget_s,
                "backend": self.backend.state_dict()})
        except OSError as error:  # disk full, read-only: one line; the checkpoint before this one stays
            raise write_failed(self.run_dir / "checkpoints", error, self.run_dir) from error
        self.stop.observe_checkpoint(time.perf_counter() - started)

    def _log(self, metrics_file, record: dict[str, Any], on_iteration) -> None:
        self.history.append(record)
        try:
            metrics_file.write(json.dumps(record) + "\n")
            metrics_file.flush()
        except OSError as error:  # disk full, read-only: one line; the lines before this one stay
            raise write_failed(self.run_dir / "metrics.jsonl", error, self.run_dir) from error
        if self.trackers is not None:  # queued: the trackers' libraries run on their own thread
            self.trackers.log(record["iteration"], record)
        if on_iteration is not None:
            on_iteration(record["iteration"], record)


def train(config: TrainConfig, resume: bool = False, reward: Reward | None = None,
          on_iteration: Callable[[int, dict[str, Any]], None] | None = None) -> RunSummary:
    """Run ``spotlight train`` for a config: a thin wrapper for the CLI and tests.

    Modes spot-rollout and spotlight (and the others with ``runtime.use_ray``) sample on the Ray
    device pools (`spotlight.backends.ray`); the rest in this process. SIGTERM / SIGINT: a checkpoint, RunStopped.
    A CUDA run of a pipeline folder with ``train.micro_batch_size`` null takes the largest micro-batch its
    memory estimate fits; a CUDA out-of-memory error anywhere in the run ends it in one line (a `RunError`)
    that names the estimate and the knobs that lower it.
    """
    config = with_estimated_micro_batch(config)
    try:
        with pinned(config.device_core(0), config.num_threads):  # this process is the trainer's device
            return stoppable(config, lambda: Trainer(config, reward, resume),
                             lambda trainer: trainer.run(on_iteration, config.runtime.max_wall_s))
    except torch.cuda.OutOfMemoryError as error:
        raise RunError(out_of_memory_message(config, error)) from error
