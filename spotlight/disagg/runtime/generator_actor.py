"""A generator device of the disaggregated pipeline: pulls units, draws and scores them, pushes the samples.

One process pinned to its own core with one thread (`spotlight.cores`), as every device here.
It holds the policy, loads published weights only between tasks (one version per trajectory, logged
at every denoising step by `spotlight.disagg.generators.generate_fragment`), and scores its own
samples: reward scoring runs in the generator process, not on the trainer. A separate reward actor
would be DigenRL's reward pool; on this 2-core machine it would be a third process sharing a core with
a generator or the trainer, and the rewards here (rendered-shape and OCR checks) cost a few percent of
a unit's sampling, so they ride with the samples.

Exploration tasks (Spotlight's stale-seed exploration) draw a prompt's candidate seeds with the
exploration sampling plan and return their rewards, scored the same way.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import ray
import torch

from spotlight.cores import pin_process
from spotlight.disagg.generators import ScoreFn, generate_fragment
from spotlight.disagg.runtime.queue import Task
from spotlight.disagg.samples import ScoredSample
from spotlight.explore.candidates import score_latents
from spotlight.models.generation import generate, images_of, prompt_tokens
from spotlight.models.policy import Policy, to_images
from spotlight.rewards.base import Reward, guarded_score
from spotlight.runtime.spot.worker import load_weights, model_from_weights

__all__ = ["GeneratorDevice", "run_task", "unit_scorer", "with_strict"]

PULL_WAIT_S = 0.5  # how long one pull blocks before the loop checks again (the queue wakes it sooner)


def unit_scorer(reward: Reward, prompts: list[str], model: Policy | None = None) -> tuple[ScoreFn, list[bool]]:
    """A `ScoreFn` for a unit of a batch with ``prompts``, and the list it appends each sample's strict flag to.

    ``model``: the policy whose samples these are, for its decoder (a pipeline's VAE); None: pixel space.
    """
    strict: list[bool] = []

    def score(final: torch.Tensor, members) -> list[tuple[float, bool]]:
        images = images_of(model, final) if model is not None else to_images(final)
        output = guarded_score(reward, images, [prompts[p] for p, _ in members])
        strict.extend(bool(flag) for flag in output.strict)
        return [(float(r), bool(v)) for r, v in zip(output.rewards, output.valid, strict=True)]

    return score, strict


def with_strict(samples: list[ScoredSample], strict: list[bool]) -> list[ScoredSample]:
    return [dataclasses.replace(sample, strict=flag) for sample, flag in zip(samples, strict, strict=True)]


def run_task(model: Policy, version: int, task: Task, reward: Reward, version_now=None) -> dict[str, Any]:
    """Run one task on a generator holding θ_version: a rollout unit's scored samples, or a prompt's
    explored candidate rewards."""
    payload = task.payload
    if task.kind == "explore":
        trajectory = generate(model, [payload["prompt"]] * len(payload["seeds"]), payload["seeds"],
                              payload["plan"], record=False)
        rewards = score_latents(trajectory.final, [payload["prompt"]], reward, lambda z: images_of(model, z))[0]
        return {"kind": "explore", "step": task.step, "prompt_index": task.index, "rewards": rewards,
                "version": version}
    score, strict = unit_scorer(reward, payload["prompts"], model)
    samples = generate_fragment(model, version, payload["members"], prompt_tokens(model, payload["prompts"]),
                                payload["seeds"], payload["plan"], score, "generator", version_now=version_now)
    return {"kind": "rollout", "step": task.step, "unit": task.index, "samples": with_strict(samples, strict),
            "version": version}


class GeneratorDevice:
    """A generator (see the module docstring); the backend runs it as a Ray actor and calls `serve` once."""

    def __init__(self, name: str, core: int | None, policy_config: Any, reward: Reward) -> None:
        pin_process(core, 1)
        self.name, self.policy_config, self.reward = name, policy_config, reward
        self.model: Policy | None = None
        self.version: int | None = None

    def ready(self) -> str:
        return self.name

    def configure(self, name: str, policy_config: Any, reward: Reward) -> str:
        """Serve another run (a lent cluster keeps its generators between runs): its name, policy and reward;
        the policy is built afresh from the run's first weights."""
        self.name, self.policy_config, self.reward = name, policy_config, reward
        self.model, self.version = None, None
        return name

    def _load(self, version: int, weights_ref: Any) -> None:
        weights = ray.get(weights_ref)
        if self.model is None:
            self.model = model_from_weights(self.policy_config, weights)
        else:
            load_weights(self.model, weights)  # θ's payload: one copy into the model's own parameters
        self.version = version

    def serve(self, queue: Any) -> dict[str, float]:
        """Pull, run and push tasks until the queue closes; returns this device's busy seconds."""
        busy_s = 0.0
        while True:
            item = ray.get(queue.pull.remote(self.name, PULL_WAIT_S))
            if item == "stop":
                self.model, self.version = None, None  # an idle generator kept for the next run holds no policy
                return {"busy_s": busy_s}
            if item is None:
                continue
            task, version, (weights_ref,) = item
            started_wall, started = time.time(), time.perf_counter()
            if version != self.version:  # between tasks only: a trajectory never mixes versions
                self._load(version, weights_ref)
            with torch.no_grad():
                result = run_task(self.model, version, task, self.reward, version_now=lambda: self.version)
            seconds = time.perf_counter() - started
            busy_s += seconds
            result.update({"device": self.name, "seconds": seconds, "started": started_wall, "ended": time.time()})
            queue.push.remote(self.name, result)
