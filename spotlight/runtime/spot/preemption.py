"""Preemption sources: where the news that a spot node is about to go comes from.

Every source answers one question, ``poll() -> list[Notice]``: which nodes have been told, since the
last poll, that they will be taken away, and how many seconds they have left. Whoever polls (the
driver locally, a node agent on a real cluster) tells the node's workers to commit, and the queue
hands their requests to the survivors.

- `TraceReplay` replays a spot trace (`spotlight.market.traces.Availability`) against a clock: a notice
  ``grace_s`` before each removal, and a `NodeReturn` when a node joins again, so a local cluster of
  logical nodes lives through a real cloud's churn.
- `AwsSpotPoller`, `GcpPreemptionPoller`, `AzureScheduledEventsPoller` read the cloud's instance
  metadata service, as the node itself sees it. A metadata hiccup (timeout, refused connection,
  garbage) reads as "no notice" with a logged warning: a worker must never die of its own watchdog.
  Each notice is reported once, although the services keep answering with it until the end.
"""

from __future__ import annotations

import json
import logging
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from typing import Protocol

from spotlight.http_fetch import FetchError, fetch
from spotlight.market.traces import Availability

__all__ = [
    "AWS_METADATA_URL",
    "AZURE_METADATA_URL",
    "AwsSpotPoller",
    "AzureScheduledEventsPoller",
    "GCP_METADATA_URL",
    "GcpPreemptionPoller",
    "NodeReturn",
    "Notice",
    "PreemptionSource",
    "TraceReplay",
]

logger = logging.getLogger(__name__)

AWS_METADATA_URL = "http://169.254.169.254"
GCP_METADATA_URL = "http://metadata.google.internal"
AZURE_METADATA_URL = "http://169.254.169.254"
GCP_NOTICE_S = 30.0  # GCE gives a preempted VM 30 s; its metadata does not say when they started


@dataclass(frozen=True)
class Notice:
    """Node ``node_id`` will be taken away ``deadline_s`` seconds after the poll that reported it.

    ``source`` names where the notice came from ("trace", "aws", "gcp", "azure").
    """

    node_id: str
    deadline_s: float
    source: str


@dataclass(frozen=True)
class NodeReturn:
    """Node ``node_id`` (re)joined: the caller may start workers on it again."""

    node_id: str
    source: str


class PreemptionSource(Protocol):
    """Anything that reports preemption notices."""

    def poll(self) -> list[Notice]:
        """The notices that arrived since the last poll (each reported once)."""
        ...


