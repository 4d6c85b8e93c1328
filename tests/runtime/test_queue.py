"""The request queue's rules, one per test, on the plain class with a hand-driven clock; then its Ray actor."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import ray
import torch
from local_ray_node import local_ray

from spotlight.diffusion.sampler import SamplingPlan
from spotlight.runtime.queue.remote import RemoteQueue, start_queue_actor
from spotlight.runtime.queue.request_queue import QueueError, Request, RequestQueue

PLAN = SamplingPlan(num_steps=4)
TIMEOUT_S = 10.0


class Clock:
    """A clock that moves only when the test says so."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def requests(count: int, plan: SamplingPlan = PLAN) -> list[Request]:
    return [Request(f"r{index}", f"a red circle {index}", 1000 + index, plan, weights_version=0)
            for index in range(count)]


def latent(value: float) -> torch.Tensor:
    return torch.full((3, 4, 4), value)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def queue(clock: Clock) -> RequestQueue:
    queue = RequestQueue(lease_timeout_s=TIMEOUT_S, clock=clock)
    queue.submit(requests(5))
    return queue


def ids(leases: list) -> list[str]:
    return [lease.request.request_id for lease in leases]


def test_pull_leases_fresh_requests_in_submission_order_up_to_max(queue: RequestQueue, clock: Clock) -> None:
    leases = queue.pull("a", 3, weights_version=0)
    assert ids(leases) == ["r0", "r1", "r2"]
    assert all(lease.step == 0 and lease.latent is None and lease.worker_id == "a" for lease in leases)
    assert all(lease.expires_at == clock.now + TIMEOUT_S for lease in leases)
    assert ids(queue.pull("b", 10, weights_version=0)) == ["r3", "r4"]
    assert queue.pull("c", 10, weights_version=0) == []
    assert queue.leases_by_worker() == {"a": 3, "b": 2}


def test_commit_sends_the_request_to_the_front_with_its_latent_and_step(queue: RequestQueue) -> None:
    queue.pull("a", 2, weights_version=0)
    assert queue.commit("a", "r1", latent(1.5), 3, weights_version=0)
    [lease] = queue.pull("b", 1, weights_version=0)
    assert (lease.request.request_id, lease.step) == ("r1", 3)
    assert torch.equal(lease.latent, latent(1.5))
    assert queue.stats().resumed == 1 and queue.stats().commits == 1


def test_stale_commit_from_a_worker_that_lost_the_lease_is_rejected_and_changes_nothing(
    queue: RequestQueue, clock: Clock
) -> None:
    queue.pull("a", 1, weights_version=0)
    assert queue.commit("a", "r0", latent(1.0), 2, keep_lease=True, weights_version=0)
    clock.now += TIMEOUT_S
    [lease] = queue.pull("b", 1, weights_version=0)  # a's lease lapsed; b resumes from a's checkpoint
    assert (lease.request.request_id, lease.step) == ("r0", 2)
    assert not queue.commit("a", "r0", latent(9.0), 3, weights_version=0)
    assert queue.stats().stale_commits == 1
    assert queue.leases_by_worker() == {"b": 1}
    assert queue.commit("b", "r0", latent(2.0), 3, weights_version=0)
    [again] = queue.pull("c", 1, weights_version=0)
    assert again.step == 3 and torch.equal(again.latent, latent(2.0))


def test_commit_outside_the_committed_step_and_the_plan_is_refused(queue: RequestQueue) -> None:
    queue.pull("a", 1, weights_version=0)
    queue.commit("a", "r0", latent(1.0), 2, keep_lease=True, weights_version=0)
    with pytest.raises(QueueError, match="outside"):
        queue.commit("a", "r0", latent(1.0), 1, weights_version=0)  # would redo a committed step
    with pytest.raises(QueueError, match="complete"):
        queue.commit("a", "r0", latent(1.0), PLAN.num_steps, weights_version=0)


def test_second_completion_is_ignored_counted_and_never_overwrites(queue: RequestQueue, clock: Clock) -> None:
    queue.pull("a", 1, weights_version=0)
    clock.now += TIMEOUT_S
    queue.pull("b", 1, weights_version=0)  # r0 re-leased to b after a's lease lapsed
    assert queue.complete("b", "r0", latent(1.0), weights_version=0)
    assert not queue.complete("a", "r0", latent(2.0), weights_version=0)
    assert not queue.complete("b", "r0", latent(3.0), weights_version=0)
    assert torch.equal(queue.results()["r0"], latent(1.0))
    stats = queue.stats()
    assert (stats.done, stats.duplicate_completions, stats.late_completions) == (1, 2, 0)


