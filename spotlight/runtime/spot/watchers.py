"""Preemption watchers: what runs on each spot node of an attached cluster (``--address auto``).

A spot VM learns that it is about to be reclaimed from its own metadata service, which only the VM can
reach (169.254.169.254 and metadata.google.internal are link-local). So every spot node runs a
`NodeWatcher` actor, pinned to it, that polls the service with the poller of
`spotlight.runtime.spot.preemption` that fits the cloud it runs on (``runtime.cloud``, or detected from
the machine's DMI vendor), and keeps what it hears until the driver takes it
(`spotlight.runtime.spot.attached`). The module imports neither torch nor the pools, so a watcher costs
its node one small process.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray

from spotlight.runtime.spot.preemption import (
    AWS_METADATA_URL,
    AZURE_METADATA_URL,
    GCP_METADATA_URL,
    AwsSpotPoller,
    AzureScheduledEventsPoller,
    GcpPreemptionPoller,
)

__all__ = ["NodeWatcher", "NodeWatcherActor", "WatchSettings", "detect_cloud", "make_poller"]

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
