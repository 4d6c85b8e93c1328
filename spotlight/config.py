"""Run configuration: typed, validated, loaded from YAML with errors that name the field.

A run is fully described by its config and seed. Every section has defaults that run on a 2-core
CPU, so ``spotlight train`` with no config is the embedded default task.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, PrivateAttr, field_validator, model_validator

from spotlight.components.guard_section import GuardSection
from spotlight.cores import check_cores, unpinned_cores
from spotlight.data.section import DataSection
from spotlight.disagg.section import DisaggSection
from spotlight.explore.planner_section import PlannerSection
from spotlight.models.policy_section import PolicySection
from spotlight.modes import Mode
from spotlight.ranks.section import TrainerSection, ranks_problem
from spotlight.rewards.section import RewardSection
from spotlight.runtime.section import RuntimeSection

# re-exported: the config error, the section base and the YAML reading live in spotlight.schema
from spotlight.schema import ConfigError, Section, dump_config, load_config, parse_config  # noqa: F401
from spotlight.tasks import TaskName
from spotlight.tracking.section import LogSection


class TinyDiTSection(Section):
    """TinyDiT architecture (used by ``pretrain``; ``train`` takes it from the base checkpoint)."""

    image_size: int = Field(32, ge=8)
    image_width: int | None = Field(None, ge=8)  # None: square; the OCR task's lines are 32 x 128
    patch_size: int = Field(8, ge=1)
    dim: int = Field(192, ge=16)
    depth: int = Field(4, ge=1)
    num_heads: int = Field(4, ge=1)
    mlp_ratio: float = Field(4.0, gt=0)
    max_text_len: int = Field(12, ge=2)


class RolloutSection(Section):
    """How samples are drawn for GRPO: groups of ``group_size`` SDE samples per prompt."""

    prompts_per_iteration: int = Field(16, ge=1)
    group_size: int = Field(8, ge=2)
    num_steps: int = Field(10, ge=1)
    shift: float = Field(3.0, gt=0)  # SD3's shift: more steps at high noise, where layout is decided
    noise_level: float = Field(0.7, ge=0)
    # SDE noise only on the first sde_steps steps, ODE after (null: every step). Measured on the shapes
    # base model: the noise of the last two of 10 steps decides a third of a group's reward variance,
    # pixel luck the policy cannot learn from, and halves strict accuracy against ODE sampling.
    sde_steps: int | None = Field(6, ge=1)
    # sde or ode; null: the update's own (flow-grpo needs SDE steps' log-probs, nft takes ODE samples,
    # whose only randomness is the initial latent, so a seed names the sample and exploration ranks it)
    sampler: Literal["sde", "ode"] | None = None
    # model.pretrained only: image size in pixels (one int: square; [h, w]); null: the pipeline's default
    resolution: int | tuple[int, int] | None = None
    # a video pipeline folder (Wan) only: frames per sample (num_frames - 1 a multiple of its VAE's temporal
    # scale); null: the pipeline's 81. Latents, noise, seeds and exploration are per video
    num_frames: int | None = Field(None, ge=1)
    # classifier-free guidance (1: off) against negative_prompt, in sampling, exploration and Flow-GRPO's
    # log-probs (nft trains the conditional velocity, CFG-free, as DiffusionNFT does); a guidance-distilled
    # FLUX takes it as its guidance input. Pipelines only: the tiny families have no unconditional prompt
    guidance_scale: float = Field(1.0, ge=1.0)
    # a two-expert Wan2.2 folder only: the low-noise expert's steps' scale (WanPipeline's guidance_scale_2);
    # null: guidance_scale for both experts
    guidance_scale_2: float | None = Field(None, ge=1.0)
    negative_prompt: str = ""
    # rows per sampling forward: the rollout's videos/images are sampled in chunks of this many (true CFG doubles
    # each forward's batch). Bounds the sampling memory; every process that samples rollout rows chunks alike, so
    # a sample is the same bits whoever draws it (a row's bits depend on its batch): change it and samples change
    sample_batch: int = Field(256, ge=1)

    @property
    def resolution_hw(self) -> tuple[int, int] | None:
        """``resolution`` as (height, width), or None."""
        if self.resolution is None or isinstance(self.resolution, tuple):
            return self.resolution
        return (self.resolution, self.resolution)


class TrainSection(Section):
    """The policy update: Flow-GRPO on the reverse process, or NFT on the forward process."""

    # flow-grpo: clipped policy gradient on the SDE steps' log-probs (needs rollout.sampler sde);
    # nft: DiffusionNFT's flow matching towards a group's better samples and away from its worse
    # (spotlight/rl/nft.py), any sampler
    algorithm: Literal["flow-grpo", "nft"] = "nft"

    # adamw steps every weight by about the learning rate whatever its gradient's signal; sgd steps
    # along the policy gradient itself, which moves the trained steps' log-probs far more than the
    # rest (measured: 4:1 for sgd, 1:7 for adamw on the shapes base model)
    optimizer: Literal["adamw", "sgd"] = "adamw"
    learning_rate: float = Field(1e-4, gt=0)
    momentum: float = Field(0.9, ge=0, lt=1)  # sgd only
    weight_decay: float = Field(0.0, ge=0)
    grad_clip: float = Field(1.0, gt=0)
    # flow-grpo: the log-prob is a mean over every pixel, so a ratio moves ~1e-4 per update (the
    # reference's clip range); 0.2 never clipped anything
    clip_range: float = Field(1e-4, gt=0)
    kl_beta: float = Field(0.004, ge=0)
    adv_std: Literal["group", "global"] = "group"
    adv_clip: float = Field(5.0, gt=0)
    # of the rollout's SDE steps (rollout.sde_steps); measured on the shapes base model, each of SDE
    # steps 3-5 decides as much reward variance as steps 0-2 together, so the default trains them all
    timestep_fraction: float = Field(1.0, gt=0, le=1)
    timestep_selection: Literal["random", "early"] = "early"  # which ceil(fraction * K) steps are trained
    # nft, measured on the shapes base model (one core, lr 1e-4): 2 passes x 4 minibatches (8 steps per
    # rollout) reached +0.13 validation strict accuracy in 6.6 min where 1 x 2 reached +0.03; NFT's loss
    # keeps the policy near the sampling policy, so a rollout bears several steps
    num_minibatches: int = Field(4, ge=1)
    num_epochs: int = Field(2, ge=1)  # nft only
    nft_beta: float = Field(1.0, gt=0)  # nft: how far the implicit policies sit from the sampling policy
    nft_timesteps: int = Field(2, ge=1)  # nft: noise levels drawn per sample per pass
    nft_adv_scale: float = Field(2.0, gt=0)  # nft: advantage (in group stds) that counts as fully positive
    # warmed up as min(decay, (1 + i) / (10 + i)): a fixed 0.95 from iteration 0 kept the EMA near the
    # base model for the first ~40 iterations and hid what the raw model did
    ema_decay: float | None = Field(0.95, ge=0, lt=1)
    # rows per forward/backward inside a minibatch (null: the whole minibatch): memory for a large model
    # at a high resolution; the optimizer step is the minibatch's either way (spotlight/rl/micro_batch.py)
    micro_batch_size: int | None = Field(None, ge=1)
    # The sampling policy θ_old (rollouts, exploration, NFT's v_old, Flow-GRPO's old log-probs) follows the
    # trained θ as θ_old ← d θ_old + (1 - d) θ after every update, d ramped linearly from 0 to
    # old_policy_decay over old_policy_warmup iterations (DiffusionNFT's soft update). 0: θ_old = θ_i,
    # the update before issue 21, which collapsed after ~100 iterations (docs/learning.md).
    # Measured (docs/learning.md, benchmarks/learning/long_run.py): 0.5 over 20 iterations with nft_kl_beta 0.01.
    old_policy_decay: float = Field(0.5, ge=0, lt=1)
    old_policy_warmup: int = Field(20, ge=0)
    # nft: weight of ||v - v_ref||² towards the frozen base (v_ref), a trust term on the whole walk;
    # 0.1 held the shapes runs' NFT loss at its base level and slowed learning (docs/learning.md)
    nft_kl_beta: float = Field(0.01, ge=0)
    # nft: the distance ||v - v_ref||² to hold: the trust term's weight doubles while an update's distance
    # is over 1.5x this and halves (to nft_kl_beta) under it / 1.5 (spotlight/rl/kl_control.py); null: fixed
    nft_kl_target: float | None = Field(None, gt=0)
    # nft: uniform (the squared velocity error) | adaptive (DiffusionNFT's: each term's x0 error
    # normalised by its own size, spotlight/rl/nft.py), docs/learning.md "The stable update"
    nft_weighting: Literal["uniform", "adaptive"] = "uniform"

    @model_validator(mode="after")
    def _trust_target_needs_a_trust_term(self) -> TrainSection:
        if self.nft_kl_target is not None and self.nft_kl_beta == 0:
            raise ValueError("train.nft_kl_target adapts the trust term, which train.nft_kl_beta=0 turns off: "
                             "set nft_kl_beta > 0 (its floor, e.g. 0.01) or nft_kl_target to null")
        return self


class ExploreSection(Section):
    """Seed exploration: N candidate seeds per prompt, S cheap steps, keep the G most varied.

    With ``planner`` set, the bandit planner picks (N, S) from its grid every iteration within the
    budget of the previous iteration's training time (what exploration on spot devices hides behind);
    otherwise the fixed plan (num_candidates, num_steps) runs.
    """

    num_candidates: int = Field(16, ge=2)
    num_steps: int = Field(7, ge=1)  # < rollout.num_steps: the rollout's first steps, then one ODE jump
    sampler: Literal["sde", "ode"] = "sde"
    staleness_floor: float = Field(0.3, ge=-1, le=1)
    monitor_prompts: int = Field(4, ge=0)
    # the staleness monitor re-scores every monitor_every-th round: it shares the round's devices and
    # budget (4 of 16 prompts: a fifth of the round), which candidates need more than a τ each round
    monitor_every: int = Field(4, ge=1)
    planner: PlannerSection | None = None
    initial_budget_s: float = Field(5.0, gt=0)

    def monitored_prompts(self, round_index: int, num_prompts: int) -> int:
        """How many of a round's ``num_prompts`` prompts the staleness monitor re-scores (0 off its rounds)."""
        return 0 if round_index % self.monitor_every else min(self.monitor_prompts, num_prompts)


