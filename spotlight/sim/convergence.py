"""How GRPO's learning signal turns into iterations: the signal a seed choice yields, and its pay-off.

Two halves of one model, both needed to replay exploration at a scale where no image is drawn.

1. `SignalModel`: the mean within-group reward std of a rollout, given how its seeds were chosen.
   Each prompt p has a difficulty logit μ_p ~ N(m + g·progress, s_p²) and each candidate seed j a
   logit x_pj = μ_p + u_pj, u_pj ~ N(0, s_u²); its rollout reward is sigmoid(k·x_pj). A preview with
   S of the rollout's T steps, or with the stale weights θ_i, sees x_pj + e_pj, e_pj Gaussian and
   independent of u. Assumptions, each a `SignalSection` field: logits are Gaussian (a reward that is
   a smooth function of a latent seed quality), previews are unbiased, and preview errors of steps
   and staleness add independently. Their sizes are given as the Kendall τ between preview and
   rollout rankings of one prompt's seeds — the quantity the staleness monitor measures — because
   for jointly Gaussian logits τ = (2/π)·arcsin ρ, so ρ = sin(π τ / 2) and the error variance is
   s_u²·(1/ρ² − 1). The step error scales as (1/S − 1/T) / (1 − 1/T): all of the one-step error at
   S = 1, none at S = T, where the preview with fresh weights IS the rollout sample (DESIGN.md).
   Seeds are then chosen by the runtime's own `select_seeds` on the preview rewards; the realised
   std is that of the chosen seeds' rollout rewards. Random seeds (vanilla) are the first G
   candidates of the same draw, so explored and random std share their randomness.

2. `ConvergenceModel`: iterations to the target as a function of the mean within-group reward
   std σ, iterations = I_ref · (σ / σ_ref)^(−α), fitted by least squares in log space from
   measured (σ, iterations) runs (`fit_convergence`, `load_measured_points`).
   Why this form: GRPO learns only from reward differences inside a group — a group whose rewards
   are all equal contributes zero gradient — and with unnormalised advantages r − mean the policy
   gradient is linear in the rewards' spread, so progress per iteration ∝ σ (α = 1). Normalised
   advantages, clipping and saturation bend that, so α is fitted rather than fixed. A power law is
   the one-parameter family that does not depend on the reward's units (rescaling σ rescales I_ref
   only), and it is a straight line in log space, so two distinct stds already determine it. With
   one point, or all points at one std, α cannot be identified: the fit falls back to α = 1 and
   says so (`alpha_assumed`).
   The simulator uses the law as a rate: iteration i advances a fraction
   (σ_i / σ_random,i)^α / I_vanilla of the way to the target, where σ_random,i is what random seeds
   would have given at the same state and I_vanilla the iterations vanilla GRPO needs (an input:
   the measured task's I_ref does not transfer to Qwen-Image). With σ constant this is exactly the
   power law; vanilla takes exactly I_vanilla iterations; only α carries over from the measured runs.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from pydantic import Field

from spotlight.explore.planner import ExplorePlan
from spotlight.explore.selection import select_seeds
from spotlight.schema import Section

__all__ = [
    "ConvergenceSection",
    "ConvergenceModel",
    "GroupSignal",
    "MeasuredPoint",
    "SignalSection",
    "SignalModel",
    "fit_convergence",
    "load_measured_points",
    "resolve_convergence",
]


# ---------------------------------------------------------------------------------------------
# The signal a seed choice yields


class SignalSection(Section):
    """The synthetic reward landscape of the signal model (assumptions; see the module docstring).

    Logit units: a seed logit std of 1 with sharpness 1 gives rewards spread like sigmoid(N(0, 1)).
    `logit_gain_at_target` is how far the mean prompt logit has risen when the target is reached:
    rewards saturate as the policy learns, so every group's std — explored or not — shrinks, the
    drift the planner must track.
    """

    prompt_logit_mean: float = 0.0
    prompt_logit_std: float = Field(1.5, ge=0)
    seed_logit_std: float = Field(1.0, gt=0)
    reward_sharpness: float = Field(1.0, gt=0)
    logit_gain_at_target: float = 1.5
    one_step_kendall_tau: float = Field(0.3, gt=0, le=1)
    stale_kendall_tau: float = Field(0.8, gt=0, le=1)


@dataclass(frozen=True)
class GroupSignal:
    """The signal of one rollout of P groups of G samples.

    group_std, group_variance: means over prompts of the within-group population std / variance of
    the rollout rewards with the seeds actually used; random_std: the same with random seeds;
    explored_variance: mean variance over the explored prompts only (NaN when none was explored),
    which is what the plan that chose them is credited with.
    """

    group_std: float
    group_variance: float
    random_std: float
    explored_variance: float


def _kendall_to_error_variance(tau: float, seed_variance: float) -> float:
    """Return the preview error variance whose Gaussian rank agreement with the truth is Kendall τ."""
    rho = math.sin(math.pi * tau / 2.0)
    return seed_variance * (1.0 / rho**2 - 1.0)


class SignalModel:
    """Draws rollout signals: candidate rewards, previews, `select_seeds`, realised group std.

    One generator, seeded once, so a simulation is reproducible; each `draw` consumes the same
    amount of randomness for the same shapes.
    """

    def __init__(self, config: SignalSection, rollout_steps: int, seed: int) -> None:
        self.config = config
        self.rollout_steps = rollout_steps
        self._rng = np.random.default_rng(seed)
        self._torch_generator = torch.Generator().manual_seed(seed)
        seed_variance = config.seed_logit_std**2
        self._one_step_error_var = _kendall_to_error_variance(config.one_step_kendall_tau, seed_variance)
        self._stale_error_var = _kendall_to_error_variance(config.stale_kendall_tau, seed_variance)

    def preview_error_std(self, num_steps: int, stale: bool) -> float:
        """Return the std of a preview's logit error with `num_steps` steps (and stale weights if `stale`)."""
        steps = self.rollout_steps
        fraction = 0.0 if steps == 1 else max(0.0, 1.0 / num_steps - 1.0 / steps) / (1.0 - 1.0 / steps)
        variance = self._one_step_error_var * fraction + (self._stale_error_var if stale else 0.0)
        return math.sqrt(variance)

    def draw(
        self,
        progress: float,
        num_prompts: int,
        group_size: int,
        plan: ExplorePlan | None,
        explored_prompts: int,
        stale: bool,
    ) -> GroupSignal:
        """Return the GroupSignal of one rollout whose first `explored_prompts` prompts used `plan`.

        progress ∈ [0, ∞): fraction of the way to the target (shifts the prompt logits);
        plan None or explored_prompts 0 means random seeds for every prompt.
        """
        cfg = self.config
        num_candidates = plan.num_candidates if plan is not None else group_size
        if num_candidates < group_size:
            raise ValueError(
                f"plan {plan} has fewer candidates than the group size {group_size}; "
                "list planner.num_candidates values >= loop.group_size"
            )
        explored = min(max(explored_prompts, 0), num_prompts) if plan is not None else 0
        mean = cfg.prompt_logit_mean + cfg.logit_gain_at_target * min(progress, 1.0)
        prompt_logits = self._rng.normal(mean, cfg.prompt_logit_std, size=(num_prompts, 1))
        logits = prompt_logits + self._rng.normal(0.0, cfg.seed_logit_std, size=(num_prompts, num_candidates))
        rewards = _sigmoid(cfg.reward_sharpness * logits)
        random_groups = rewards[:, :group_size]
        used = random_groups.copy()
        explored_variance = math.nan
        if explored > 0:
            error_std = self.preview_error_std(plan.num_steps, stale)
            preview_logits = logits[:explored] + self._rng.normal(0.0, 1.0, size=(explored, num_candidates)) * error_std
            preview = torch.from_numpy(_sigmoid(cfg.reward_sharpness * preview_logits))
            seeds = torch.arange(explored * num_candidates, dtype=torch.int64).reshape(explored, num_candidates)
            chosen = select_seeds(preview, seeds, group_size, self._torch_generator).indices.numpy()
            used[:explored] = np.take_along_axis(rewards[:explored], chosen, axis=1)
            explored_variance = float(used[:explored].var(axis=1).mean())
        return GroupSignal(
            group_std=float(used.std(axis=1).mean()),
            group_variance=float(used.var(axis=1).mean()),
            random_std=float(random_groups.std(axis=1).mean()),
            explored_variance=explored_variance,
        )


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))  # = 1 / (1 + e^-x), without overflow for large |x|