def test_first_completion_from_a_lapsed_worker_wins_and_releases_the_new_holder(
    queue: RequestQueue, clock: Clock
) -> None:
    queue.pull("a", 1, weights_version=0)
    clock.now += TIMEOUT_S
    queue.pull("b", 1, weights_version=0)
    assert queue.complete("a", "r0", latent(1.0), weights_version=0)  # a finished after all: same pure result, keep it
    assert queue.heartbeat("b") == []  # b learns it no longer holds r0
    assert not queue.commit("b", "r0", latent(5.0), 1, weights_version=0)
    assert not queue.complete("b", "r0", latent(5.0), weights_version=0)
    assert torch.equal(queue.results()["r0"], latent(1.0))
    assert queue.stats().late_completions == 1


def test_completion_while_pending_takes_the_request_out_of_the_queue(queue: RequestQueue, clock: Clock) -> None:
    queue.pull("a", 1, weights_version=0)
    clock.now += TIMEOUT_S
    assert queue.expire() == ["r0"]
    assert queue.complete("a", "r0", latent(1.0), weights_version=0)
    assert ids(queue.pull("b", 10, weights_version=0)) == ["r1", "r2", "r3", "r4"]


def test_silent_workers_leases_expire_back_to_their_last_committed_step(queue: RequestQueue, clock: Clock) -> None:
    queue.pull("a", 2, weights_version=0)
    queue.commit("a", "r1", latent(4.0), 2, keep_lease=True, weights_version=0)
    clock.now += TIMEOUT_S - 0.5
    assert queue.expire() == []
    clock.now += 0.5
    assert queue.expire() == ["r0", "r1"]
    leases = queue.pull("b", 2, weights_version=0)
    assert [(lease.request.request_id, lease.step) for lease in leases] == [("r0", 0), ("r1", 2)]
    assert leases[0].latent is None and torch.equal(leases[1].latent, latent(4.0))
    assert queue.stats().expirations == 2


def test_heartbeat_and_pull_keep_a_workers_leases_alive(queue: RequestQueue, clock: Clock) -> None:
    queue.pull("a", 1, weights_version=0)
    queue.pull("b", 1, weights_version=0)
    for _ in range(3):
        clock.now += TIMEOUT_S - 1
        assert queue.heartbeat("a") == ["r0"]
        queue.pull("b", 0, weights_version=0)
    assert queue.expire() == []
    clock.now += TIMEOUT_S
    assert queue.heartbeat("a") == ["r0"]  # a late heartbeat still saves a lease nobody reclaimed yet
    assert queue.expire() == ["r1"]


def test_pull_reclaims_overdue_leases_before_handing_out_work(queue: RequestQueue, clock: Clock) -> None:
    queue.pull("a", 5, weights_version=0)
    clock.now += TIMEOUT_S
    assert ids(queue.pull("b", 2, weights_version=0)) == ["r0", "r1"]
    assert queue.leases_by_worker() == {"b": 2}


def test_results_are_copies_that_the_worker_cannot_change_afterwards(queue: RequestQueue) -> None:
    queue.pull("a", 1, weights_version=0)
    final = torch.zeros(2, 3, 4, 4)
    queue.complete("a", "r0", final[1], weights_version=0)
    final.fill_(7.0)
    assert torch.equal(queue.results()["r0"], torch.zeros(3, 4, 4))
    assert queue.results()["r0"].untyped_storage().nbytes() == 3 * 4 * 4 * 4  # not the batch's storage


def test_counts_follow_the_lifecycle(queue: RequestQueue) -> None:
    queue.pull("a", 3, weights_version=0)
    queue.commit("a", "r0", latent(0.0), 1, weights_version=0)
    queue.complete("a", "r1", latent(0.0), weights_version=0)
    stats = queue.stats()
    assert (stats.submitted, stats.pending, stats.leased, stats.done) == (5, 3, 1, 1)
    assert queue.remaining() == 4
    assert stats.pulls == 1 and stats.leases_granted == 3 and stats.mean_pull_s > 0


def test_protocol_violations_raise_errors_that_name_the_fix(queue: RequestQueue) -> None:
    assert queue.submit(requests(1)) == 0  # the same request again (a call retried after a restart): skipped
    with pytest.raises(QueueError, match="unique id"):
        queue.submit(requests(1, SamplingPlan(num_steps=2)))  # another request under a used id
    with pytest.raises(QueueError, match="never submitted"):
        queue.commit("a", "nope", latent(0.0), 1, weights_version=0)
    with pytest.raises(QueueError, match="without ever leasing"):
        queue.complete("a", "r0", latent(0.0), weights_version=0)
    with pytest.raises(QueueError, match="lease_timeout_s"):
        RequestQueue(lease_timeout_s=0)


def versioned(request_id: str, weights_version: int) -> Request:
    return Request(request_id, "a red circle", 7, PLAN, weights_version=weights_version)


