"""The disaggregated unit queue (plain Python, no Ray): which unit a generator gets, with which weights."""

from __future__ import annotations

from spotlight.disagg.runtime.queue import Task, UnitQueue
from spotlight.disagg.versions import VersionGate


def units(step: int, count: int) -> list[Task]:
    return [Task("rollout", step, index) for index in range(count)]


def test_a_unit_waits_for_its_steps_weights_when_strictly_on_policy():
    queue = UnitQueue(VersionGate(async_one_step=False))
    queue.submit(units(0, 1) + units(1, 1))
    assert queue.pull("g", 0.0) is None  # nothing published yet
    queue.publish(0, ["w0"])
    task, version, weights = queue.pull("g", 0.0)
    assert (task.step, version, weights) == (0, 0, ["w0"])
    assert queue.pull("g", 0.0) is None  # step 1's unit needs θ_1
    queue.publish(1, ["w1"])
    task, version, _ = queue.pull("g", 0.0)
    assert (task.step, version) == (1, 1)


def test_with_one_step_async_the_next_steps_units_start_with_weights_one_version_old():
    queue = UnitQueue(VersionGate(async_one_step=True))
    queue.publish(0, ["w0"])
    queue.submit(units(0, 1) + units(1, 2) + units(2, 1))
    assert [queue.pull("g", 0.0)[1] for _ in range(3)] == [0, 0, 0]  # step 1 runs ahead on θ_0
    assert queue.pull("g", 0.0) is None  # step 2 may not start with θ_0 (two versions old)
    queue.publish(1, ["w1"])
    queue.publish(2, ["w2"])
    task, version, weights = queue.pull("g", 0.0)
    assert (task.step, version, weights) == (2, 2, ["w2"])  # the newest allowed version
    assert sorted(queue._weights) == [1, 2]  # older snapshots are dropped


def test_exploration_runs_only_when_no_unit_may_start_and_tag_takes_unstarted_units():
    queue = UnitQueue(VersionGate(async_one_step=False))
    queue.publish(0, ["w0"])
    queue.submit(units(0, 3) + [Task("explore", 1, 0)])
    assert queue.take(0, 2) == units(0, 2)  # the trainer draws two units itself (TAG)
    assert queue.pull("g", 0.0)[0] == units(0, 3)[2]
    task, version, _ = queue.pull("g", 0.0)
    assert (task.kind, task.step, version) == ("explore", 1, 0)  # θ_0 explores step 1's prompts
    queue.submit([Task("explore", 1, 1)])
    assert queue.cancel_explore(1) == 1
    queue.push("g", {"kind": "rollout"})
    state = queue.results(0.0)
    assert state["results"] == [{"kind": "rollout"}] and state["unstarted"] == {}
    queue.close()
    assert queue.pull("g", 0.0) == "stop"


def test_a_closed_queue_reopened_for_the_next_run_holds_nothing_of_the_last_and_serves_again():
    """A lent cluster keeps its queue actor between runs: reopened, it forgets the last run's weights, units,
    results and busy generators, and serves under the new run's gate."""
    queue = UnitQueue(VersionGate(async_one_step=True))
    queue.publish(0, ["w0"])
    queue.submit(units(0, 1) + units(1, 2))
    queue.pull("k", 0.0)  # k is busy
    queue.push("h", {"kind": "rollout"})
    queue.close()
    assert queue.pull("g", 0.0) == "stop"

    queue.reopen(VersionGate(async_one_step=False))
    state = queue.results(0.0)
    assert (state["results"], state["unstarted"], state["busy_since"]) == ([], {}, {})
    assert queue.pull("g", 0.0) is None  # open again, with nothing published or queued
    queue.submit(units(1, 1))
    queue.publish(0, ["v0"])
    assert queue.pull("g", 0.0) is None  # strictly on-policy now: step 1's unit waits for θ_1
    queue.publish(1, ["v1"])
    task, version, weights = queue.pull("g", 0.0)
    assert (task.step, version, weights) == (1, 1, ["v1"])