# ---------------------------------------------------------------------------------------------
# Iterations to target as a function of the signal


class MeasuredPoint(NamedTuple):
    """One measured run: its mean within-group reward std and the iterations it took to the target."""

    group_reward_std: float
    iterations_to_target: float
    mode: str = ""


@dataclass(frozen=True)
class ConvergenceModel:
    """iterations_to_target(σ) = reference_iterations · (σ / reference_std)^(−alpha).

    alpha_assumed: True when the data could not identify alpha and 1 was used; num_points: the
    finite points fitted; dropped: points left out (a run that never reached the target has no
    iteration count, and a std ≤ 0 has no logarithm); r_squared: of the log-space fit (NaN with
    fewer than 3 points or alpha assumed).
    """

    alpha: float
    reference_std: float
    reference_iterations: float
    alpha_assumed: bool = False
    num_points: int = 0
    dropped: int = 0
    r_squared: float = math.nan

    def iterations_to_target(self, group_reward_std: float) -> float:
        """Return the predicted iterations to the target at a constant mean group std (> 0)."""
        if not group_reward_std > 0:
            return math.inf
        return self.reference_iterations * (group_reward_std / self.reference_std) ** (-self.alpha)

    def speedup(self, group_reward_std: float, baseline_std: float) -> float:
        """Return baseline iterations / iterations: (σ / σ_baseline)^alpha; 1 when both are 0."""
        if baseline_std <= 0:
            return 1.0 if group_reward_std <= 0 else math.inf
        return (group_reward_std / baseline_std) ** self.alpha


