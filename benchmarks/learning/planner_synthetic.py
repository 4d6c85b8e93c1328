"""Synthetic benchmark of the exploration planner against every fixed plan, with drifting arm values.

The world (all seeded, all documented here so the numbers can be judged):

- Plans: the planner's default grid, N ∈ {8, 16, 32, 64} candidates × S ∈ {2, 4, 8} steps,
  group size G = 8, P = 16 prompts per iteration.
- Value of a plan = expected within-group variance of the *true* rewards of the G seeds that
  the real `select_seeds` keeps when it ranks N candidates by an S-step preview. True rewards
  are N(0, σ²_t); the preview is ρ·r + sqrt(1-ρ²)·ε with fidelity ρ(S) = 1 - exp(-S / s0_t).
  The expected gain over random seeds, gain(N, ρ), is measured by Monte Carlo once at start-up
  (so more candidates help with diminishing returns, and unfaithful previews waste them).
- Drift: the policy's reward variance shrinks, σ²_t = 0.2 + 0.8·exp(-t / 60); and at rounds
  90-110 the policy sharpens so that few-step previews become unfaithful: s0 moves from 1.5 to
  6 steps. Early on the best plan is many candidates with 2 steps; later it needs more steps.
- Observation: the planner sees σ²_t·gain·LogNormal(0, 0.15) (the spread of a mean of P
  sample variances of G rewards) after the round.
- Cost: 0.05 device-seconds per candidate·step, times LogNormal(0, 0.1) per timing;
  predicted wall time = cost·N·S·P / devices.
- Budget: training time 60 s ± 10 % (uniform) per round, spot devices a random walk on 1..8.
- Regret is measured in gain units (value / σ²_t), so that late rounds, where all variances are
  small, count as much as early ones: per round, oracle gain - chosen gain, where the oracle
  knows the true values and true expected costs and picks the best plan that fits the budget.
- A plan whose true expected time exceeds the budget finishes late: that round gets random
  seeds (gain 1). Only the planner can overrun, since it plans on estimated costs.
- A fixed plan (N, S) that does not fit a round is clipped with true costs: the largest N with
  the same S that fits; if none, the cheapest plan that fits; if none, no exploration (gain 1,
  as for the oracle). This is a stronger baseline than "cheapest feasible".
- "fill budget" is a heuristic baseline: always the largest N·S that fits (ties: more steps).

Run: .venv/bin/python benchmarks/learning/planner_synthetic.py  (≈ 10-30 s on 2 cores)
Writes benchmarks/results/planner_synthetic.json and benchmarks/results/planner_regret.png.
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from spotlight.explore.planner import ExplorationPlanner, ExplorePlan, PlannerSection
from spotlight.explore.selection import select_seeds

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `benchmarks.*` imports

from benchmarks.provenance import RESULTS, git_commit, machine


@dataclass(frozen=True)
class World:
    rounds: int = 200
    seeds: int = 20
    group_size: int = 8
    num_prompts: int = 16
    cost_per_candidate_step_s: float = 0.05
    cost_noise: float = 0.1
    reward_noise: float = 0.15
    budget_s: float = 60.0
    budget_jitter: float = 0.1
    max_devices: int = 8
    fidelity_steps_early: float = 1.5
    fidelity_steps_late: float = 6.0
    shift_start: int = 90
    shift_end: int = 110
    variance_floor: float = 0.2
    variance_decay_rounds: float = 60.0
    gain_mc_prompts: int = 1000


def preview_gain_table(world: World, ns: list[int], rhos: np.ndarray) -> np.ndarray:
    """gain[n, k] = E[var of true rewards of the kept seeds] / E[var of G random seeds], (len(ns), len(rhos)).

    Uses the real selection code on Monte Carlo prompts; common random numbers across ρ keep the
    curve smooth in ρ.
    """
    generator = torch.Generator().manual_seed(1234)
    group = world.group_size
    random_variance = (group - 1) / group  # E[population variance of G standard normals]
    table = np.ones((len(ns), len(rhos)))
    for i, n in enumerate(ns):
        if n == group:
            continue  # every candidate is kept: no selection, no gain
        true_rewards = torch.randn(world.gain_mc_prompts, n, generator=generator, dtype=torch.float64)
        preview_noise = torch.randn(world.gain_mc_prompts, n, generator=generator, dtype=torch.float64)
        seeds = torch.zeros(world.gain_mc_prompts, n, dtype=torch.int64)
        for k, rho in enumerate(rhos):
            preview = rho * true_rewards + math.sqrt(max(0.0, 1 - rho**2)) * preview_noise
            kept = select_seeds(preview, seeds, group, generator).indices
            realised = torch.gather(true_rewards, 1, kept).var(dim=1, unbiased=False).mean().item()
            table[i, k] = realised / random_variance
    return table


class Truth:
    """True per-round plan values and costs of one seeded world."""

    def __init__(self, world: World, arms: list[ExplorePlan], seed: int, gain: np.ndarray, rhos: np.ndarray):
        rng = np.random.default_rng(seed)
        self.world = world
        t = np.arange(world.rounds)
        self.policy_variance = world.variance_floor + (1 - world.variance_floor) * np.exp(
            -t / world.variance_decay_rounds
        )
        ramp = np.clip((t - world.shift_start) / (world.shift_end - world.shift_start), 0.0, 1.0)
        fidelity_steps = world.fidelity_steps_early + ramp * (
            world.fidelity_steps_late - world.fidelity_steps_early
        )
        ns = sorted({a.num_candidates for a in arms})
        self.gain = np.empty((world.rounds, len(arms)))  # value / σ²_t
        for a, arm in enumerate(arms):
            rho = 1 - np.exp(-arm.num_steps / fidelity_steps)
            self.gain[:, a] = np.interp(rho, rhos, gain[ns.index(arm.num_candidates)])
        self.budget = world.budget_s * (1 + world.budget_jitter * rng.uniform(-1, 1, world.rounds))
        devices = np.empty(world.rounds, dtype=int)
        devices[0] = world.max_devices // 2
        for r in range(1, world.rounds):
            devices[r] = np.clip(devices[r - 1] + rng.choice([-1, 0, 0, 1]), 1, world.max_devices)
        self.devices = devices
        candidate_steps = np.array([a.candidate_steps for a in arms])
        self.time = (
            world.cost_per_candidate_step_s * candidate_steps[None, :] * world.num_prompts / devices[:, None]
        )
        self.fits = self.time <= self.budget[:, None]
        self.oracle_gain = np.where(self.fits, self.gain, 1.0).max(axis=1)  # 1.0: no plan fits
        self.reward_noise = rng.lognormal(0.0, world.reward_noise, (world.rounds, len(arms)))
        self.cost_noise = rng.lognormal(0.0, world.cost_noise, (world.rounds, len(arms)))


def clipped_fixed_arm(arms: list[ExplorePlan], fits: np.ndarray, wanted: int) -> int | None:
    """The fixed plan's choice in one round: itself, else the largest fitting N with its S, else
    the cheapest fitting plan, else None (no exploration)."""
    if fits[wanted]:
        return wanted
    same_steps = [a for a in range(len(arms)) if fits[a] and arms[a].num_steps == arms[wanted].num_steps]
    if same_steps:
        return max(same_steps, key=lambda a: arms[a].num_candidates)
    fitting = [a for a in range(len(arms)) if fits[a]]
    return min(fitting, key=lambda a: arms[a].candidate_steps) if fitting else None


def fill_budget_arm(arms: list[ExplorePlan], fits: np.ndarray) -> int | None:
    fitting = [a for a in range(len(arms)) if fits[a]]
    return max(fitting, key=lambda a: (arms[a].candidate_steps, arms[a].num_steps)) if fitting else None


def run_planner(truth: Truth, arms: list[ExplorePlan], config: PlannerSection) -> tuple[np.ndarray, dict]:
    """Per-round regret of the planner in one world, (rounds,), and counts of what happened."""
    world = truth.world
    planner = ExplorationPlanner(config)
    index = {arm: a for a, arm in enumerate(arms)}
    regret = np.zeros(world.rounds)
    overruns = skipped = 0
    for r in range(world.rounds):
        decision = planner.choose(float(truth.budget[r]), int(truth.devices[r]), world.num_prompts)
        if decision.plan is None:
            skipped += 1
            regret[r] = truth.oracle_gain[r] - 1.0
            continue
        a = index[decision.plan]
        late = not truth.fits[r, a]
        overruns += late
        gain = 1.0 if late else truth.gain[r, a]
        regret[r] = truth.oracle_gain[r] - gain
        device_seconds = truth.time[r, a] * truth.devices[r] * truth.cost_noise[r, a]
        planner.observe_cost(
            decision.plan,
            device_seconds,
            decision.plan.num_candidates * world.num_prompts,
            decision.plan.num_steps,
        )
        planner.observe_reward(decision.plan, truth.policy_variance[r] * gain * truth.reward_noise[r, a])
    return regret, {"overruns": overruns, "no_exploration_rounds": skipped}


def run_rule(truth: Truth, choice) -> np.ndarray:
    regret = np.zeros(truth.world.rounds)
    for r in range(truth.world.rounds):
        a = choice(truth.fits[r])
        regret[r] = truth.oracle_gain[r] - (1.0 if a is None else truth.gain[r, a])
    return regret



def main() -> None:
    torch.set_num_threads(1)
    started = time.perf_counter()
    world = World()
    config = PlannerSection()
    planner_arms = ExplorationPlanner(config).arms
    ns = sorted(set(config.num_candidates))
    rhos = np.linspace(0.0, 1.0, 11)
    gain = preview_gain_table(world, ns, rhos)

    # ablations: what the frontier pruning and the discounting each contribute
    variants = {
        "planner": {},
        "planner, no frontier": {"monotone": False},
        "planner, no discount": {"discount": 1.0},
    }
    fixed_names = [f"fixed N={a.num_candidates} S={a.num_steps}" for a in planner_arms]
    names = [*variants, "fill budget", *fixed_names]
    regrets = {name: np.zeros((world.seeds, world.rounds)) for name in names}
    events = {"overruns": 0, "no_exploration_rounds": 0}
    oracle_mean_gain = []
    for seed in range(world.seeds):
        truth = Truth(world, planner_arms, seed, gain, rhos)
        oracle_mean_gain.append(truth.oracle_gain.mean())
        for name, update in variants.items():
            seeded = config.model_copy(update={**update, "seed": seed})
            regrets[name][seed], counts = run_planner(truth, planner_arms, seeded)
            if name == "planner":
                for key in events:
                    events[key] += counts[key]
        regrets["fill budget"][seed] = run_rule(truth, lambda fits: fill_budget_arm(planner_arms, fits))
        for a, name in enumerate(fixed_names):
            regrets[name][seed] = run_rule(truth, lambda fits, a=a: clipped_fixed_arm(planner_arms, fits, a))

    table = []
    for name in names:
        total = regrets[name].sum(axis=1)  # cumulative regret per seed
        halves = regrets[name].reshape(world.seeds, 2, -1).sum(axis=2).mean(axis=0)
        table.append(
            {
                "policy": name,
                "cumulative_regret_mean": float(total.mean()),
                "cumulative_regret_se": float(total.std(ddof=1) / math.sqrt(world.seeds)),
                "first_half": float(halves[0]),
                "second_half": float(halves[1]),
            }
        )
    table.sort(key=lambda row: row["cumulative_regret_mean"])
    best_fixed = next(row["policy"] for row in table if row["policy"].startswith("fixed"))
    paired = regrets["planner"].sum(axis=1) - regrets[best_fixed].sum(axis=1)  # same worlds, per seed
    versus_best_fixed = {
        "best_fixed": best_fixed,
        "regret_difference_mean": float(paired.mean()),
        "regret_difference_se": float(paired.std(ddof=1) / math.sqrt(world.seeds)),
        "seeds_planner_better": int((paired < 0).sum()),
    }
    elapsed = time.perf_counter() - started

    print(f"cumulative regret over {world.rounds} rounds, mean ± s.e. over {world.seeds} seeds (gain units)")
    print(f"oracle mean gain per round {np.mean(oracle_mean_gain):.3f} (random seeds = 1)")
    print(f"{'policy':<22}{'regret':>16}{'rounds 1-100':>14}{'101-200':>10}")
    for row in table:
        regret = f"{row['cumulative_regret_mean']:.2f} ± {row['cumulative_regret_se']:.2f}"
        print(f"{row['policy']:<22}{regret:>16}{row['first_half']:>14.2f}{row['second_half']:>10.2f}")
    print(
        f"planner - {best_fixed}: {paired.mean():+.2f} ± {versus_best_fixed['regret_difference_se']:.2f} "
        f"(paired), planner better in {versus_best_fixed['seeds_planner_better']}/{world.seeds} seeds"
    )
    print(
        f"planner: {events['overruns']} overrun rounds, {events['no_exploration_rounds']} rounds without "
        f"exploration, over {world.seeds * world.rounds} rounds; {elapsed:.1f} s"
    )

    RESULTS.mkdir(parents=True, exist_ok=True)
    payload = {
        "benchmark": "planner_synthetic",
        "commit": git_commit(),
        "machine": machine(),
        "world": asdict(world),
        "planner_config": config.model_dump(mode="json"),
        "ablations": variants,
        "gain_table": {"num_candidates": ns, "fidelity": rhos.tolist(), "gain": gain.tolist()},
        "oracle_mean_gain": float(np.mean(oracle_mean_gain)),
        "results": table,
        "planner_vs_best_fixed": versus_best_fixed,
        "planner_events": events,
        "elapsed_s": elapsed,
    }
    (RESULTS / "planner_synthetic.json").write_text(json.dumps(payload, indent=2) + "\n")
    plot(regrets, table, world, RESULTS / "planner_regret.png")


def plot(regrets: dict[str, np.ndarray], table: list[dict], world: World, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    best_fixed = [row["policy"] for row in table if row["policy"].startswith("fixed")][:3]
    for name, curves in regrets.items():
        mean = curves.cumsum(axis=1).mean(axis=0)
        if name == "planner":
            ax.plot(mean, color="black", linewidth=2.5, label=name)
        elif name.startswith("planner"):
            style = ":" if "frontier" in name else "-."
            ax.plot(mean, color="black", linestyle=style, linewidth=1.2, label=name)
        elif name == "fill budget":
            same = [
                other
                for other in regrets
                if other.startswith("fixed") and np.array_equal(regrets[other], curves)
            ]
            label = f"{name} (= {', '.join(same)})" if same else name
            ax.plot(mean, color="tab:red", linestyle="--", zorder=5, label=label)
        elif name in best_fixed:
            ax.plot(mean, linewidth=1.5, label=name)
        else:
            ax.plot(mean, color="grey", alpha=0.35, linewidth=0.8)
    ax.plot([], [], color="grey", alpha=0.35, label="other fixed plans")
    ax.axvspan(world.shift_start, world.shift_end, color="gold", alpha=0.2, label="previews lose fidelity")
    ax.set_xlabel("round")
    ax.set_ylabel("cumulative regret (gain units, mean over seeds)")
    ax.set_title("Exploration planner vs fixed plans (synthetic, drifting)")
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
