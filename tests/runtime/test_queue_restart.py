"""The queue actor dies mid-round (Ray's kill, then its process SIGKILLed); Ray restarts it, it replays its
write-ahead log, the workers carry on with the same handle, and every request completes once, bit-identical
to the fault-free reference (``test_worker.reference``). A pull whose answer the kill lost leaves leases
the worker never learnt of; its next call reclaims them (``test_worker``'s lost-answer test pins that
down in-process; here it happens when the kill lands mid-pull)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray
from local_ray_node import local_ray
from test_worker import assert_bit_identical, make_requests, reference, settings

from spotlight.components.checkpoint import load_model
from spotlight.runtime.queue.durable import start_durable_queue_actor
from spotlight.runtime.spot.worker import DenoiseWorker, model_weights


@pytest.fixture(scope="module")
def ray_node() -> Iterator[None]:
    with local_ray(num_cpus=2, resources={"on_demand": 1, "spot": 2}):
        yield


PROGRESS_BOUND_S = 240.0  # a bound for failing on a machine too busy to run Ray at all, not a wait (local_ray_node)


def wait_for(condition: object, timeout_s: float = PROGRESS_BOUND_S) -> None:
    """Return as soon as ``condition()`` holds (under load the workers' start-up alone took 40 s)."""
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.mark.slow
def test_workers_finish_the_round_exactly_once_through_two_queue_actor_losses(
    ray_node: None, tiny_base_model: Path, tmp_path: Path
) -> None:
    model = load_model(tiny_base_model).eval()
    requests = make_requests(24)
    expected = reference(model, requests)
    log = tmp_path / "queue-log-0.jsonl"
    queue = start_durable_queue_actor(log, lease_timeout_s=30.0)
    ray.get(queue.submit.remote(requests))
    weights = ray.put(model_weights(model))
    paced = settings(capacity=4, heartbeat_s=0.2, checkpoint_every=1, min_step_s=0.15)  # work in flight at each kill
    workers = [DenoiseWorker.options(resources={"spot": 1}).remote(name, queue, model.config, weights, 0, paced)
               for name in ("a", "b")]
    runs = [worker.run.remote() for worker in workers]

    def done() -> int:
        return ray.get(queue.stats.remote()).done

    wait_for(lambda: done() >= 4)
    ray.kill(queue, no_restart=False)  # Ray kills the actor and starts it again
    wait_for(lambda: done() >= 12)
    os.kill(ray.get(queue.pid.remote()), signal.SIGKILL)  # the process dies under Ray's feet
    reports = ray.get(runs, timeout=PROGRESS_BOUND_S)

    stats = ray.get(queue.stats.remote())
    assert stats.restarts == 2 and stats.done == 24 and stats.pending == stats.leased == 0
    assert all(report.stopped_by == "drained" for report in reports)
    assert sum(report.completed for report in reports) == 24  # each request kept once, none lost
    assert stats.checkpoints > 0  # committed partial latents were part of what survived
    results = ray.get(queue.results_of.remote([r.request_id for r in requests]))
    assert_bit_identical(results, expected)
    for worker in workers:
        ray.kill(worker)
    ray.kill(queue, no_restart=True)
