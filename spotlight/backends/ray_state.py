"""What the Ray backend carries from one iteration to the next, and how it goes into a checkpoint as JSON.

A finished exploration round (`Explored`: the seeds it chose for the next iteration) and the staleness
monitor's pending re-score (`PendingMonitor`) come from requests done with θ_i, which a resumed run no
longer has, so `RayBackend.state_dict` keeps them rather than requesting them again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from spotlight.explore.planner import ExplorePlan
from spotlight.loop.seed_choice import Exploration
from spotlight.runtime.queue.rounds import Round

__all__ = ["Explored", "PendingMonitor", "explored_from_state", "explored_state", "monitor_from_state",
           "monitor_state"]


@dataclass
class PendingMonitor:
    """The first prompts of the last round, to re-score with the weights one update later (staleness)."""

    target: int  # the iteration the stale round explored for
    plan: ExplorePlan
    prompts: list[str]
    candidates: torch.Tensor  # (M, N)
    stale_rewards: torch.Tensor  # (M, N), scored with θ_{target-1}
    stale_seeds: torch.Tensor  # (M, G), selected from them
    ids: list[str]


@dataclass
class Explored:
    """A finished round, ready to seed its iteration."""

    round: Round
    exploration: Exploration


def _plan_state(plan: ExplorePlan) -> dict[str, Any]:
    return {"num_candidates": plan.num_candidates, "num_steps": plan.num_steps, "sampler": plan.sampler}


def explored_state(explored: Explored) -> dict[str, Any]:
    """A finished round's outcome as JSON (seeds exact as integers, rewards as floats, NaN included)."""
    round_, chosen = explored.round, explored.exploration
    return {"target": round_.target, "version": round_.version, "plan": _plan_state(round_.plan),
            "prompts": round_.prompts, "candidates": round_.candidates.tolist(),
            "plan_metrics": round_.plan_metrics, "seeds": chosen.seeds.tolist(), "metrics": chosen.metrics,
            "preview": None if chosen.preview is None else chosen.preview.tolist()}


def explored_from_state(state: dict[str, Any]) -> Explored:
    """The `Explored` that `explored_state` wrote, ready to seed its iteration (its requests are done and freed)."""
    plan = ExplorePlan(**state["plan"])
    round_ = Round(state["target"], state["version"], plan, state["prompts"], torch.tensor(state["candidates"]),
                   ids=[], drained=True, plan_metrics=state["plan_metrics"])
    preview = state.get("preview")  # absent from checkpoints written before preview fidelity
    return Explored(round_, Exploration(torch.tensor(state["seeds"]), dict(state["metrics"]), plan,
                                        None if preview is None else torch.tensor(preview, dtype=torch.float64)))


def monitor_state(monitor: PendingMonitor) -> dict[str, Any]:
    """The staleness monitor's pending re-score as JSON (its requests go out with the next round)."""
    return {"target": monitor.target, "plan": _plan_state(monitor.plan), "prompts": monitor.prompts,
            "candidates": monitor.candidates.tolist(), "stale_rewards": monitor.stale_rewards.tolist(),
            "stale_seeds": monitor.stale_seeds.tolist(),
            "rewards_dtype": str(monitor.stale_rewards.dtype).removeprefix("torch.")}


def monitor_from_state(state: dict[str, Any]) -> PendingMonitor:
    """The `PendingMonitor` that `monitor_state` wrote; the rewards keep their dtype and bits."""
    rewards = torch.tensor(state["stale_rewards"], dtype=getattr(torch, state["rewards_dtype"]))
    return PendingMonitor(state["target"], ExplorePlan(**state["plan"]), state["prompts"],
                          torch.tensor(state["candidates"]), rewards, torch.tensor(state["stale_seeds"]), ids=[])
