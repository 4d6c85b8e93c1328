"""A denoising worker: pulls requests, denoises them one step at a time, commits on a preemption notice.

`worker_loop` is the whole behaviour, a plain function over a `QueueClient`, so it runs in-process
against a `RequestQueue` in unit tests; `DenoiseWorker` is the Ray actor that hosts it on a spot
node with the weights it was handed through Ray's object store (never a file).

Each pass of the loop tops the worker up to ``capacity`` requests, advances every in-flight request
by exactly one denoising step (grouped by plan and step, since those share a sampler call), hands
finished ones back with ``complete`` and heartbeats. Because it never takes more than one step
between looks at its preemption flag, a notice costs at most one step: the worker finishes the step
it is in, commits each in-flight request's (latent, step) and leaves the loop.

Bit-identical results wherever a request runs. The sampler makes step k's noise a function of
(seed, k); what is left is the model call, and CPU and GPU matrix kernels pick their reduction
order by shape, so a row's output can change with the number of rows beside it (measured here: a
TinyDiT row differs between batches of 1, 2-3 and ≥ 4). The worker therefore calls the model on
batches of exactly ``forward_batch`` rows, padding the last chunk with copies of its first row: a
request's result is then independent of which requests, and how many, share its worker, and equals
that of any run that uses the same ``forward_batch``.

One policy per request: the loop is given the weights version its model holds and declares it to
the queue on every pull, commit and completion, so it is leased only requests made for those
weights, and it counts as drained once none of them is left, even while requests for newer weights
wait for workers that hold them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import ray
import torch

from spotlight.diffusion.noise import initial_latents
from spotlight.diffusion.sampler import SamplingPlan, VelocityFn, sample, to_device
from spotlight.models.generation import model_device, prompt_tokens
from spotlight.models.lora_merge import sampling_weights
from spotlight.models.pipelines.prompts import bind_prompts
from spotlight.models.policy import Policy
from spotlight.models.rebuild import ModelConfig, policy_from_config
from spotlight.models.weight_payload import WeightPayload, pack_weights, unpack_into
from spotlight.runtime.queue.remote import QueueClient, RemoteQueue
from spotlight.runtime.queue.request_queue import Lease

__all__ = [
    "DenoiseWorker",
    "WorkerReport",
    "WorkerSettings",
    "fixed_batch_velocity_fn",
    "load_weights",
    "model_from_weights",
    "model_weights",
    "worker_loop",
]


class WorkerConfigError(ValueError):
    """A worker setting out of range; the message names the field and the fix."""


@dataclass(frozen=True)
class WorkerSettings:
    """How a worker pulls, batches and reports.

    ``capacity``: most requests in flight (what the device can carry). ``forward_batch``: rows per
    model call, fixed so that results do not depend on batch companions (module docstring).
    ``heartbeat_s``: most time between heartbeats; keep it well under the queue's lease timeout.
    ``idle_wait_s``: pause between pulls that found nothing. ``checkpoint_every``: also commit
    progress every that many steps while keeping the lease, so a worker lost without notice costs at
    most that many steps (None: commit only on a notice). ``min_step_s``: lower bound on one pass's
    wall time, which lets a CPU emulate a slower accelerator so that preemptions land mid-sample in
    tests and local demos (0: as fast as the CPU goes). ``device``: where the device's policy runs (the
    trainer's device type; a pool asks Ray for a GPU when it is cuda).
    """

    capacity: int = 16
    forward_batch: int = 8
    heartbeat_s: float = 1.0
    idle_wait_s: float = 0.1
    checkpoint_every: int | None = None
    min_step_s: float = 0.0
    device: str = "cpu"  # where the policy runs: the config's device (cuda: the GPU Ray gave the actor)

    def __post_init__(self) -> None:
        if self.capacity < 1:
            raise WorkerConfigError(f"worker.capacity must be ≥ 1 request (got {self.capacity})")
        if self.forward_batch < 1:
            raise WorkerConfigError(f"worker.forward_batch must be ≥ 1 row (got {self.forward_batch})")
        for name in ("heartbeat_s", "idle_wait_s"):
            if not getattr(self, name) > 0:
                raise WorkerConfigError(f"worker.{name} must be > 0 seconds (got {getattr(self, name)})")
        if self.min_step_s < 0:
            raise WorkerConfigError(f"worker.min_step_s must be ≥ 0 seconds (got {self.min_step_s})")
        if self.checkpoint_every is not None and self.checkpoint_every < 1:
            raise WorkerConfigError(
                f"worker.checkpoint_every must be ≥ 1 step or None (got {self.checkpoint_every})"
            )


@dataclass
class WorkerReport:
    """What one worker did before it left its loop.

    ``weights_version``: the weights it served with. ``stopped_by``: "drained" (the queue had
    nothing left for those weights) or "preempted" (a notice). ``steps``:
    request-steps denoised. ``completed`` / ``duplicates``: completions the queue kept / ignored.
    ``committed``: requests handed back on the notice; ``checkpoints``: progress commits that kept
    the lease; ``lost_leases``: in-flight requests dropped because their lease had lapsed.
    ``pull_round_trip_s``: wall time of each pull as the worker saw it (RPC included).
    """

    worker_id: str
    weights_version: int
    stopped_by: Literal["drained", "preempted"] = "drained"
    steps: int = 0
    completed: int = 0
    duplicates: int = 0
    committed: int = 0
    checkpoints: int = 0
    lost_leases: int = 0
    pull_round_trip_s: list[float] = field(default_factory=list)

    @property
    def mean_pull_round_trip_s(self) -> float:
        """Mean pull round trip in seconds (0 when the worker never pulled)."""
        trips = self.pull_round_trip_s
        return sum(trips) / len(trips) if trips else 0.0


@dataclass
class _InFlight:
    """One leased request on this worker: its latent at schedule index ``step``, on the worker's device."""

    lease: Lease
    tokens: torch.Tensor  # (L,) its conditioning row on the host: bound to the device once per group (`_Bound`)
    latent: torch.Tensor
    step: int
    steps_since_commit: int = 0