def fit_convergence(points: Iterable[tuple[float, float] | MeasuredPoint]) -> ConvergenceModel:
    """Return the power law fitted to (group_reward_std, iterations_to_target) points in log space.

    Ordinary least squares of log I on log σ; alpha is minus the slope, and the reference point is
    the fitted line at the geometric mean std. Non-finite and non-positive points are dropped and
    counted. One point, or points at a single std: alpha = 1 (assumed, flagged) through the
    geometric means. Raises ValueError when no usable point is left.
    """
    usable: list[tuple[float, float]] = []
    dropped = 0
    for point in points:
        std, iterations = float(point[0]), float(point[1])
        if math.isfinite(std) and math.isfinite(iterations) and std > 0 and iterations > 0:
            usable.append((std, iterations))
        else:
            dropped += 1
    if not usable:
        raise ValueError(
            f"fit_convergence: no usable point ({dropped} dropped: a run that never reached the target, "
            "or a std <= 0); measure at least one run that reaches the target"
        )
    log_std = np.log([std for std, _ in usable])
    log_iterations = np.log([iterations for _, iterations in usable])
    centre_std, centre_iterations = float(log_std.mean()), float(log_iterations.mean())
    spread = log_std - centre_std
    if len(usable) < 2 or float(np.sum(spread**2)) < 1e-12:
        return ConvergenceModel(
            alpha=1.0,
            reference_std=math.exp(centre_std),
            reference_iterations=math.exp(centre_iterations),
            alpha_assumed=True,
            num_points=len(usable),
            dropped=dropped,
        )
    slope = float(np.sum(spread * (log_iterations - centre_iterations)) / np.sum(spread**2))
    r_squared = math.nan
    if len(usable) >= 3:
        residual = log_iterations - (centre_iterations + slope * spread)
        total = float(np.sum((log_iterations - centre_iterations) ** 2))
        r_squared = 1.0 - float(np.sum(residual**2)) / total if total > 0 else 1.0
    return ConvergenceModel(
        alpha=-slope,
        reference_std=math.exp(centre_std),
        reference_iterations=math.exp(centre_iterations),
        num_points=len(usable),
        dropped=dropped,
        r_squared=r_squared,
    )


def load_measured_points(path: str | os.PathLike[str]) -> list[MeasuredPoint]:
    """Return one MeasuredPoint per run from a `time_to_target.json` (or `exploration_convergence.json`) result.

    The format: {"modes": {mode: {"group_reward_std": {"values": [...]}, "iterations_to_target":
    {"values": [...]}}}}, the two lists in the same run order. A run that never reached the target
    is kept with iterations inf (the fit drops it). Raises ValueError naming the file and the key.
    """
    path = Path(path)
    try:
        payload = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(
            f"{path}: no such file; run `python benchmarks/learning/time_to_target.py` (from the repository root) "
            "to measure it"
        ) from None
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: not valid JSON ({error.msg} at line {error.lineno})") from None
    modes = payload.get("modes") if isinstance(payload, dict) else None
    if not isinstance(modes, dict) or not modes:
        raise ValueError(f"{path}: expected a top-level 'modes' mapping of per-mode results")
    points: list[MeasuredPoint] = []
    for mode, entry in modes.items():
        try:
            stds = entry["group_reward_std"]["values"]
            iterations = entry["iterations_to_target"]["values"]
        except (KeyError, TypeError):
            raise ValueError(
                f"{path}: modes.{mode} needs group_reward_std.values and iterations_to_target.values lists"
            ) from None
        if len(stds) != len(iterations):
            raise ValueError(
                f"{path}: modes.{mode}: {len(stds)} group_reward_std values but {len(iterations)} "
                "iterations_to_target values; they must be one per run, in the same order"
            )
        points.extend(MeasuredPoint(float(s), float(i), mode) for s, i in zip(stds, iterations, strict=True))
    return points


class ConvergenceSection(Section):
    """Where the simulator's convergence law comes from.

    alpha: the exponent, if given; else fitted from `measured` (a time_to_target.json; relative to the cwd)
    if given; else 1 (assumption: progress ∝ reward spread, see the module docstring).
    vanilla_iterations: iterations vanilla GRPO needs to reach the target on the simulated
    workload (an input; 100 is an assumption, not a measurement).
    """

    alpha: float | None = Field(None, ge=0)
    measured: str | None = None
    vanilla_iterations: float = Field(100.0, gt=0)


def resolve_convergence(config: ConvergenceSection) -> tuple[float, str]:
    """Return (alpha, where it came from) for a ConvergenceSection, fitting the measured file if needed."""
    if config.alpha is not None:
        return config.alpha, "given"
    if config.measured is not None:
        model = fit_convergence(load_measured_points(config.measured))
        if model.alpha_assumed:
            return 1.0, f"assumed 1 ({config.measured} has {model.num_points} usable point(s) at one std)"
        return model.alpha, f"fitted to {model.num_points} runs in {config.measured} (R² {model.r_squared:.2f})"
    return 1.0, "assumed 1 (no measured runs given)"
