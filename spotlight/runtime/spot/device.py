"""One spot device: a single-threaded Ray actor that holds θ_i and does whatever the driver asks of it.

A spot device has three jobs in an iteration, all with the same weights: help the rollout
(`SpotDevice.sample`, whole trajectories with log-probs), serve the exploration queue
(`SpotDevice.explore`, the preemption-aware `worker_loop`), and answer a preemption notice
(`notify_preemption`). The weights arrive once per iteration as an ``ObjectRef`` of the
`worker.model_weights` payload (one buffer of the trained tensors): Ray resolves it from the node's
object store (one copy per node, never a file).

Every call returns a `DeviceCall`: when it ran (wall clock, seconds since the epoch, so the driver
can place it on the run's timeline) and how much of it was model compute. Model compute is timed by
forward hooks on the model: what the device spent inside the network, as opposed to pulling,
committing, heartbeating and tokenising. Its share of the call time is the runtime's overhead
measure.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import ray
import torch

from spotlight.cores import pin_process
from spotlight.diffusion.sampler import SamplingPlan
from spotlight.models.generation import generate
from spotlight.models.rebuild import ModelConfig
from spotlight.runtime.queue.remote import RemoteQueue
from spotlight.runtime.spot.worker import (
    WorkerReport,
    WorkerSettings,
    load_weights,
    model_from_weights,
    worker_loop,
)

__all__ = ["ComputeClock", "DeviceCall", "SpotDevice", "weights_digest"]


class ComputeClock:
    """Seconds spent inside a module's forward calls, measured with forward (pre-)hooks.

    Nested calls (a block inside the model) are counted once: only the outermost forward is timed.
    """

    def __init__(self, module: torch.nn.Module) -> None:
        self.seconds = 0.0
        self._depth = 0
        self._started = 0.0
        module.register_forward_pre_hook(self._enter)
        module.register_forward_hook(self._leave)

    def _enter(self, *_: Any) -> None:
        if self._depth == 0:
            self._started = time.perf_counter()
        self._depth += 1

    def _leave(self, *_: Any) -> None:
        self._depth -= 1
        if self._depth == 0:
            self.seconds += time.perf_counter() - self._started


@dataclass(frozen=True)
class DeviceCall:
    """What one call on a device did: ``start``/``end`` (wall clock, epoch seconds), ``compute_s``
    (seconds inside the model), ``result`` (the call's answer)."""

    device_id: str
    start: float
    end: float
    compute_s: float
    result: Any = None


def weights_digest(weights: dict[str, np.ndarray]) -> dict[str, float]:
    """A cheap fingerprint of a state dict (sum and sum of squares per tensor) for equality checks."""
    return {name: float(np.asarray(array, dtype=np.float64).sum()) + float(np.square(array, dtype=np.float64).sum())
            for name, array in weights.items()}


@ray.remote(max_concurrency=2)
class SpotDevice:
    """A spot device (here one CPU thread). Two concurrent calls at most: the work and a notice."""

    def __init__(self, device_id: str, queue: Any, model_config: ModelConfig | dict[str, Any],
                 settings: WorkerSettings, num_threads: int = 1, core: int | None = None) -> None:
        # one device = one core (cores.py); Ray's OMP_NUM_THREADS and a reused process's count are not ours
        pin_process(core, num_threads)
        self.device_id = device_id
        self.model_config = model_config
        self.settings = settings
        self.queue = RemoteQueue(queue)
        self.model: torch.nn.Module | None = None
        self.clock: ComputeClock | None = None
        self.version = -1
        self.preempted = threading.Event()

    def ready(self) -> str:
        """Returns the device id once the process is up (actor construction is asynchronous)."""
        return self.device_id

    def load_weights(self, version: int, weights: Mapping[str, Any]) -> DeviceCall:
        """Take θ_version (``weights``, the `model_weights` payload resolved by Ray from the object store).

        The first call builds the model from its config; later ones load only the broadcast state (a
        LoRA policy's matrices over the base it built once).
        """
        start = time.time()
        if self.model is None:
            self.model = model_from_weights(self.model_config, weights, self.settings.device)
            self.clock = ComputeClock(self.model)
        else:
            load_weights(self.model, weights)  # one copy of the payload to the device, one unflattening copy
        self.version = version
        return DeviceCall(self.device_id, start, time.time(), 0.0, version)

    def weights(self) -> dict[str, np.ndarray]:
        """The weights this device holds, as numpy (for tests that compare them with the trainer's)."""
        return {name: tensor.detach().numpy().copy() for name, tensor in self._model().broadcast_state().items()}

    def sample(self, prompts: list[str], seeds: list[int], plan: SamplingPlan, weights_version: int,
               record: bool = True) -> DeviceCall:
        """Rollout (or validation) help: one trajectory per (prompt, seed) with θ_weights_version; result
        (latents, log_probs), every step's latent or (``record`` False, validation) the first and last only.

        The result is None, and nothing is sampled, when this device holds other weights than the
        request's: the driver then samples the part itself, never with the wrong policy.
        """
        model = self._model()
        start, compute_before = time.time(), self.clock.seconds
        if weights_version != self.version:
            return DeviceCall(self.device_id, start, time.time(), 0.0, None)
        with torch.no_grad():
            trajectory = generate(model, prompts, seeds, plan, record=record)
        return DeviceCall(self.device_id, start, time.time(), self.clock.seconds - compute_before,
                          (trajectory.latents, trajectory.log_probs))

    def explore(self) -> DeviceCall:
        """Serve the exploration queue until it is drained or a notice arrives; result: `WorkerReport`."""
        model = self._model()
        start, compute_before = time.time(), self.clock.seconds
        with torch.no_grad():
            report: WorkerReport = worker_loop(self.queue, self.device_id, model, self.settings, self.preempted,
                                               self.version)
        return DeviceCall(self.device_id, start, time.time(), self.clock.seconds - compute_before, report)

    def notify_preemption(self) -> None:
        """The node is going: finish the current step, commit in-flight requests, take no more work."""
        self.preempted.set()

    def _model(self) -> torch.nn.Module:
        if self.model is None:
            raise RuntimeError(f"spot device {self.device_id} has no weights yet: call load_weights(version, "
                               "ray.put(model_weights(model))) before sample() or explore()")
        return self.model