class EvalSection(Section):
    """Validation: strict accuracy of ODE samples at fixed seeds on the validation prompts."""

    every: int = Field(20, ge=1)
    # 80 validation prompts x 20 seeds = 1,600 samples: a binomial standard error of 0.011 at 25-35%
    seeds_per_prompt: int = Field(20, ge=1)
    # validate on this many of the validation prompts, spread evenly over the list (null: all of them): a
    # quick look at a large prompt set; the standard error in the metrics counts the samples it scored
    prompts: int | None = Field(None, ge=1)
    raw_model: bool = True  # also validate the raw weights, not only the EMA (logged as val_raw/...)
    target_accuracy: float | None = Field(None, ge=0, le=1)  # end the run at the first validation reaching it
    num_steps: int = Field(10, ge=1)
    grid_prompts: int = Field(8, ge=1)
    # a reward the run does not train on, scored on the same validation images (val/held_out_reward): a watch
    # on reward hacking (train on PickScore, watch HPS); select_by held_out picks checkpoints/best by it
    held_out_reward: RewardSection | None = None
    select_by: Literal["score", "held_out"] = "score"

    @model_validator(mode="after")
    def _held_out_to_select_by(self) -> EvalSection:
        if self.select_by == "held_out" and self.held_out_reward is None:
            raise ValueError("eval.select_by held_out picks the best model by eval.held_out_reward: set it "
                             "(e.g. eval.held_out_reward.name=hps), or select_by score")
        return self


