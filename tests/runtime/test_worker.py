"""The denoising worker: in-process loops against a real `RequestQueue`, then the Ray actor.

Golden results come from ``sample`` over all steps at once with ``policy.velocity_fn`` on batches of
exactly ``forward_batch`` requests: a path that shares neither the queue, the worker loop, the
step-by-step resumption nor the padding helper with the code under test.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import ray
import torch
from local_ray_node import local_ray

from spotlight.components.checkpoint import load_model
from spotlight.diffusion.sampler import SamplingPlan, sample
from spotlight.models.generation import prompt_tokens, velocity_fn
from spotlight.models.tinydit import TinyDiT
from spotlight.runtime.queue.remote import start_queue_actor
from spotlight.runtime.queue.request_queue import Request, RequestQueue
from spotlight.runtime.spot.worker import (
    DenoiseWorker,
    WorkerConfigError,
    WorkerSettings,
    fixed_batch_velocity_fn,
    model_from_weights,
    model_weights,
    worker_loop,
)

FORWARD_BATCH = 4
PLANS = (SamplingPlan(num_steps=4), SamplingPlan(num_steps=3, shift=3.0, sampler="ode"))
PROMPTS = ("a red circle", "two blue squares", "a green triangle left of a red circle", "a blue circle")


class Crash(RuntimeError):
    """A worker process dying mid-step (no notice, nothing committed after it)."""


class CallHook(torch.nn.Module):
    """The real model, with ``on_call(n)`` run before its n-th call (1-based) to inject a notice or a crash."""

    def __init__(self, model: TinyDiT, on_call: Callable[[int], None]) -> None:
        super().__init__()
        self.model, self.config, self.on_call, self.calls = model, model.config, on_call, 0
        self.latent_shape = model.latent_shape

    def forward(self, x: torch.Tensor, sigma: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        self.on_call(self.calls)
        return self.model(x, sigma, tokens)

    def tokenize(self, prompts: list[str], guided: bool = True) -> torch.Tensor:  # the Policy protocol's
        return self.model.tokenize(prompts, guided)


@pytest.fixture(scope="module")
def model(tiny_base_model: Path) -> TinyDiT:
    torch.set_num_threads(1)
    return load_model(tiny_base_model).eval()


def make_requests(count: int) -> list[Request]:
    return [
        Request(f"r{index}", PROMPTS[index % len(PROMPTS)], 500 + index, PLANS[index % len(PLANS)], weights_version=0)
        for index in range(count)
    ]


def reference(
    model: TinyDiT, requests: list[Request], forward_batch: int = FORWARD_BATCH
) -> dict[str, torch.Tensor]:
    """Fault-free results: one whole-trajectory ``sample`` call per ``forward_batch`` requests of a plan."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in the workers (the result does not depend on it here, but cheap to match)
    results = {}
    try:
        for plan in dict.fromkeys(request.plan for request in requests):
            group = [request for request in requests if request.plan == plan]
            for start in range(0, len(group), forward_batch):
                chunk = group[start : start + forward_batch]
                padded = chunk + [chunk[0]] * (forward_batch - len(chunk))
                tokens = prompt_tokens(model, [request.prompt for request in padded])
                seeds = [request.seed for request in padded]
                final = sample(velocity_fn(model, tokens), seeds, plan, model.config.latent_shape, record=False).final
                results.update({request.request_id: final[index] for index, request in enumerate(chunk)})
    finally:
        torch.set_num_threads(threads)
    return results


