"""The bar of the queue: every request completes exactly once, bit-identical, through preemptions.

Real Ray: a queue actor pinned to the "on_demand" resource and DenoiseWorker actors on "spot". A
driver loop preempts lease-holding workers over and over: most get a notice (the worker finishes its
step, commits (latent, step), returns; then it is ray.kill-ed), some are ray.kill-ed without one
(their leases lapse with their heartbeats and are re-leased from the last checkpoint or from
scratch). Every preempted worker but the last is replaced by a fresh actor (the last one's would only
start, import torch and find the round drained: seconds of wall for nothing the test checks). The
driver releases requests a few per preemption, so work is in flight at every one however fast or slow
this machine is. The run time is the fresh worker processes (each imports torch, ~2-3 CPU-seconds),
not the denoising: 10 notices and 4 kills (16 workers; 20 and 6 took 28) exercise both paths many
times over: each notice commits several leases and each kill leaves several to lapse (one run: 74
commits, 72 resumed leases, 54 expirations), and the assertions below check that they did.

The golden results come from a second path in this process that shares nothing with the queue or
the worker loop (``test_worker.reference``): ``sample`` over all steps at once with
``policy.velocity_fn``, on batches of exactly the workers' ``forward_batch`` requests (the one thing
a bit-identical comparison must share with the workers: matrix kernels pick their reduction order
by shape).
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray
import torch
from local_ray_node import local_ray
from test_worker import reference  # the fault-free path, shared with the worker's tests

from spotlight.components.checkpoint import load_model
from spotlight.diffusion.sampler import SamplingPlan
from spotlight.runtime.queue.remote import start_queue_actor
from spotlight.runtime.queue.request_queue import Request
from spotlight.runtime.spot.worker import DenoiseWorker, WorkerReport, WorkerSettings, model_weights
from spotlight.tasks.shapes import all_prompts

NUM_REQUESTS = 240
NUM_NOTICES = 10
NUM_KILLS = 4
LIVE_WORKERS = 3
PLANS = (SamplingPlan(num_steps=4), SamplingPlan(num_steps=3, shift=3.0))
SETTINGS = WorkerSettings(
    capacity=8, forward_batch=8, heartbeat_s=0.2, idle_wait_s=0.05, checkpoint_every=2, min_step_s=0.15
)
LEASE_TIMEOUT_S = 2.0
RESERVE_PER_EVENT = 4  # requests held back per preemption still to come, so none finds the queue empty
BACKLOG = 24  # requests kept outstanding beyond those done, so workers are busy mid-sample
NOTICE_GRACE_S = 20.0  # a notified worker must have committed and returned by then


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[None]:
    with local_ray(num_cpus=4, resources={"on_demand": 1, "spot": 1000}):
        yield


def make_requests(count: int) -> list[Request]:
    prompts = [spec.text for spec in all_prompts()]
    rng = random.Random(7)
    return [
        Request(f"r{index:04d}", rng.choice(prompts), rng.randrange(2**31), PLANS[index % len(PLANS)],
                weights_version=0)
        for index in range(count)
    ]


@pytest.mark.slow
def test_every_request_completes_exactly_once_and_bit_identical_through_preemptions(
    ray_cluster: None, tiny_base_model: Path
) -> None:
    model = load_model(tiny_base_model).eval()
    requests = make_requests(NUM_REQUESTS)
    expected = reference(model, requests, SETTINGS.forward_batch)

    started = time.perf_counter()
    queue = start_queue_actor(LEASE_TIMEOUT_S, resource="on_demand")
    weights = ray.put(model_weights(model))
    live: dict[str, tuple[ray.actor.ActorHandle, ray.ObjectRef]] = {}
    spawned = 0

    def spawn() -> None:
        nonlocal spawned
        worker_id = f"worker-{spawned:03d}"
        spawned += 1
        handle = DenoiseWorker.options(resources={"spot": 1}).remote(
            worker_id, queue, model.config, weights, 0, SETTINGS
        )
        live[worker_id] = (handle, handle.run.remote())

    for _ in range(LIVE_WORKERS):
        spawn()
    rng = random.Random(0)
    schedule = ["notice"] * NUM_NOTICES + ["kill"] * NUM_KILLS
    rng.shuffle(schedule)
    submitted, reports = 0, []
    notices = kills = 0
    for event_index, kind in enumerate(schedule):
        deadline = time.perf_counter() + 180.0  # a fresh actor imports torch: slow on a loaded machine
        while True:  # release work, then wait for a live worker that holds leases
            stats = ray.get(queue.stats.remote())
            cap = NUM_REQUESTS - (len(schedule) - event_index) * RESERVE_PER_EVENT
            target = min(cap, stats.done + BACKLOG)
            if target > submitted:
                ray.get(queue.submit.remote(requests[submitted:target]))
                submitted = target
            holders = [worker for worker in ray.get(queue.leases_by_worker.remote()) if worker in live]
            if holders:
                break
            assert time.perf_counter() < deadline, f"no live worker took work before preemption {event_index}"
            time.sleep(0.02)
        victim = rng.choice(sorted(holders))
        handle, run = live.pop(victim)
        if kind == "notice":
            handle.notify_preemption.remote()
            reports.append(ray.get(run, timeout=NOTICE_GRACE_S))
            notices += 1
        else:
            kills += 1
        ray.kill(handle)
        if event_index < len(schedule) - 1:  # a preemption is still to come: it needs a full set of workers
            spawn()

    ray.get(queue.submit.remote(requests[submitted:]))
    reports += ray.get([run for _, run in live.values()], timeout=120.0)
    wall_s = time.perf_counter() - started
    stats = ray.get(queue.stats.remote())
    results = ray.get(queue.results.remote())
    for handle, _ in live.values():
        ray.kill(handle)

    preempted: list[WorkerReport] = [report for report in reports if report.stopped_by == "preempted"]
    trips = [trip for report in reports for trip in report.pull_round_trip_s]
    print(
        f"\n{NUM_REQUESTS} requests, {notices} notices, {kills} kills, {spawned} workers; wall {wall_s:.1f} s; "
        f"commits {stats.commits} (checkpoints {stats.checkpoints}), resumed leases {stats.resumed}, "
        f"expirations {stats.expirations}, duplicate completions rejected {stats.duplicate_completions}, "
        f"late completions kept {stats.late_completions}, stale commits rejected {stats.stale_commits}; "
        f"pull round trip mean {1e3 * sum(trips) / len(trips):.2f} ms over {len(trips)} pulls "
        f"(queue service {1e3 * stats.mean_pull_s:.3f} ms)"
    )
    assert (notices, kills) == (NUM_NOTICES, NUM_KILLS)
    assert len(preempted) == NUM_NOTICES, "every notified worker commits and returns"
    assert (stats.submitted, stats.done, stats.pending, stats.leased) == (NUM_REQUESTS, NUM_REQUESTS, 0, 0)
    assert sorted(results) == sorted(expected)
    mismatched = [rid for rid in expected if not torch.equal(results[rid], expected[rid])]
    assert not mismatched, f"{len(mismatched)} results differ from the fault-free run, e.g. {mismatched[:3]}"
    # The faults really happened mid-sample: committed progress was resumed by other workers, and
    # killed workers' leases lapsed.
    assert stats.commits == sum(report.committed for report in preempted) > NUM_NOTICES
    assert stats.resumed > NUM_NOTICES
    assert stats.expirations >= NUM_KILLS // 2