class TrainConfig(Section):
    """Everything ``spotlight train`` needs."""

    seed: int = 0
    mode: Mode = Mode.SPOTLIGHT
    task: TaskName = "shapes"  # prompts, split and reward; must match the base model's task
    iterations: int = Field(200, ge=1)
    base_checkpoint: str = "shapes-base"
    run_dir: str = "runs/train"
    num_threads: int = Field(2, ge=1)  # when pin_devices is false
    # One device = one core (spotlight/cores.py): the trainer / on-demand device runs on the
    # first of device_cores with one thread, spot device k of a local cluster on the (k+2)-th (cycling
    # over the rest; with trainer.devices K, trainer rank r on the (r+1)-th and spot devices after the K
    # ranks' cores). null: this machine's cores in order. Attach mode pins only the trainer.
    pin_devices: bool = True
    device_cores: list[int] | None = Field(None, min_length=1)
    # Ray's control plane of a local cluster (GCS, raylets, the queue actor) on cores no device uses, so at
    # 1 + N it takes no time from the devices; needs device_cores. null: the spot devices' cores.
    control_cores: list[int] | None = Field(None, min_length=1)
    checkpoint_every: int = Field(10, ge=1)
    rollout: RolloutSection = RolloutSection()
    train: TrainSection = TrainSection()
    trainer: TrainerSection = TrainerSection()  # K trainer ranks (spotlight/ranks/): DDP or FSDP2
    explore: ExploreSection = ExploreSection()
    reward: RewardSection = RewardSection()
    eval: EvalSection = EvalSection()
    guard: GuardSection = GuardSection()  # what the loop does when a run is dying (spotlight/components/guard.py)
    runtime: RuntimeSection = RuntimeSection()
    model: PolicySection = PolicySection()  # tinydit (base_checkpoint) or a tiny diffusers family with LoRA
    data: DataSection = DataSection()  # the prompts: a dataset folder or shipped set; null: the task's
    disagg: DisaggSection = DisaggSection()  # mode disaggregated's switches (spotlight/disagg/section.py)
    log: LogSection = LogSection()  # experiment trackers besides metrics.jsonl (spotlight/tracking/)
    # where the policy runs (the trainer's and every device's; noise is drawn on the CPU, then moved) and
    # the dtype of a diffusers policy's frozen parts (LoRA and fully fine-tuned weights stay float32)
    device: Literal["cpu", "cuda"] = "cpu"
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    # the cores the config was loaded on (before the trainer pinned itself to one): `_device_core_list`
    _cores: list[int] = PrivateAttr(default_factory=unpinned_cores)

    def _device_core_list(self) -> list[int]:
        """``device_cores``, or this machine's cores as they were when the config was loaded.

        Not the calling process's mask now: the trainer pins itself to one core before it starts the
        spot devices and Ray, so a mask read then hides every other core.
        """
        return self.device_cores if self.device_cores is not None else self._cores

    def device_core(self, device: int) -> int | None:
        """The core of device ``device`` (0: the trainer / on-demand device, k + 1: spot device k); None: unpinned.

        A CUDA trainer is never pinned: its device is the GPU, and one core with one thread would starve
        what still runs on the host beside it (kernel launches, the VAE's and the reward's host work).
        """
        if not self.pin_devices or (device == 0 and self.device == "cuda"):
            return None
        cores = self._device_core_list()
        if device == 0:
            return cores[0]
        spare = cores[self.trainer.devices:] or cores[1:]  # no core left past the ranks': share theirs but rank 0's
        return spare[(device - 1) % len(spare)] if spare else None

    def rank_core(self, rank: int) -> int | None:
        """The core of trainer rank ``rank`` (0: the trainer / on-demand device itself); None: unpinned (CUDA too)."""
        if not self.pin_devices or self.device == "cuda":
            return None
        return self._device_core_list()[rank]

    def control_plane_cores(self) -> list[int] | None:
        """Where a local cluster's Ray processes (GCS, raylets, queue actor) run (`cores.spawning_on`):
        ``control_cores``, else every device core but the trainer's, which is the trainer's alone (None:
        unpinned or none left)."""
        if not self.pin_devices:
            return None
        if self.control_cores is not None:
            return list(self.control_cores)
        cores = self._device_core_list()
        rest = [core for core in cores if core != cores[0]]
        return rest or None

    @field_validator("run_dir")
    @classmethod
    def _run_dir_is_not_a_file(cls, run_dir: str) -> str:
        # checked at load: the CLI opens RUN_DIR/spotlight.log before anything else runs
        if Path(run_dir).exists() and not Path(run_dir).is_dir():
            raise ValueError(f"{run_dir} is a file, not a directory: set run_dir to a directory path")
        return run_dir

    @model_validator(mode="before")
    @classmethod
    def _reward_on_the_policy_device(cls, data: Any) -> Any:
        """reward.device null: the policy's device, so a CUDA run's reward models score on its GPU."""
        if not isinstance(data, dict):
            return data
        reward, device = data.get("reward"), data.get("device", "cpu")
        if not isinstance(device, str):  # refused by `device` itself, once
            return data
        if isinstance(reward, RewardSection) and reward.device is None:
            return {**data, "reward": reward.model_copy(update={"device": device})}
        if reward is None or (isinstance(reward, dict) and reward.get("device") is None):
            return {**data, "reward": {**(reward or {}), "device": device}}
        return data

    @model_validator(mode="after")
    def _cores_exist(self) -> TrainConfig:
        if self.pin_devices and self.device_cores is not None:
            check_cores(self.device_cores)
        if self.pin_devices and self.control_cores is not None:
            check_cores(self.control_cores, "control_cores")
            if self.device_cores is None:
                raise ValueError(f"control_cores {self.control_cores} needs device_cores: give the devices' cores "
                                 "too, so Ray's control plane can be kept off them")
            shared = sorted(set(self.control_cores) & set(self.device_cores))
            if shared:
                raise ValueError(f"control_cores {self.control_cores} shares core(s) {shared} with device_cores "
                                 f"{self.device_cores}: Ray's control plane goes on cores no device uses; give "
                                 "disjoint lists, or control_cores null")
        return self
    @model_validator(mode="after")
    def _ranks_fit(self) -> TrainConfig:
        problem = ranks_problem(self)  # K ranks: cores, and what the loop cannot yet run on K (ranks/section.py)
        if problem is not None:
            raise ValueError(problem)
        return self

    @property
    def uses_ray(self) -> bool:
        """Whether the run goes on the Ray runtime: always for spot-rollout / spotlight, else with runtime.use_ray."""
        return self.runtime.runs_on_ray(self.mode)

    @property
    def rollout_sampler(self) -> Literal["sde", "ode"]:
        """The rollout's sampler: ``rollout.sampler``, or the update's own (SDE for flow-grpo, ODE for nft)."""
        if self.rollout.sampler is not None:
            return self.rollout.sampler
        return "sde" if self.train.algorithm == "flow-grpo" else "ode"

    @model_validator(mode="after")
    def _grpo_has_log_probs(self) -> TrainConfig:
        if self.train.algorithm == "flow-grpo" and self.rollout_sampler == "ode":
            raise ValueError("train.algorithm flow-grpo trains the log-probs of SDE steps: set rollout.sampler "
                             "to sde (or null), or train.algorithm to nft")
        return self

    @model_validator(mode="after")
    def _explore_covers_group(self) -> TrainConfig:
        planner = self.explore.planner
        explores = self.mode.explores
        on_ray = self.uses_ray  # the runtime always plans (N, S)
        if explores and planner is not None and min(planner.num_candidates) < self.rollout.group_size:
            raise ValueError(
                f"explore.planner.num_candidates must all be >= rollout.group_size "
                f"({min(planner.num_candidates)} < {self.rollout.group_size})"
            )
        runtime_min = min(self.runtime.planner.num_candidates)
        if explores and on_ray and planner is None and runtime_min < self.rollout.group_size:
            raise ValueError(
                f"runtime.planner.num_candidates must all be >= rollout.group_size "
                f"({min(self.runtime.planner.num_candidates)} < {self.rollout.group_size}); or set explore.planner"
            )
        if explores and not on_ray and self.explore.num_candidates < self.rollout.group_size:
            raise ValueError(
                f"explore.num_candidates must be >= rollout.group_size "
                f"({self.explore.num_candidates} < {self.rollout.group_size})"
            )
        return self

    @model_validator(mode="after")
    def _disaggregated_takes_one_step_per_batch(self) -> TrainConfig:
        if self.mode is not Mode.DISAGGREGATED:
            return self
        if self.train.num_epochs != 1 or self.train.num_minibatches != 1:
            raise ValueError(
                f"mode disaggregated takes one optimizer step per logical batch (GAP equals the one-shot update "
                f"only then): set train.num_epochs=1 and train.num_minibatches=1 (got {self.train.num_epochs} and "
                f"{self.train.num_minibatches})")
        if self.train.old_policy_decay > 0 or self.train.nft_kl_beta > 0:
            raise ValueError(
                "mode disaggregated trains the policy its generators sample (θ_old = θ_i) and has no base reference: "
                "set train.old_policy_decay=0 and train.nft_kl_beta=0 (configs/disaggregated.yaml does)")
        if self.explore.planner is not None or self.runtime.sp_degree > 1 or self.runtime.address is not None:
            raise ValueError("mode disaggregated runs on a local cluster with its own exploration (disagg.explore): "
                             "set explore.planner null, runtime.sp_degree 1 and runtime.address null")
        if self.disagg.explore and self.disagg.async_one_step:
            raise ValueError("disagg.explore fills the generators' idle time, which async_one_step leaves none of: "
                             "turn one of them off")
        if self.disagg.explore and self.disagg.explore_candidates < self.rollout.group_size:
            raise ValueError(f"disagg.explore_candidates must be >= rollout.group_size "
                             f"({self.disagg.explore_candidates} < {self.rollout.group_size})")
        return self

    @model_validator(mode="after")
    def _sp_serves_exploration(self) -> TrainConfig:
        on_ray = self.uses_ray
        if self.runtime.sp_degree > 1 and not (on_ray and self.mode.explores and self.mode.rents_spot):
            raise ValueError(
                f"runtime.sp_degree={self.runtime.sp_degree}: SP groups serve exploration only, on the Ray runtime; "
                f"use mode spotlight or sync-explore ({self.mode}{'' if on_ray else ' without Ray'}); or sp_degree 1"
            )
        if self.runtime.sp_degree > 1 and self.runtime.address is not None:
            raise ValueError(
                f"runtime.sp_degree={self.runtime.sp_degree} runs on the local cluster only for now (runtime.address "
                f"null, got {self.runtime.address!r}); or set sp_degree 1"
            )
        return self


class PretrainConfig(Section):
    """Everything ``spotlight pretrain`` needs: flow matching on rendered (prompt, image) pairs."""

    seed: int = 0
    task: TaskName = "shapes"  # what to render and tokenize (spotlight.task_presets)
    init_checkpoint: str | None = None  # continue from this model's weights (fresh optimizer); None: from scratch
    steps: int = Field(6000, ge=1)
    batch_size: int = Field(64, ge=1)
    learning_rate: float = Field(3e-4, gt=0)
    warmup_steps: int = Field(200, ge=0)
    weight_decay: float = Field(0.0, ge=0)
    ema_decay: float = Field(0.999, ge=0, lt=1)
    sigma_sampling: Literal["uniform", "logit_normal"] = "uniform"
    layout_lattice: int | None = Field(8, ge=4)
    storage_dtype: Literal["float32", "float16"] = "float16"
    out_dir: str = "runs/pretrain"
    num_threads: int = Field(2, ge=1)
    eval_every: int = Field(1000, ge=1)
    model: TinyDiTSection = TinyDiTSection()
    eval: EvalSection = EvalSection()