class TraceReplay:
    """Replay a spot trace in real time: notices ``grace_s`` before each removal, returns at each add.

    Trace time ``t`` happens at ``time_scale * t`` seconds of ``clock`` after construction (the
    convention of `Availability.scaled`: ``time_scale=1/60`` replays an hour in a minute); ``grace_s``
    is in replay seconds. A node's notice never comes before the node joined, so a node that lives
    less than ``grace_s`` gets its notice when it joins, with a shorter deadline. The trace's node
    names are the notices' node ids. The caller removes the node when the deadline passes, which
    keeps the live count that of the trace.
    """

    source = "trace"

    def __init__(
        self,
        availability: Availability,
        time_scale: float = 1.0,
        grace_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not time_scale > 0:
            raise ValueError(f"time_scale must be > 0 (got {time_scale})")
        if grace_s < 0:
            raise ValueError(f"grace_s must be ≥ 0 seconds (got {grace_s})")
        self._clock = clock
        self._start = clock()
        joined: dict[str, float] = {}
        removals: list[tuple[float, float, str]] = []  # (notice at, removal at, node), replay seconds
        returns: list[tuple[float, str]] = []
        for event in availability.events:
            at = event.time_s * time_scale
            if event.kind == "add":
                joined[event.node] = at
                returns.append((at, event.node))
            else:
                removals.append((max(joined.get(event.node, 0.0), at - grace_s), at, event.node))
        self._removals = sorted(removals, key=lambda item: item[0])  # stable: trace order on ties
        self._returns = returns
        self._next_removal = 0
        self._next_return = 0

    def elapsed_s(self) -> float:
        """Replay seconds since construction."""
        return self._clock() - self._start

    def poll(self) -> list[Notice]:
        """Notices whose time has come since the last poll, in time order."""
        now = self.elapsed_s()
        notices = []
        while self._next_removal < len(self._removals) and self._removals[self._next_removal][0] <= now:
            _, removal_at, node = self._removals[self._next_removal]
            notices.append(Notice(node, max(0.0, removal_at - now), self.source))
            self._next_removal += 1
        return notices

    def returns(self) -> list[NodeReturn]:
        """Nodes that joined (including the trace's first nodes at time 0) since the last call."""
        now = self.elapsed_s()
        joined = []
        while self._next_return < len(self._returns) and self._returns[self._next_return][0] <= now:
            joined.append(NodeReturn(self._returns[self._next_return][1], self.source))
            self._next_return += 1
        return joined

    @property
    def finished(self) -> bool:
        """Whether every notice and return of the trace has been reported."""
        return self._next_removal == len(self._removals) and self._next_return == len(self._returns)


MAX_METADATA_BYTES = 64 * 1024  # the services answer a few hundred bytes; more is not a metadata service


class _MetadataPoller:
    """HTTP plumbing shared by the cloud pollers: a total deadline per request (an endpoint that drips its
    answer cannot hold the poll), a capped answer, errors as warnings once per streak."""

    source = "metadata"

    def __init__(self, base_url: str, node_id: str | None, timeout_s: float, wall_clock: Callable[[], float]) -> None:
        self.base_url = base_url.rstrip("/")
        self.node_id = node_id or socket.gethostname()
        self.timeout_s = timeout_s
        self.errors = 0
        self._wall_clock = wall_clock
        self._failing = False

    def _request(
        self, path: str, headers: Mapping[str, str], method: str = "GET"
    ) -> tuple[int, str] | None:
        """Returns (HTTP status, body), or None (after a warning) if the service could not be read."""
        try:
            response = fetch(self.base_url + path, method=method, headers=dict(headers), deadline_s=self.timeout_s,
                             max_body_bytes=MAX_METADATA_BYTES)
        except FetchError as error:  # refused, reset, past the deadline, too large, bad URL
            self._warn(f"cannot read {self.base_url + path} ({error})")
            return None
        return response.status, response.body.decode("utf-8", "replace")

    def _warn(self, message: str) -> None:
        """Count the failure; log it once per run of failures so a dead endpoint does not flood the log."""
        self.errors += 1
        if not self._failing:
            logger.warning("%s preemption poller on %s: %s; treating as no notice", self.source, self.node_id, message)
        self._failing = True

    def _healthy(self) -> None:
        """A poll read a well-formed answer: the streak of failures, if any, has ended.

        Only a well-formed answer ends it: a service answering HTTP 500 on every poll is one streak,
        logged once, not a warning per poll.
        """
        self._failing = False


class AwsSpotPoller(_MetadataPoller):
    """EC2 spot interruption notices from IMDSv2 (``/latest/meta-data/spot/instance-action``).

    The service answers 404 until AWS decides to reclaim the instance, then 200 with
    ``{"action": "terminate" | "stop" | "hibernate", "time": "<ISO 8601 UTC>"}`` about two minutes
    ahead. IMDSv2 wants a session token (PUT ``/latest/api/token``) on every read; a 401 means the
    token expired, so it is renewed once.
    """

    source = "aws"
    TOKEN_PATH = "/latest/api/token"
    ACTION_PATH = "/latest/meta-data/spot/instance-action"

    def __init__(
        self,
        base_url: str = AWS_METADATA_URL,
        node_id: str | None = None,
        timeout_s: float = 1.0,
        token_ttl_s: int = 21600,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(base_url, node_id, timeout_s, wall_clock)
        self.token_ttl_s = token_ttl_s
        self._token: str | None = None
        self._reported: tuple[str, str] | None = None

    def poll(self) -> list[Notice]:
        """A notice the first time an instance action appears; [] otherwise or on errors."""
        answer = self._read_action()
        if answer is None:
            return []
        status, body = answer
        if status == 404:
            self._healthy()
            return []
        if status != 200:
            self._warn(f"{self.ACTION_PATH} answered HTTP {status}")
            return []
        try:
            action = json.loads(body)
            key = (str(action["action"]), str(action["time"]))
            when = datetime.fromisoformat(key[1].replace("Z", "+00:00"))
        except (ValueError, KeyError, TypeError) as error:
            self._warn(f"unreadable instance-action {body[:200]!r} ({error})")
            return []
        self._healthy()
        if key == self._reported:
            return []
        self._reported = key
        if when.tzinfo is None:
            when = when.replace(tzinfo=timezone.utc)
        return [Notice(self.node_id, max(0.0, when.timestamp() - self._wall_clock()), self.source)]

    def _read_action(self) -> tuple[int, str] | None:
        for _ in range(2):
            if self._token is None:
                answer = self._request(
                    self.TOKEN_PATH, {"X-aws-ec2-metadata-token-ttl-seconds": str(self.token_ttl_s)}, "PUT"
                )
                if answer is None:
                    return None
                if answer[0] != 200:
                    self._warn(f"IMDSv2 token request answered HTTP {answer[0]}")
                    return None
                self._token = answer[1].strip()
            answer = self._request(self.ACTION_PATH, {"X-aws-ec2-metadata-token": self._token})
            if answer is None or answer[0] != 401:
                return answer
            self._token = None  # expired: renew once
        return answer


class GcpPreemptionPoller(_MetadataPoller):
    """GCE preemption from ``/computeMetadata/v1/instance/preempted`` ("TRUE" / "FALSE").

    The metadata server refuses requests without ``Metadata-Flavor: Google``. A preempted (spot) VM
    has 30 s from the moment the flag turns TRUE; the flag does not say when that was, so the
    deadline reported is that upper bound. One notice per FALSE -> TRUE change.
    """

    source = "gcp"
    PATH = "/computeMetadata/v1/instance/preempted"

    def __init__(
        self,
        base_url: str = GCP_METADATA_URL,
        node_id: str | None = None,
        timeout_s: float = 1.0,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(base_url, node_id, timeout_s, wall_clock)
        self._preempted = False

    def poll(self) -> list[Notice]:
        """A notice when the flag first reads TRUE; [] otherwise or on errors."""
        answer = self._request(self.PATH, {"Metadata-Flavor": "Google"})
        if answer is None:
            return []
        status, body = answer
        flag = body.strip().upper()
        if status != 200 or flag not in ("TRUE", "FALSE"):
            self._warn(f"{self.PATH} answered HTTP {status} {body[:200]!r}")
            return []
        self._healthy()
        was_preempted, self._preempted = self._preempted, flag == "TRUE"
        if self._preempted and not was_preempted:
            return [Notice(self.node_id, GCP_NOTICE_S, self.source)]
        return []


class AzureScheduledEventsPoller(_MetadataPoller):
    """Azure Spot evictions from Scheduled Events (``/metadata/scheduledevents``, api 2020-07-01).

    The service wants ``Metadata: true`` and answers ``{"DocumentIncarnation": n, "Events": [...]}``;
    an eviction is an event with ``"EventType": "Preempt"`` whose ``Resources`` list the VM names
    and whose ``NotBefore`` (RFC 1123) is when it may happen; a blank one means it has begun
    (deadline 0). With
    ``resource_name`` set, only events naming that VM count. One notice per ``EventId``.
    """

    source = "azure"
    PATH = "/metadata/scheduledevents?api-version=2020-07-01"

    def __init__(
        self,
        base_url: str = AZURE_METADATA_URL,
        node_id: str | None = None,
        resource_name: str | None = None,
        timeout_s: float = 1.0,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(base_url, node_id, timeout_s, wall_clock)
        self.resource_name = resource_name
        self._reported: set[str] = set()

    def poll(self) -> list[Notice]:
        """A notice for each Preempt event not reported before; [] otherwise or on errors."""
        answer = self._request(self.PATH, {"Metadata": "true"})
        if answer is None:
            return []
        status, body = answer
        if status != 200:
            self._warn(f"scheduled events answered HTTP {status} {body[:200]!r}")
            return []
        try:
            evictions = {}
            for event in json.loads(body)["Events"]:
                if event["EventType"] != "Preempt" or event["EventId"] in self._reported:
                    continue
                if self.resource_name is not None and self.resource_name not in event.get("Resources", []):
                    continue
                not_before = event.get("NotBefore") or ""  # blank: the eviction has started
                starts_at = parsedate_to_datetime(not_before).timestamp() if not_before else self._wall_clock()
                evictions[event["EventId"]] = starts_at
        except (ValueError, KeyError, TypeError) as error:
            self._warn(f"unreadable scheduled events {body[:200]!r} ({error})")
            return []
        self._healthy()
        self._reported.update(evictions)
        now = self._wall_clock()
        return [Notice(self.node_id, max(0.0, starts_at - now), self.source) for starts_at in evictions.values()]