def test_a_worker_is_leased_only_requests_for_the_weights_it_holds(clock: Clock) -> None:
    queue = RequestQueue(lease_timeout_s=TIMEOUT_S, clock=clock)
    queue.submit([versioned("v0-a", 0), versioned("v1-a", 1), versioned("v0-b", 0), versioned("v1-b", 1)])
    assert ids(queue.pull("old", 10, weights_version=0)) == ["v0-a", "v0-b"]
    assert queue.remaining(weights_version=0) == 2 and queue.remaining(weights_version=1) == 2
    assert queue.pull("old", 10, weights_version=0) == []  # θ_0 has nothing left to serve; θ_1's work waits
    assert ids(queue.pull("new", 10, weights_version=1)) == ["v1-a", "v1-b"]  # in order, untouched by the skip
    assert queue.remaining() == 4


def test_work_done_with_other_weights_is_refused_and_the_request_goes_back(clock: Clock) -> None:
    queue = RequestQueue(lease_timeout_s=TIMEOUT_S, clock=clock)
    queue.submit([versioned("r0", 1), versioned("r1", 1)])
    assert ids(queue.pull("a", 2, weights_version=1)) == ["r0", "r1"]
    assert queue.commit("a", "r0", latent(1.0), 2, weights_version=1, keep_lease=True)
    # the worker's weights changed under its leases (θ_0 now): neither its progress nor its result is taken
    assert not queue.commit("a", "r0", latent(9.0), 3, weights_version=0, keep_lease=True)
    assert not queue.complete("a", "r1", latent(9.0), weights_version=0)
    assert queue.results() == {} and queue.stats().wrong_weights == 2
    assert queue.heartbeat("a") == []  # both leases went back to the queue at once
    leases = {lease.request.request_id: lease for lease in queue.pull("b", 2, weights_version=1)}
    assert sorted(leases) == ["r0", "r1"]
    assert leases["r0"].step == 2 and torch.equal(leases["r0"].latent, latent(1.0))  # the θ_1 progress was kept
    assert queue.complete("b", "r1", latent(3.0), weights_version=1)
    assert torch.equal(queue.results()["r1"], latent(3.0))


# -- the Ray actor --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ray_node() -> Iterator[None]:
    with local_ray(num_cpus=1, resources={"on_demand": 1}):
        yield


def test_queue_actor_serves_workers_over_ray_with_tensors_intact(ray_node: None) -> None:
    handle = start_queue_actor(lease_timeout_s=TIMEOUT_S, resource="on_demand")
    try:
        queue = RemoteQueue(handle)
        ray.get(handle.submit.remote(requests(3)))
        assert ids(queue.pull("a", 2, weights_version=0)) == ["r0", "r1"]
        assert queue.commit("a", "r1", latent(2.5), 2, weights_version=0)
        [lease] = queue.pull("b", 1, weights_version=0)
        assert lease.step == 2 and torch.equal(lease.latent, latent(2.5))
        assert queue.complete("b", "r1", latent(3.0), weights_version=0)
        assert not queue.complete("b", "r1", latent(4.0), weights_version=0)
        assert queue.heartbeat("a") == ["r0"] and queue.remaining() == 2
        assert torch.equal(ray.get(handle.results.remote())["r1"], latent(3.0))
    finally:
        ray.kill(handle)


def test_queue_actor_refuses_a_resource_no_node_offers(ray_node: None) -> None:
    with pytest.raises(QueueError, match="no Ray node offers the resource 'on_demand_gpu'"):
        start_queue_actor(resource="on_demand_gpu")


def test_take_results_hands_each_result_over_once_and_a_late_duplicate_is_still_ignored(queue: RequestQueue) -> None:
    queue.pull("a", 2, weights_version=0)  # the fixture queued r0..r4
    assert queue.complete("a", "r0", latent(1.0), weights_version=0)
    taken = queue.take_results(["r0", "r1"])
    assert list(taken) == ["r0"] and torch.equal(taken["r0"], latent(1.0))
    assert queue.take_results(["r0"]) == {}  # handed over already: the queue no longer keeps it
    assert not queue.complete("a", "r0", latent(2.0), weights_version=0)  # a duplicate, not an unknown request
    assert queue.stats().duplicate_completions == 1


def test_cancelled_requests_are_never_handed_out_and_their_late_work_is_rejected(queue: RequestQueue) -> None:
    queue.pull("a", 1, weights_version=0)  # r0 leased, r1..r4 pending
    assert queue.cancel(["r0", "r1"]) == 2
    assert queue.remaining() == 3
    assert ids(queue.pull("b", 5, weights_version=0)) == ["r2", "r3", "r4"]
    assert not queue.commit("a", "r0", latent(1.0), 1, weights_version=0)  # stale: the lease went with the cancel
    assert not queue.complete("a", "r0", latent(1.0), weights_version=0)
    assert queue.results() == {} and queue.heartbeat("a") == []
    assert queue.stats().cancelled == 2