def fixed_batch_velocity_fn(model: torch.nn.Module, tokens: torch.Tensor, forward_batch: int) -> VelocityFn:
    """Bind prompts like ``policy.velocity_fn``, but call the model on exactly ``forward_batch`` rows.

    Returns ``v(x, sigma)`` for latents of ``len(tokens)`` rows: they are split into chunks of
    ``forward_batch`` and the last chunk is padded with copies of its first row (dropped from the output),
    so every model call has the same shape and each row's result is independent of its companions. Each
    chunk's prompts, padding included, are bound to the device here, once (`bind_prompts`): the returned
    function reads nothing back from the device, however many steps it serves.
    """
    chunks = []
    for start in range(0, tokens.shape[0], forward_batch):
        rows_tokens = tokens[start:start + forward_batch]
        rows = rows_tokens.shape[0]
        if rows < forward_batch:
            rows_tokens = torch.cat([rows_tokens, rows_tokens[:1].expand(forward_batch - rows,
                                                                         *rows_tokens.shape[1:])])
        chunks.append((slice(start, start + forward_batch), rows, bind_prompts(model, rows_tokens)))

    def velocity(x: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        outputs = []
        for chunk, rows, cond in chunks:
            x_chunk, sigma_chunk = x[chunk], sigma[chunk]
            if rows < forward_batch:
                pad = forward_batch - rows
                x_chunk = torch.cat([x_chunk, x_chunk[:1].expand(pad, *x_chunk.shape[1:])])
                sigma_chunk = torch.cat([sigma_chunk, sigma_chunk[:1].expand(pad)])
            outputs.append(model(x_chunk, sigma_chunk, cond)[:rows])
        return torch.cat(outputs)

    return velocity


def model_weights(model: Policy) -> WeightPayload:
    """θ as one `WeightPayload` (`spotlight.models.weight_payload`): what to ``ray.put`` so workers share one copy.

    Only the trained tensors (every weight of a TinyDiT; only the LoRA matrices of a diffusers policy, whose
    spot devices rebuild the frozen base from its config), in the dtype the policy samples in, flattened
    on its device and copied to the host once.
    """
    return pack_weights(model)


def load_weights(model: Policy, weights: Mapping[str, Any]) -> None:
    """Put shipped weights into ``model``'s own parameters: a `WeightPayload` with one copy of its buffer to the
    model's device and one unflattening copy; a name -> array mapping (an older caller's) tensor by tensor."""
    if isinstance(weights, WeightPayload):
        unpack_into(model, weights)
    else:
        model.load_broadcast_state({name: torch.as_tensor(np.asarray(array)) for name, array in weights.items()})


def model_from_weights(config: ModelConfig | dict[str, Any], weights: Mapping[str, Any],
                       device: str = "cpu") -> Policy:
    """Rebuild a policy in eval mode on ``device`` from its config (a policy's ``.config``) and `model_weights`.

    The policy goes to ``device`` first and takes the weights there (`load_weights`): the payload, read-only
    in Ray's object store, is copied straight into the parameters on the device.
    """
    model = policy_from_config(config)
    if device != "cpu":
        model = model.to(device)
    load_weights(model, weights)
    return model.eval()


class _Bound:
    """The velocity functions of the groups advanced in the last pass, by their requests (ids, in order).

    A group's prompts are bound to the device when it first appears and reused while the same requests
    advance together (the usual case: leased together, they step together to the end), so a request's
    prompt is bound about once, not at every forward. Groups not seen in a pass are dropped.
    """

    def __init__(self, model: Policy, forward_batch: int) -> None:
        self.model, self.forward_batch = model, forward_batch
        self._functions: dict[tuple[str, ...], VelocityFn] = {}
        self._used: set[tuple[str, ...]] = set()

    def velocity_fn(self, batch: Sequence[_InFlight]) -> VelocityFn:
        key = tuple(item.lease.request.request_id for item in batch)
        self._used.add(key)
        function = self._functions.get(key)
        if function is None:
            tokens = torch.stack([item.tokens for item in batch])
            function = self._functions[key] = fixed_batch_velocity_fn(self.model, tokens, self.forward_batch)
        return function

    def end_pass(self) -> None:
        for key in [key for key in self._functions if key not in self._used]:
            del self._functions[key]
        self._used.clear()


def _advance(model: Policy, batch: Sequence[_InFlight], plan: SamplingPlan, step: int, velocity: VelocityFn) -> None:
    """Take one denoising step (``step`` -> ``step + 1``) for requests that share ``plan`` and ``step``; the
    latents stay on the device."""
    latents = torch.stack([item.latent for item in batch])
    seeds = [item.lease.request.seed for item in batch]
    trajectory = sample(velocity, seeds, plan, model.latent_shape,
                        start_latents=latents, start_step=step, stop_step=step + 1, record=False)
    for item, latent in zip(batch, trajectory.final, strict=True):
        item.latent, item.step = latent.clone(), step + 1
        item.steps_since_commit += 1


def worker_loop(
    queue: QueueClient,
    worker_id: str,
    model: Policy,
    settings: WorkerSettings,
    preempted: threading.Event,
    weights_version: int,
) -> WorkerReport:
    """Serve the queue's requests for θ_weights_version (``model``) until none is left or ``preempted``
    is set; returns what the worker did.

    On ``preempted`` the worker finishes the step it is in, commits every in-flight request's
    (latent, step) — releasing its lease so another worker resumes it there — and returns.

    A LoRA policy samples with its LoRA folded into the base weights for the whole round wherever the
    trainer's rollout does (``model.merge_lora``; on CUDA by default), so a request resumed here runs
    the same arithmetic as one sampled by the trainer.
    """
    with sampling_weights(model):
        return _serve_round(queue, worker_id, model, settings, preempted, weights_version)


def _serve_round(queue: QueueClient, worker_id: str, model: Policy, settings: WorkerSettings,
                 preempted: threading.Event, weights_version: int) -> WorkerReport:
    """`worker_loop`'s round, with the sampling weights in place."""
    report = WorkerReport(worker_id, weights_version)
    in_flight: dict[str, _InFlight] = {}
    bound = _Bound(model, settings.forward_batch)
    device = model_device(model)
    last_heartbeat = time.perf_counter()
    next_pull = 0.0  # when an empty pull may be retried
    while not preempted.is_set():
        started = time.perf_counter()
        free = settings.capacity - len(in_flight)
        if free > 0 and (not in_flight or started >= next_pull):
            leases = queue.pull(worker_id, free, weights_version, holding=list(in_flight))
            report.pull_round_trip_s.append(time.perf_counter() - started)
            for lease in leases:  # a re-leased request replaces a stale copy of itself
                in_flight[lease.request.request_id] = _start(model, lease, device)
            next_pull = 0.0 if leases else time.perf_counter() + settings.idle_wait_s
            _complete_finished(queue, worker_id, in_flight, report)  # a zero-step plan is done at once
        if not in_flight:
            if queue.remaining(weights_version) == 0:
                return report
            preempted.wait(settings.idle_wait_s)
            continue
        groups: dict[tuple[SamplingPlan, int], list[_InFlight]] = {}
        for item in in_flight.values():
            groups.setdefault((item.lease.request.plan, item.step), []).append(item)
        for (plan, step), batch in groups.items():
            _advance(model, batch, plan, step, bound.velocity_fn(batch))
            report.steps += len(batch)
            if preempted.is_set():  # finish this step only; the other groups commit where they are
                break
        bound.end_pass()
        _complete_finished(queue, worker_id, in_flight, report)
        if settings.checkpoint_every is not None and not preempted.is_set():
            for request_id, item in in_flight.items():
                if item.steps_since_commit >= settings.checkpoint_every:
                    report.checkpoints += queue.commit(worker_id, request_id, item.latent.cpu(), item.step,
                                                       weights_version, keep_lease=True)
                    item.steps_since_commit = 0
        if time.perf_counter() - last_heartbeat >= settings.heartbeat_s:
            held = set(queue.heartbeat(worker_id, holding=list(in_flight)))
            last_heartbeat = time.perf_counter()
            for request_id in [rid for rid in in_flight if rid not in held]:
                del in_flight[request_id]
                report.lost_leases += 1
        preempted.wait(max(0.0, settings.min_step_s - (time.perf_counter() - started)))
    for request_id, item in in_flight.items():
        report.committed += queue.commit(worker_id, request_id, item.latent.cpu(), item.step, weights_version)
    report.stopped_by = "preempted"
    return report


def _start(model: Policy, lease: Lease, device: torch.device) -> _InFlight:
    """In-flight state for a new lease: the committed latent, or the seed's initial noise, moved to the
    worker's device once (it stays there until the request is committed or complete)."""
    request = lease.request
    latent = lease.latent
    if latent is None:
        latent = initial_latents([request.seed], model.latent_shape)[0]
    return _InFlight(lease, prompt_tokens(model, [request.prompt])[0], to_device(latent, device), lease.step)


def _complete_finished(
    queue: QueueClient, worker_id: str, in_flight: dict[str, _InFlight], report: WorkerReport
) -> None:
    """Hand every request that reached its last step back to the queue and forget it."""
    finished = [rid for rid, item in in_flight.items() if item.step == item.lease.request.plan.num_steps]
    if not finished:
        return
    kept = queue.complete_many(worker_id, [(rid, in_flight.pop(rid).latent.cpu()) for rid in finished],
                               report.weights_version)  # one round trip, the latents to the host once
    report.completed += sum(kept)
    report.duplicates += len(kept) - sum(kept)


@ray.remote(max_concurrency=2)
class DenoiseWorker:
    """A Ray actor that runs `worker_loop` on one device (here: one CPU thread).

    ``weights`` is the `model_weights` payload, passed as an ``ObjectRef`` from ``ray.put`` so that every
    worker on a node maps the same object-store copy. Two concurrent calls: ``run`` (the loop) and
    ``notify_preemption`` (sets the flag the loop checks between steps).
    """

    def __init__(
        self,
        worker_id: str,
        queue: Any,
        model_config: ModelConfig | dict[str, Any],
        weights: dict[str, np.ndarray],
        weights_version: int,
        settings: WorkerSettings | None = None,
        num_threads: int = 1,
    ) -> None:
        torch.set_num_threads(num_threads)  # Ray's OMP_NUM_THREADS and a reused process's count are not ours
        self.worker_id = worker_id
        self.settings = settings or WorkerSettings()
        self.model = model_from_weights(model_config, weights, self.settings.device)
        self.weights_version = weights_version
        self.queue = RemoteQueue(queue)
        self.preempted = threading.Event()

    def ready(self) -> str:
        """Returns the worker id once the model is loaded (actor construction is asynchronous)."""
        return self.worker_id

    def run(self) -> WorkerReport:
        """Serve the queue until drained or preempted; returns the `WorkerReport`."""
        return worker_loop(self.queue, self.worker_id, self.model, self.settings, self.preempted, self.weights_version)

    def notify_preemption(self) -> None:
        """Ask the loop to finish its current step, commit its in-flight requests and return."""
        self.preempted.set()
