"""The driver's follower of an attached cluster's spot nodes: notices, joins and losses (``--address auto``).

`AttachedSpotNodes` starts a `spotlight.runtime.spot.watchers.NodeWatcher` on every spot node, collects
their notices every tick and hands them to `SpotPool.notify`: exactly the path of a trace notice (the
devices finish their step, commit and take no more work); the node is forgotten at its deadline.

It also follows membership, which on a real cluster the autoscaler or KubeRay decides: a live node
offering ``spot`` that the pool does not know gets devices (which load the current weights, then take
rollout help and exploration like the others) and a watcher; a node that vanished without a notice
is one warning line, it is forgotten and its calls in flight come back as lost, so their work is redone.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.exceptions import RayError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from spotlight.runtime.spot.pools import CallResult, SpotPool, spot_nodes
from spotlight.runtime.spot.watchers import NodeWatcherActor, WatchSettings

__all__ = ["AttachedSpotNodes"]

logger = logging.getLogger(__name__)


@dataclass
class AttachedSpotNodes:
    """The driver's follower of an attached cluster's spot nodes (see the module docstring).

    ``pool`` gets every join (`node_added`), notice (`notify`) and loss (`node_removed`), and its
    event log the ``node_drained`` / ``node_lost`` rows; ``clock`` is the run's clock. Call `poll`
    from the controller thread; it returns the calls lost with nodes.
    """

    pool: SpotPool
    settings: WatchSettings
    clock: Callable[[], float]
    watchers: dict[str, Any] = field(default_factory=dict)  # node name -> NodeWatcher actor
    node_ids: dict[str, str] = field(default_factory=dict)
    deadlines: dict[str, float] = field(default_factory=dict)  # noticed node -> removal time (run clock)
    noticed_at: dict[str, float] = field(default_factory=dict)
    retired: set[str] = field(default_factory=set)  # node ids noticed or lost: never re-added
    _takes: dict[Any, str] = field(default_factory=dict)  # take() call in flight -> node
    _last_membership: float = -1e9
    _last_take: float = -1e9

    def node_joined(self, name: str, node_id: str, devices: int) -> None:
        """Start ``devices`` spot devices and a watcher on a node the pool does not know yet."""
        self.pool.node_added(name, node_id, devices)
        self.watch(name, node_id)

    def watch(self, name: str, node_id: str) -> None:
        """Start the watcher of a node whose devices the pool already runs."""
        self.node_ids[name] = node_id
        self.watchers[name] = NodeWatcherActor.options(
            num_cpus=0, max_restarts=0, scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
        ).remote(name, node_id, self.settings)

    def poll(self) -> list[CallResult]:
        """One tick: take notices, drop nodes at their deadline or when gone, add nodes that joined."""
        now = self.clock()
        lost: list[CallResult] = []
        if now - self._last_take >= self.settings.interval_s / 2:
            self._last_take = now
            self._take_notices()
        for name in [n for n, at in self.deadlines.items() if at <= now]:
            lost += self._forget(name, "node_removed")
        for name in [n for n in self.noticed_at if n in self.node_ids and not self.pool.node_busy(n)]:
            after_notice_s = round(now - self.noticed_at.pop(name), 3)  # its devices committed and stopped
            self.pool.events.write(now, "node_drained", node=name, after_notice_s=after_notice_s)
        if now - self._last_membership >= self.settings.membership_interval_s:
            self._last_membership = now
            lost += self._follow_membership()
        return lost

    def close(self) -> None:
        """Stop every watcher (end of the run)."""
        for name in list(self.watchers):
            self._stop_watcher(name)

    def _take_notices(self) -> None:
        for name, watcher in self.watchers.items():
            if name not in self._takes.values():
                self._takes[watcher.take.remote()] = name
        if not self._takes:
            return
        done, _ = ray.wait(list(self._takes), num_returns=len(self._takes), timeout=0)
        for ref in done:
            name = self._takes.pop(ref)
            try:
                notices = ray.get(ref)
            except RayError:  # the node went with its watcher; membership notices the loss
                continue
            for _, deadline_at, source in notices:
                if name in self.deadlines or name not in self.node_ids:
                    continue
                deadline_s = max(0.0, deadline_at - time.time())
                now = self.clock()
                logger.info("spot node %s: %s preemption notice, %.1f s left", name, source, deadline_s)
                self.pool.notify(name, deadline_s)
                self.deadlines[name] = now + deadline_s
                self.noticed_at[name] = now
                self.retired.add(self.node_ids[name])

    def _follow_membership(self) -> list[CallResult]:
        live = spot_nodes()
        live_ids = {node_id for node_id, _ in live.values()}
        lost: list[CallResult] = []
        for name in [n for n, node_id in self.node_ids.items() if node_id not in live_ids]:
            if name not in self.deadlines and name not in self.pool.lost_nodes:  # one line per node
                self.pool.lost_nodes.add(name)
                logger.warning("spot node %s left the cluster without a preemption notice; its work is redone", name)
            lost += self._forget(name, "node_lost" if name not in self.deadlines else "node_removed")
        for name, (node_id, devices) in live.items():
            if name not in self.node_ids and node_id not in self.retired:
                self.node_joined(name, node_id, devices)
        return lost

    def _forget(self, name: str, kind: str) -> list[CallResult]:
        self.deadlines.pop(name, None)
        self.retired.add(self.node_ids.pop(name))
        self._stop_watcher(name)
        if kind == "node_lost":
            self.pool.events.write(self.clock(), "node_lost", node=name)
        return self.pool.node_removed(name)

    def _stop_watcher(self, name: str) -> None:
        watcher = self.watchers.pop(name, None)
        if watcher is not None:
            ray.kill(watcher, no_restart=True)
