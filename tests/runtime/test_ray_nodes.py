"""Waiting for a Ray node: on its readiness (alive in the GCS), for the caller's time, failing at once if it died.

A fake cluster and node stand in for Ray's, so the test pins the waiting rule itself in milliseconds;
tests/runtime/test_ray_listening.py and the runtime tests start real nodes through it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import pytest

from spotlight.runtime.spot.ray_nodes import NodeStartError, patient_start, start_node, wait_until_alive


@dataclass
class FakeState:
    """A GCS node table in which the node appears (alive) after ``alive_after`` reads."""

    node_id: str
    alive_after: int
    reads: int = 0

    def node_table(self) -> list[dict[str, Any]]:
        self.reads += 1
        if self.reads == 1:
            raise ConnectionError("GCS not up yet")  # a first read can fail while the GCS starts
        return [{"NodeID": self.node_id, "Alive": self.reads > self.alive_after}]


@dataclass
class FakeNode:
    node_id: str = "n1"
    dead: list[tuple[str, Any]] = field(default_factory=list)

    def dead_processes(self) -> list[tuple[str, Any]]:
        return self.dead

    def get_logs_dir_path(self) -> str:
        return "/tmp/ray/session_x/logs"


@dataclass
class FakeCluster:
    node: FakeNode
    global_state: FakeState
    removed: list[FakeNode] = field(default_factory=list)

    def add_node(self, wait: bool, **node_args: Any) -> FakeNode:
        assert wait is False  # Ray's own fixed 30 s wait is never used
        return self.node

    def remove_node(self, node: FakeNode, allow_graceful: bool) -> None:
        self.removed.append(node)


def test_a_slow_node_is_awaited_past_rays_fixed_wait_until_it_is_alive() -> None:
    cluster = FakeCluster(FakeNode(), FakeState("n1", alive_after=20))
    assert start_node(cluster, timeout_s=60, what="the head") is cluster.node
    assert cluster.global_state.reads == 21 and not cluster.removed


def test_a_node_that_never_joins_fails_at_the_callers_deadline_and_is_removed() -> None:
    cluster = FakeCluster(FakeNode(), FakeState("n1", alive_after=10**9))
    started = time.monotonic()
    with pytest.raises(NodeStartError, match=r"spot node a did not join within 0 s.*runtime.node_timeout_s"):
        start_node(cluster, timeout_s=0.2, what="spot node a")
    assert 0.2 <= time.monotonic() - started < 5.0
    assert cluster.removed == [cluster.node]


def test_a_node_whose_processes_died_fails_at_once_naming_them() -> None:
    node = FakeNode(dead=[("raylet", None)])
    started = time.monotonic()
    with pytest.raises(NodeStartError, match=r"Ray's raylet exited while starting; its log is in /tmp/ray"):
        wait_until_alive(FakeCluster(node, FakeState("n1", alive_after=10**9)), node, 60, "the head")
    assert time.monotonic() - started < 5.0  # not the 60 s deadline


def test_inside_patient_start_rays_registration_poll_waits_instead_of_failing(monkeypatch: pytest.MonkeyPatch) -> None:
    import ray._private.services as ray_services

    answers = iter([RuntimeError("not registered")] * 5 + [{"node_id": "n1"}])

    def registers_after_five_polls(gcs_address: str, node_id: str) -> dict[str, str]:
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(ray_services, "get_node", registers_after_five_polls)
    with patient_start(timeout_s=60):
        assert ray_services.get_node("127.0.0.1:1", "n1") == {"node_id": "n1"}  # one call, as Ray's loop makes
    assert ray_services.get_node is registers_after_five_polls  # Ray's own poll again outside the block


def test_patient_start_gives_up_at_its_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    import ray._private.services as ray_services

    def never_registers(gcs_address: str, node_id: str) -> None:
        raise RuntimeError("not registered")

    monkeypatch.setattr(ray_services, "get_node", never_registers)
    started = time.monotonic()
    with patient_start(timeout_s=0.3), pytest.raises(RuntimeError, match="not registered"):
        ray_services.get_node("127.0.0.1:1", "n1")
    assert 0.3 <= time.monotonic() - started < 5.0


def test_rays_node_start_still_polls_the_function_patient_start_wraps() -> None:
    # patient_start relies on Ray's Node constructor polling services.get_node under a fixed 30 s budget;
    # a Ray upgrade that changes this fails here, not as a flaky start-up under load.
    import inspect

    import ray._private.node

    source = inspect.getsource(ray._private.node.Node.__init__)
    assert "ray._private.services.get_node(" in source and "raylet_start_wait_time_s" in source