def assert_bit_identical(results: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert sorted(results) == sorted(expected)
    assert all(torch.equal(results[rid], expected[rid]) for rid in expected)


def settings(**overrides: object) -> WorkerSettings:
    values = {"capacity": 6, "forward_batch": FORWARD_BATCH, "heartbeat_s": 60.0, "idle_wait_s": 0.01}
    return WorkerSettings(**(values | overrides))


def test_fixed_batch_velocity_gives_each_row_the_output_of_a_full_model_call(model: TinyDiT) -> None:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(FORWARD_BATCH, *model.config.latent_shape, generator=generator)
    sigma = torch.rand(FORWARD_BATCH, generator=generator)
    tokens = prompt_tokens(model, list(PROMPTS))
    full = model(x, sigma, tokens)  # one plain call on a full batch
    for rows in ([2], [0, 3], [1, 2, 3], [0, 1, 2, 3]):
        out = fixed_batch_velocity_fn(model, tokens[rows], FORWARD_BATCH)(x[rows], sigma[rows])
        assert torch.equal(out, full[rows])  # rows keep their result whatever their companions
    many = torch.cat([x, x[:2]]), torch.cat([sigma, sigma[:2]]), torch.cat([tokens, tokens[:2]])
    out = fixed_batch_velocity_fn(model, many[2], FORWARD_BATCH)(many[0], many[1])
    assert out.shape[0] == FORWARD_BATCH + 2 and torch.equal(out[FORWARD_BATCH:], full[:2])


def test_a_worker_drains_the_queue_with_results_equal_to_an_uninterrupted_sample(model: TinyDiT) -> None:
    requests = make_requests(9)
    queue = RequestQueue()
    queue.submit(requests)
    report = worker_loop(queue, "a", model, settings(), threading.Event(), weights_version=0)
    assert report.stopped_by == "drained"
    assert report.completed == 9 and report.steps == sum(request.plan.num_steps for request in requests)
    assert_bit_identical(queue.results(), reference(model, requests))


def test_a_notice_mid_step_finishes_that_step_commits_and_another_worker_resumes_bit_identically(
    model: TinyDiT,
) -> None:
    requests = make_requests(4)
    queue = RequestQueue()
    queue.submit(requests)
    preempted = threading.Event()
    # Two groups per pass (one per plan); the notice comes during the 3rd model call: pass 2, group 1.
    hooked = CallHook(model, lambda call: preempted.set() if call == 3 else None)
    report = worker_loop(queue, "a", hooked, settings(), preempted, weights_version=0)
    assert report.stopped_by == "preempted" and report.committed == 4 and report.completed == 0
    leases = queue.pull("b", 10, weights_version=0)
    steps = {lease.request.plan: lease.step for lease in leases}
    assert steps == {PLANS[0]: 2, PLANS[1]: 1}  # the step in progress was finished, the next not begun
    for lease in leases:
        queue.commit("b", lease.request.request_id, lease.latent, lease.step, weights_version=0)  # for the loop
    assert worker_loop(queue, "b", model, settings(), threading.Event(), weights_version=0).completed == 4
    assert_bit_identical(queue.results(), reference(model, requests))


def test_a_crashed_worker_is_resumed_from_its_last_checkpoint_after_its_leases_expire(model: TinyDiT) -> None:
    requests = [request for request in make_requests(3) if request.plan == PLANS[0]]  # one group per pass
    clock = [0.0]
    queue = RequestQueue(lease_timeout_s=5.0, clock=lambda: clock[0])
    queue.submit(requests)

    def crash_on_third(call: int) -> None:
        if call == 3:
            raise Crash("killed without notice")

    with pytest.raises(Crash):
        worker_loop(queue, "a", CallHook(model, crash_on_third), settings(checkpoint_every=2), threading.Event(),
                    weights_version=0)
    clock[0] += 5.0
    leases = queue.pull("b", 10, weights_version=0)
    assert [lease.step for lease in leases] == [2, 2]  # step 3 was lost with the crash, steps 1-2 were not
    for lease in leases:
        queue.commit("b", lease.request.request_id, lease.latent, lease.step, weights_version=0)
    report = worker_loop(queue, "b", model, settings(), threading.Event(), weights_version=0)
    assert report.steps == 2 * 2
    assert_bit_identical(queue.results(), reference(model, requests))


def test_a_worker_drops_requests_whose_lease_lapsed_and_never_completes_them(model: TinyDiT) -> None:
    requests = make_requests(2)
    clock = [0.0]
    queue = RequestQueue(lease_timeout_s=5.0, clock=lambda: clock[0])
    queue.submit(requests)
    stolen: list[str] = []

    def stall(call: int) -> None:  # worker "a" stalls past its lease; "b" takes its requests and finishes
        if call == 1:
            clock[0] += 5.0
            stolen.extend(lease.request.request_id for lease in queue.pull("b", 10, weights_version=0))
            for request_id in stolen:
                queue.complete("b", request_id, torch.zeros(model.config.latent_shape), weights_version=0)

    report = worker_loop(queue, "a", CallHook(model, stall), settings(heartbeat_s=1e-6), threading.Event(),
                         weights_version=0)
    assert stolen == ["r0", "r1"]
    assert report.lost_leases == 2 and report.completed == report.duplicates == 0
    assert report.stopped_by == "drained"
    assert all(torch.equal(result, torch.zeros(model.config.latent_shape)) for result in queue.results().values())


class LosesPullAnswers:
    """A `RequestQueue` whose pull answers are lost on the way back, as when the queue actor dies after
    applying a pull and Ray retries the call on the restarted actor: the pull is applied twice and the
    worker sees only the second answer (``lost``: pull calls whose first answer is dropped, 1-based)."""

    def __init__(self, queue: RequestQueue, lost: set[int]) -> None:
        self.queue, self.lost, self.pulls = queue, lost, 0

    def pull(self, *args: object, **kwargs: object) -> list:
        self.pulls += 1
        if self.pulls in self.lost:
            self.queue.pull(*args, **kwargs)  # applied and logged; its answer never arrives
        return self.queue.pull(*args, **kwargs)  # Ray's retry

    def __getattr__(self, name: str) -> object:
        return getattr(self.queue, name)


def test_leases_whose_pull_answer_was_lost_go_back_to_the_queue_and_the_round_finishes(model: TinyDiT) -> None:
    requests = make_requests(6)
    queue = RequestQueue(lease_timeout_s=3600.0)  # no lapse can rescue the lost leases in this test's time
    queue.submit(requests)
    lossy = LosesPullAnswers(queue, lost={1, 3})
    finished: list = []
    loop = threading.Thread(daemon=True, target=lambda: finished.append(worker_loop(
        lossy, "a", model, settings(capacity=2, heartbeat_s=1e-6), threading.Event(), weights_version=0)))
    loop.start()
    loop.join(timeout=60)
    assert finished, "the worker never drained: leases granted by a lost pull answer were never released"
    assert finished[0].stopped_by == "drained" and finished[0].completed == 6
    stats = queue.stats()  # every lease a lost answer granted was reclaimed, and every request leased anew
    assert stats.reclaimed > 0 and stats.leases_granted == 6 + stats.reclaimed and queue.remaining() == 0
    assert_bit_identical(queue.results(), reference(model, requests))


def test_a_device_still_holding_theta_v_cannot_complete_a_request_for_theta_v_plus_1(model: TinyDiT) -> None:
    old_round = make_requests(2)  # θ_0's round, cancelled before it was done
    next_round = [Request(f"n{r.request_id}", r.prompt, r.seed, r.plan, weights_version=1) for r in make_requests(3)]
    queue = RequestQueue()
    queue.submit(old_round)
    queue.cancel([request.request_id for request in old_round])
    queue.submit(next_round)
    stale = worker_loop(queue, "still-theta-0", model, settings(), threading.Event(), weights_version=0)
    assert (stale.stopped_by, stale.steps, stale.completed) == ("drained", 0, 0)
    assert queue.remaining(weights_version=1) == 3 and queue.stats().leases_granted == 0
    fresh = worker_loop(queue, "holds-theta-1", model, settings(), threading.Event(), weights_version=1)
    assert fresh.completed == 3 and fresh.weights_version == 1
    assert_bit_identical(queue.results(), {f"n{rid}": r for rid, r in reference(model, make_requests(3)).items()})


def test_settings_refuse_values_that_cannot_work() -> None:
    with pytest.raises(WorkerConfigError, match="worker.capacity"):
        WorkerSettings(capacity=0)
    with pytest.raises(WorkerConfigError, match="worker.heartbeat_s"):
        WorkerSettings(heartbeat_s=0)
    with pytest.raises(WorkerConfigError, match="worker.checkpoint_every"):
        WorkerSettings(checkpoint_every=0)


def test_weights_round_trip_through_numpy_to_an_identical_model(model: TinyDiT) -> None:
    rebuilt = model_from_weights(model.config.to_dict(), model_weights(model))
    original = model.state_dict()
    assert rebuilt.state_dict().keys() == original.keys()
    assert all(torch.equal(tensor, original[name]) for name, tensor in rebuilt.state_dict().items())


# -- the Ray actor --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ray_node() -> Iterator[None]:
    with local_ray(num_cpus=2, resources={"on_demand": 1, "spot": 2}):
        yield


def test_denoise_worker_actor_commits_on_notice_and_its_replacement_finishes_bit_identically(
    ray_node: None, model: TinyDiT
) -> None:
    requests = make_requests(6)
    handle = start_queue_actor(lease_timeout_s=30.0)
    weights = ray.put(model_weights(model))
    paced = settings(min_step_s=0.5)  # a slow "device", so the notice lands mid-sample
    first = DenoiseWorker.options(resources={"spot": 1}).remote("a", handle, model.config, weights, 0, paced)
    ray.get(first.ready.remote())
    ray.get(handle.submit.remote(requests))
    run = first.run.remote()
    while not ray.get(handle.leases_by_worker.remote()):
        time.sleep(0.01)
    first.notify_preemption.remote()
    report = ray.get(run, timeout=240)  # bounds only a broken run: it returns once the worker commits
    ray.kill(first)
    assert report.stopped_by == "preempted" and report.committed == 6 and report.completed == 0
    assert ray.get(handle.stats.remote()).commits == 6

    second = DenoiseWorker.options(resources={"spot": 1}).remote("b", handle, model.config, weights, 0, settings())
    report = ray.get(second.run.remote(), timeout=240)
    assert report.completed == 6 and report.steps < sum(request.plan.num_steps for request in requests)
    assert_bit_identical(ray.get(handle.results.remote()), reference(model, requests))
    ray.kill(second)
    ray.kill(handle)
