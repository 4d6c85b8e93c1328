"""The exploration planner: a bandit over plans (N candidates, S steps) under a time budget.

Each iteration the planner picks how hard to explore for the next prompts: more candidates N
give the variance-maximising selection more to choose from, more steps S make the cheap preview
rank seeds more faithfully, and both cost time on the spot devices, which must finish inside the
training time of the current iteration. The pay-off (the realised within-group reward variance)
is only seen after the next rollout, is noisy, and drifts as the policy learns.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from spotlight.explore.planner_section import PlannerSection, Sampler

__all__ = ["Decision", "ExplorationPlanner", "ExplorePlan", "PlannerSection", "plan_grid", "round_budget"]



@dataclass(frozen=True, order=True)
class ExplorePlan:
    """One arm: score `num_candidates` seeds per prompt with `num_steps` steps of `sampler`."""

    num_candidates: int
    num_steps: int
    sampler: Sampler = "sde"

    def __post_init__(self) -> None:
        if self.num_candidates < 1:
            raise ValueError(f"ExplorePlan.num_candidates must be >= 1 (got {self.num_candidates})")
        if self.num_steps < 1:
            raise ValueError(f"ExplorePlan.num_steps must be >= 1 (got {self.num_steps})")
        if self.sampler not in ("sde", "ode"):
            raise ValueError(f"ExplorePlan.sampler must be 'sde' or 'ode' (got {self.sampler!r})")

    @property
    def candidate_steps(self) -> int:
        """Denoising steps per prompt, N·S: the unit the cost model is linear in."""
        return self.num_candidates * self.num_steps


def plan_grid(ns: Iterable[int], ss: Iterable[int], sampler: Sampler = "sde") -> list[ExplorePlan]:
    """Every (N, S) pair as an ExplorePlan, N-major in the given order; a list of len(ns)·len(ss)."""
    return [ExplorePlan(n, s, sampler) for n, s in itertools.product(ns, ss)]


@dataclass(frozen=True)
class Decision:
    """What the planner chose for one round.

    plan: the arm to run, or None for "no exploration this round, use random seeds" (nothing fits).
    predicted_time_s: predicted wall time of the plan on the given devices (NaN while calibrating).
    feasible_arms: the arms predicted to fit the budget; scores: the UCB score of each arm the
    rule considered (the feasible arms not dominated by another feasible arm, see `monotone`).
    calibrating: True when no timing was known yet and the cheapest arm is run to measure one.
    unfaithful_steps: preview depths S left out this round because their measured fidelity fell short.
    """

    plan: ExplorePlan | None
    predicted_time_s: float
    feasible_arms: tuple[ExplorePlan, ...]
    scores: dict[ExplorePlan, float]
    calibrating: bool = False
    unfaithful_steps: tuple[int, ...] = ()


class ExplorationPlanner:
    """Discounted UCB over exploration plans, restricted to the plans that fit the time budget.

    Rule (Garivier & Moulines' discounted UCB). After each observed reward every arm's count and
    sum are multiplied by γ = `discount`, so an observation k rounds old weighs γ^k. For arm a
    with discounted count n_a and mean m_a of normalised rewards, over feasible arms:

        score_a = m_a + c · sqrt(log(max(e, Σ_b n_b)) / n_a) - λ · predicted_time_a / budget

    and an arm never observed (n_a = 0) scores +inf, so each fitting arm is tried once. Ties are
    broken at random by the planner's seeded generator, so runs are deterministic.

    Monotone structure (`monotone`, on by default). More candidates give the selection a superset
    to choose from and more steps give a more faithful preview, so a plan's value does not
    decrease in N or in S. With λ = 0 a feasible plan dominated by another feasible plan (N' ≥ N
    and S' ≥ S) can never be the better choice, so only the non-dominated feasible plans - at
    most one per S - are scored. This turns a bandit over the whole grid into one over the
    budget frontier (2-3 arms in practice), which is what makes 20-200 rounds enough. With λ > 0
    a dominated plan is cheaper, so every feasible plan is scored.

    Why this rule for a drifting signal and 20-200 rounds: the realised variance shrinks as the
    policy learns and the best plan moves (a sharper policy needs more steps for a faithful
    preview). Discounting keeps a window of about 1/(1-γ) rounds (20 at γ = 0.95): old evidence
    fades, so an arm's confidence interval re-opens and it gets re-tried, without the hard cut-off
    of a sliding window; and the whole state is O(arms) numbers for the checkpoint. UCB rather
    than Thompson sampling because its exploration is a deterministic function of the counts,
    which makes few-round behaviour easy to reason about and to test.

    Normalisation. A raw observation v is turned into y = 2v / (v + s) = 1 + tanh(½·log(v/s)),
    where s is the discounted mean of the previous raw observations (same γ). y lies in [0, 2]
    (the bounded reward UCB assumes), is 1 for an average round and is symmetric in log(v/s).
    Dividing by a running scale removes the common shrinkage of all arms' variance as the policy
    learns, which would otherwise make arms tried early look better than arms tried late.
    The cost term is the predicted time as a fraction of the budget, in [0, 1] for feasible arms,
    so λ = `cost_weight` in [0, 1] says how much of an average round's normalised variance a full
    budget is worth; λ = 0 spends the budget freely (it is paid for either way).

    Feasibility. predicted_time = u_a · N · S · num_prompts / num_devices, where u_a is the arm's
    seconds per candidate·step: an EMA (weight `cost_smoothing`) of its measured timings, or for
    an unmeasured arm the pooled EMA over all timings (the linear model in N·S through the origin),
    or before any timing `prior_cost_per_candidate_step_s`. An arm is feasible when
    predicted_time ≤ `budget_fraction` · budget; the fraction leaves slack for timing noise.
    If no arm fits, the decision is plan=None (no exploration, random seeds), never a plan past
    the budget. With no prior and no timing yet, the cheapest arm is run once to calibrate
    (`Decision.calibrating`); pass a prior or call observe_cost with a calibration timing to avoid
    that.

    Preview fidelity (`observe_fidelity`, `spotlight.explore.fidelity`). How well an S-step preview
    predicts the rollout's rewards of the seeds it chose is a property of S, measured every round
    without extra work, and far less noisy than the variance it costs. A depth whose discounted
    fidelity is below `min_fidelity_ratio` × the best measured depth's is left out of the feasible
    arms (unless nothing else fits): its rounds would choose seeds by noise. Unmeasured depths stay
    in, so each is tried; discounting (γ) lets a left-out depth back in when the others' fidelity falls.
    So the grid is cut to the depths that predict, by measurement, on each model and reward.
    """

    def __init__(self, config: PlannerSection | None = None) -> None:
        self.config = config if config is not None else PlannerSection()
        self.arms = plan_grid(self.config.num_candidates, self.config.num_steps, self.config.sampler)
        self._arm_index = {arm: i for i, arm in enumerate(self.arms)}
        num_arms = len(self.arms)
        self._counts = np.zeros(num_arms)  # discounted number of observations per arm
        self._sums = np.zeros(num_arms)  # discounted sum of normalised rewards per arm
        self._scale_sum = 0.0  # discounted sum and weight of raw rewards, for the running scale
        self._scale_weight = 0.0
        self._arm_cost = np.full(num_arms, np.nan)  # EMA seconds per candidate·step, NaN = unmeasured
        self._pooled_cost = math.nan
        num_depths = len(self.config.num_steps)
        self._fidelity_sums = np.zeros(num_depths)  # discounted sum and weight of fidelity per preview depth S
        self._fidelity_weights = np.zeros(num_depths)
        self._rng = np.random.default_rng(self.config.seed)

    # --- cost model -------------------------------------------------------------------------
    def cost_per_candidate_step(self, plan: ExplorePlan) -> float:
        """Estimated seconds per candidate·step for `plan` (NaN when nothing is known yet)."""
        index = self._index(plan)
        if not math.isnan(self._arm_cost[index]):
            return float(self._arm_cost[index])
        if not math.isnan(self._pooled_cost):
            return self._pooled_cost
        prior = self.config.prior_cost_per_candidate_step_s
        return math.nan if prior is None else prior

    def predicted_time(self, plan: ExplorePlan, num_devices: int, num_prompts: int) -> float:
        """Predicted wall seconds to explore `num_prompts` prompts with `plan` on `num_devices`."""
        return self.cost_per_candidate_step(plan) * plan.candidate_steps * num_prompts / num_devices

    def observe_cost(
        self, plan: ExplorePlan, seconds: float, num_candidates_run: int, num_steps: int
    ) -> None:
        """Record a timing: `seconds` of device time (summed over devices) spent denoising
        `num_candidates_run` candidates (over all prompts) for `num_steps` steps each."""
        if not (math.isfinite(seconds) and seconds > 0):
            raise ValueError(
                f"observe_cost: seconds must be a positive number of device-seconds (got {seconds})"
            )
        if num_candidates_run < 1 or num_steps < 1:
            raise ValueError(
                f"observe_cost: num_candidates_run and num_steps must be >= 1 "
                f"(got {num_candidates_run}, {num_steps})"
            )
        index = self._index(plan)
        per_unit = seconds / (num_candidates_run * num_steps)
        alpha = self.config.cost_smoothing
        old = self._arm_cost[index]
        self._arm_cost[index] = per_unit if math.isnan(old) else (1 - alpha) * old + alpha * per_unit
        old = self._pooled_cost
        self._pooled_cost = per_unit if math.isnan(old) else (1 - alpha) * old + alpha * per_unit

    def observe_prior(self, seconds_per_candidate_step: float) -> None:
        """A measured cost before any exploration was timed: it sizes the first round instead of a calibration run.

        The runtime passes the trainer's own sampling of its rollout share (same device kind, same
        model, per sample·step). Without it the first round ran the cheapest arm to calibrate, and a
        calibration round cut at the exploration wait left the cost unknown, so the next round
        calibrated (and overran) again. Ignored once any exploration has been timed.
        """
        if math.isfinite(seconds_per_candidate_step) and seconds_per_candidate_step > 0 \
                and math.isnan(self._pooled_cost):
            self._pooled_cost = float(seconds_per_candidate_step)

    # --- preview fidelity ----------------------------------------------------------------------
    def observe_fidelity(self, plan: ExplorePlan, fidelity: float) -> bool:
        """Record how well ``plan``'s preview predicted the rollout rewards of the seeds it chose (a
        correlation in [-1, 1]); returns False, changing nothing, for NaN (no prompt's rollout varied)."""
        self._index(plan)
        if not math.isfinite(fidelity):
            return False
        depth = self.config.num_steps.index(plan.num_steps)
        gamma = self.config.discount
        self._fidelity_sums *= gamma
        self._fidelity_weights *= gamma
        self._fidelity_sums[depth] += float(np.clip(fidelity, -1.0, 1.0))
        self._fidelity_weights[depth] += 1.0
        return True

    def fidelity(self) -> dict[int, float]:
        """Discounted mean fidelity per preview depth S (NaN where none was measured)."""
        return {steps: float(total / weight) if weight > 0 else math.nan
                for steps, total, weight in zip(self.config.num_steps, self._fidelity_sums, self._fidelity_weights,
                                                strict=True)}

    def unfaithful_steps(self) -> tuple[int, ...]:
        """The preview depths whose measured fidelity is below `min_fidelity_ratio` × the best depth's."""
        measured = {steps: value for steps, value in self.fidelity().items() if not math.isnan(value)}
        best = max(measured.values(), default=math.nan)
        if not best > 0:  # nothing measured, or no depth predicts at all: nothing to prefer
            return ()
        return tuple(steps for steps, value in measured.items() if value < self.config.min_fidelity_ratio * best)

    # --- the bandit ---------------------------------------------------------------------------
    def choose(self, budget_s: float, num_devices: int, num_prompts: int) -> Decision:
        """Pick the plan for the next exploration round (see the class docstring for the rule).

        budget_s: wall seconds the exploration may take (the training time it hides behind);
        num_devices: spot devices available now; num_prompts: prompts to explore.
        """
        if not (math.isfinite(budget_s) and budget_s >= 0):
            raise ValueError(f"choose: budget_s must be a finite number of seconds >= 0 (got {budget_s})")
        if num_devices < 0:
            raise ValueError(f"choose: num_devices must be >= 0 (got {num_devices})")
        if num_prompts < 1:
            raise ValueError(f"choose: num_prompts must be >= 1 (got {num_prompts})")
        if num_devices == 0 or budget_s == 0:
            return Decision(plan=None, predicted_time_s=0.0, feasible_arms=(), scores={})
        if math.isnan(self.cost_per_candidate_step(self.arms[0])):
            cheapest = min(self.arms, key=lambda arm: (arm.candidate_steps, arm.num_candidates))
            return Decision(cheapest, math.nan, (), {}, calibrating=True)

        limit = self.config.budget_fraction * budget_s
        times = {arm: self.predicted_time(arm, num_devices, num_prompts) for arm in self.arms}
        feasible = tuple(arm for arm in self.arms if times[arm] <= limit)
        if not feasible:
            return Decision(plan=None, predicted_time_s=0.0, feasible_arms=(), scores={})
        unfaithful = self.unfaithful_steps()
        faithful = tuple(arm for arm in feasible if arm.num_steps not in unfaithful)
        feasible = faithful or feasible  # a shallow preview is better than none when only it fits
        candidates = feasible
        if self.config.monotone and self.config.cost_weight == 0:
            candidates = tuple(
                arm for arm in feasible if not any(_dominates(other, arm) for other in feasible)
            )

        total = float(self._counts.sum())
        log_total = math.log(max(math.e, total))
        scores: dict[ExplorePlan, float] = {}
        for arm in candidates:
            index = self._arm_index[arm]
            count = self._counts[index]
            if count <= 0:
                scores[arm] = math.inf
                continue
            mean = self._sums[index] / count
            bonus = self.config.exploration * math.sqrt(log_total / count)
            scores[arm] = mean + bonus - self.config.cost_weight * times[arm] / budget_s
        best = max(scores.values())
        tied = [arm for arm in candidates if scores[arm] == best]
        plan = tied[int(self._rng.integers(len(tied)))] if len(tied) > 1 else tied[0]
        return Decision(plan, times[plan], feasible, scores, unfaithful_steps=unfaithful)

    def observe_reward(self, plan: ExplorePlan, realised_group_variance: float) -> bool:
        """Credit `plan` with the mean within-group reward variance of the rollout that used its
        seeds. Returns False (and changes nothing) for a NaN/inf/negative value, e.g. when every
        reward of that rollout failed, so one bad rollout cannot poison the estimates."""
        index = self._index(plan)
        value = float(realised_group_variance)
        if not math.isfinite(value) or value < 0:
            return False
        gamma = self.config.discount
        scale = self._scale_sum / self._scale_weight if self._scale_weight > 0 else value
        normalised = 1.0 if value + scale == 0 else 2.0 * value / (value + scale)
        self._counts *= gamma
        self._sums *= gamma
        self._counts[index] += 1.0
        self._sums[index] += normalised
        self._scale_sum = gamma * self._scale_sum + value
        self._scale_weight = gamma * self._scale_weight + 1.0
        return True

    def estimates(self) -> dict[ExplorePlan, tuple[float, float]]:
        """Per arm: (discounted count, mean normalised reward; NaN if never observed)."""
        return {
            arm: (float(c), float(s / c) if c > 0 else math.nan)
            for arm, c, s in zip(self.arms, self._counts, self._sums, strict=True)
        }

    # --- checkpoints ----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Plain-data (JSON-able) state: statistics, cost model and the tie-breaking RNG."""
        return {
            "arms": [[a.num_candidates, a.num_steps, a.sampler] for a in self.arms],
            "counts": self._counts.tolist(),
            "sums": self._sums.tolist(),
            "scale_sum": self._scale_sum,
            "scale_weight": self._scale_weight,
            "arm_cost": [None if math.isnan(c) else float(c) for c in self._arm_cost],
            "pooled_cost": None if math.isnan(self._pooled_cost) else self._pooled_cost,
            "fidelity_sums": self._fidelity_sums.tolist(),
            "fidelity_weights": self._fidelity_weights.tolist(),
            "rng": self._rng.bit_generator.state,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what state_dict() returned; the plan grid must match this planner's config."""
        arms = [ExplorePlan(int(n), int(s), sampler) for n, s, sampler in state["arms"]]
        if arms != self.arms:
            raise ValueError(
                "planner checkpoint was saved with a different plan grid "
                f"({[(a.num_candidates, a.num_steps) for a in arms]}) than the config "
                f"({[(a.num_candidates, a.num_steps) for a in self.arms]}); use the same "
                "planner.num_candidates / num_steps / sampler to resume"
            )
        self._counts = np.array(state["counts"], dtype=np.float64)
        self._sums = np.array(state["sums"], dtype=np.float64)
        self._scale_sum = float(state["scale_sum"])
        self._scale_weight = float(state["scale_weight"])
        self._arm_cost = np.array([math.nan if c is None else c for c in state["arm_cost"]], dtype=np.float64)
        self._pooled_cost = math.nan if state["pooled_cost"] is None else float(state["pooled_cost"])
        if "fidelity_sums" in state:  # checkpoints written before preview fidelity start it unmeasured
            self._fidelity_sums = np.array(state["fidelity_sums"], dtype=np.float64)
            self._fidelity_weights = np.array(state["fidelity_weights"], dtype=np.float64)
        self._rng = np.random.default_rng()
        self._rng.bit_generator.state = state["rng"]

    def _index(self, plan: ExplorePlan) -> int:
        index = self._arm_index.get(plan)
        if index is None:
            raise ValueError(
                f"plan {plan} is not in the planner's grid (N in {list(self.config.num_candidates)}, "
                f"S in {list(self.config.num_steps)}, sampler {self.config.sampler!r})"
            )
        return index


def round_budget(
    planner: ExplorationPlanner, budget_s: float, num_devices: int, monitor: tuple[ExplorePlan, int] | None
) -> float:
    """Return the seconds a round may spend on its own candidates: `budget_s` less the planner's
    predicted time for the staleness monitor's re-score riding in the same round.

    monitor: (the previous round's plan, how many of its prompts are re-scored), or None. The
    monitor's work shares the devices and the training time, so the planner must size the round to
    what is left (never below 0). The runtime (`RayBackend._open_round`) and the simulator both call this.
    """
    if monitor is None or num_devices == 0:
        return budget_s
    plan, num_prompts = monitor
    return max(0.0, budget_s - planner.predicted_time(plan, num_devices, num_prompts))


def _dominates(a: ExplorePlan, b: ExplorePlan) -> bool:
    """a explores at least as hard as b in both N and S (and is a different plan)."""
    return a != b and a.num_candidates >= b.num_candidates and a.num_steps >= b.num_steps
