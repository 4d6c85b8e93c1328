"""The controller's trace membership when it falls behind: a node's remove, add, remove, add read in one tick."""

from __future__ import annotations

import threading

from spotlight.market.traces import Availability, NodeEvent
from spotlight.runtime.spot.cluster import SpotCluster
from spotlight.runtime.spot.events import EventLog
from spotlight.runtime.spot.pools import PoolError
from spotlight.runtime.spot.preemption import TraceReplay


class Nodes:
    """The part of LocalCluster the controller uses: spot nodes by name, refused when added twice."""

    def __init__(self, live: set[str]) -> None:
        self.live, self.added, self.removed = set(live), [], []

    def is_live(self, name: str) -> bool:
        return name in self.live

    def add_spot_node(self, name: str) -> str:
        if name in self.live:
            raise PoolError(f"spot node {name} is already live; remove it before adding it again")
        self.live.add(name)
        self.added.append(name)
        return f"id-{name}"

    def remove_spot_node(self, name: str) -> None:
        self.live.discard(name)
        self.removed.append(name)


class Pool:
    """The part of SpotPool the controller uses, recording the calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def notify(self, node: str, deadline_s: float) -> None:
        self.calls.append(("notify", node))

    def node_removed(self, node: str) -> list:
        self.calls.append(("removed", node))
        return []

    def node_added(self, node: str, node_id: str) -> None:
        self.calls.append(("added", node))


def test_a_controller_that_falls_behind_replays_a_node_cycling_twice_as_one_removal_and_one_return() -> None:
    clock = [0.0]
    trace = Availability((NodeEvent(0.0, "add", "node0"), NodeEvent(0.0, "add", "node1"),
                          NodeEvent(1.0, "remove", "node0"), NodeEvent(2.0, "add", "node0"),
                          NodeEvent(3.0, "remove", "node0"), NodeEvent(4.0, "add", "node0"),
                          NodeEvent(8.0, "remove", "node1"), NodeEvent(9.0, "add", "node1")), 10.0)
    cluster = SpotCluster.__new__(SpotCluster)  # the controller's state only: no Ray
    cluster.cluster, cluster.pool, cluster.attached, cluster.elastic = Nodes({"node0", "node1"}), Pool(), None, None
    cluster.events, cluster.lock, cluster.removals, cluster.joining = EventLog(None), threading.RLock(), {}, []
    cluster.now = lambda: clock[0]
    cluster.trace = TraceReplay(trace, grace_s=0.5, clock=cluster.now)
    cluster.trace.returns()  # the nodes of t = 0 are up

    clock[0] = 5.0  # one tick after a 5 s stall
    cluster._membership()
    assert cluster.cluster.removed == ["node0"] and cluster.cluster.added == ["node0"]
    assert cluster.joining == [] and cluster.events.count("node_add_failed") == 0

    clock[0] = 9.5  # later joins are not held up
    cluster._membership()
    assert cluster.cluster.added == ["node0", "node1"] and cluster.cluster.live == {"node0", "node1"}
