"""Spot nodes of an attached cluster (``--address auto``): preemption watchers on each, joins and losses.

A spot VM learns that it is about to be reclaimed from its own metadata service, which only the VM can
reach (169.254.169.254 and metadata.google.internal are link-local). So every spot node runs a
`NodeWatcher` actor, pinned to it, that polls the service with the poller of
`spotlight.runtime.preemption` that fits the cloud it runs on (``runtime.cloud``, or detected from
the machine's DMI vendor), and keeps what it hears. The driver's `AttachedSpotNodes` collects the
notices every tick and hands them to `SpotPool.notify`: exactly the path of a trace notice (the
devices finish their step, commit and take no more work), and forgets the node at its deadline.

It also follows membership, which on a real cluster the autoscaler or KubeRay decides: a live node
offering ``spot`` that the pool does not know gets devices (which load the current weights, then take
rollout help and exploration like the others) and a watcher; a node that vanished without a notice
is forgotten and its calls in flight come back as lost, so their work is redone.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import RayError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from spotlight.runtime.pools import CallResult, SpotPool, spot_nodes
from spotlight.runtime.preemption import (
    AWS_METADATA_URL,
    AZURE_METADATA_URL,
    GCP_METADATA_URL,
    AwsSpotPoller,
    AzureScheduledEventsPoller,
    GcpPreemptionPoller,
)

__all__ = ["AttachedSpotNodes", "NodeWatcher", "WatchSettings", "detect_cloud", "make_poller"]

logger = logging.getLogger(__name__)

CLOUDS = ("aws", "gcp", "azure")
# What /sys/class/dmi/id/sys_vendor (or board_vendor) says on each cloud's VMs.
_DMI_VENDORS = {"amazon ec2": "aws", "google": "gcp", "microsoft corporation": "azure"}
_DMI_FILES = ("/sys/class/dmi/id/sys_vendor", "/sys/class/dmi/id/board_vendor")


@dataclass(frozen=True)
class WatchSettings:
    """How spot nodes are watched (the ``runtime`` fields ``cloud``, ``metadata_url``, ``watch_interval_s``).

    ``metadata_url``: the metadata service's base URL, default the cloud's own; ``{node_id}`` in it
    is replaced by the node's Ray id, so one test server can play every node's service.
    """

    cloud: str = "auto"
    metadata_url: str | None = None
    interval_s: float = 1.0
    membership_interval_s: float = 1.0


def detect_cloud(dmi_files: tuple[str, ...] = _DMI_FILES) -> str | None:
    """The cloud this machine runs on ("aws", "gcp", "azure") from its DMI vendor, or None.

    DMI, not a probe of the metadata addresses: reading a file costs nothing and never waits on a
    network timeout on a machine that has no metadata service.
    """
    for path in dmi_files:
        try:
            vendor = Path(path).read_text(encoding="utf-8", errors="replace").strip().lower()
        except OSError:
            continue
        for prefix, cloud in _DMI_VENDORS.items():
            if vendor.startswith(prefix):
                return cloud
    return None


def make_poller(cloud: str, base_url: str | None, node_name: str) -> Any:
    """The metadata poller of ``cloud`` for node ``node_name`` (its notices carry that name)."""
    if cloud == "aws":
        return AwsSpotPoller(base_url or AWS_METADATA_URL, node_id=node_name)
    if cloud == "gcp":
        return GcpPreemptionPoller(base_url or GCP_METADATA_URL, node_id=node_name)
    if cloud == "azure":
        return AzureScheduledEventsPoller(base_url or AZURE_METADATA_URL, node_id=node_name)
    raise ValueError(f"runtime.cloud {cloud!r}: expected one of auto, {', '.join(CLOUDS)}, none")


class NodeWatcher:
    """Polls one spot node's metadata service in a thread; `take` hands over what it heard.

    Runs on the node it watches (a Ray actor with no CPU, pinned there). A notice is kept as
    (node, deadline as wall-clock time, source), so the delay until the driver takes it does not
    shorten or lengthen the node's grace period.
    """

    def __init__(self, node_name: str, node_id: str, settings: WatchSettings) -> None:
        self.cloud = detect_cloud() if settings.cloud == "auto" else settings.cloud
        self.polls = 0
        self._notices: list[tuple[str, float, str]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        if self.cloud in CLOUDS:
            base_url = None if settings.metadata_url is None else settings.metadata_url.format(node_id=node_id)
            self._poller = make_poller(self.cloud, base_url, node_name)
            threading.Thread(target=self._watch, args=(settings.interval_s,), name="spot-watcher", daemon=True).start()

    def _watch(self, interval_s: float) -> None:
        while not self._stop.is_set():
            notices = self._poller.poll()
            seen = time.time()
            with self._lock:
                self.polls += 1
                self._notices += [(notice.node_id, seen + notice.deadline_s, notice.source) for notice in notices]
            self._stop.wait(interval_s)

    def describe(self) -> str | None:
        """The cloud being watched, or None when there is nothing to watch on this machine."""
        return self.cloud if self.cloud in CLOUDS else None

    def take(self) -> list[tuple[str, float, str]]:
        """The notices heard since the last call: (node, deadline wall-clock time, source)."""
        with self._lock:
            notices, self._notices = self._notices, []
        return notices

    def stop(self) -> None:
        self._stop.set()


NodeWatcherActor = ray.remote(NodeWatcher)


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
            if name not in self.deadlines:
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
