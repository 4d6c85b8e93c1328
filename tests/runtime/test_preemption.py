"""Preemption sources: trace replay on a hand-driven clock; the cloud pollers against real local HTTP
servers that play each metadata service (first no notice, then a notice) and, like the real ones,
refuse requests without the service's header or token."""

from __future__ import annotations

import logging
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from email.utils import format_datetime
from http.server import BaseHTTPRequestHandler

import pytest
from metadata_services import AwsImds, AzureScheduledEvents, FakeMetadata, GcpMetadata, iso

from spotlight.market.traces import Availability, NodeEvent, poisson_trace
from spotlight.runtime.spot.preemption import (
    AwsSpotPoller,
    AzureScheduledEventsPoller,
    GcpPreemptionPoller,
    NodeReturn,
    Notice,
    TraceReplay,
)

NOW = 1_750_000_000.0  # the pollers' wall clock in these tests (epoch seconds)


class Clock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


# -- trace replay ---------------------------------------------------------------------------------


def test_trace_replay_gives_notices_grace_before_removals_and_returns_at_adds() -> None:
    trace = Availability(
        (
            NodeEvent(0.0, "add", "node0"), NodeEvent(0.0, "add", "node1"), NodeEvent(10.0, "remove", "node0"),
            NodeEvent(20.0, "add", "node0"), NodeEvent(30.0, "remove", "node1"),
        ),
        duration_s=40.0,
    )
    clock = Clock()
    replay = TraceReplay(trace, time_scale=0.125, grace_s=0.5, clock=clock)  # binary-exact times
    assert replay.poll() == [] and replay.returns() == [NodeReturn("node0", "trace"), NodeReturn("node1", "trace")]
    clock.now += 0.5
    assert replay.poll() == []
    clock.now += 0.25  # node0 goes at 1.25 s: its notice comes at 0.75 s
    assert replay.poll() == [Notice("node0", 0.5, "trace")]
    assert replay.poll() == []  # each notice once
    clock.now += 1.75
    assert replay.returns() == [NodeReturn("node0", "trace")]
    assert not replay.finished
    clock.now += 0.875
    assert replay.poll() == [Notice("node1", 0.375, "trace")]
    assert replay.finished


def test_trace_replay_never_warns_a_node_before_it_joined() -> None:
    trace = Availability((NodeEvent(1.0, "add", "node3"), NodeEvent(1.2, "remove", "node3")), duration_s=2.0)
    clock = Clock()
    replay = TraceReplay(trace, grace_s=0.5, clock=clock)
    clock.now += 0.875
    assert replay.poll() == []
    clock.now += 0.125
    assert replay.poll() == [Notice("node3", pytest.approx(0.2), "trace")]


def test_trace_replay_reports_every_preemption_of_a_trace_exactly_once() -> None:
    trace = poisson_trace(num_nodes=4, mean_lifetime_s=30.0, mean_restart_s=10.0, duration_s=600.0, seed=3)
    clock = Clock()
    replay = TraceReplay(trace, time_scale=1 / 60, grace_s=0.2, clock=clock)
    notices = []
    for _ in range(120):  # 12 replay seconds in 0.1 s ticks: the 10-minute trace and then some
        clock.now += 0.1
        notices += replay.poll()
    removals = [event for event in trace.events if event.kind == "remove"]
    assert len(notices) == trace.preemption_count == len(removals) > 10
    assert sorted(n.node_id for n in notices) == sorted(e.node for e in removals)
    assert all(0.0 <= notice.deadline_s <= 0.2 for notice in notices)


# -- fake metadata services -----------------------------------------------------------------------


def raw_get(url: str, headers: dict[str, str] | None = None) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=2) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


Respond = Callable[[BaseHTTPRequestHandler], tuple[int, str]]
Serve = Callable[[Respond], FakeMetadata]


@pytest.fixture
def serve() -> Iterator[Serve]:
    """Start fake services for one test (``serve(service.respond)``); all are closed after it."""
    servers: list[FakeMetadata] = []

    def start(respond: Respond) -> FakeMetadata:
        servers.append(FakeMetadata(respond))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def test_aws_poller_reports_an_instance_action_once_with_its_deadline(serve: Serve) -> None:
    service = AwsImds()
    server = serve(service.respond)
    assert raw_get(server.url + AwsSpotPoller.ACTION_PATH) == 401  # the fake, like IMDSv2, wants a token
    poller = AwsSpotPoller(server.url, node_id="spot-1", wall_clock=lambda: NOW)
    assert poller.poll() == []
    service.action = {"action": "terminate", "time": iso(NOW + 120)}
    assert poller.poll() == [Notice("spot-1", 120.0, "aws")]
    assert poller.poll() == []
    assert service.issued == 1 and poller.errors == 0  # one token serves every poll


def test_aws_poller_renews_an_expired_token(serve: Serve) -> None:
    service = AwsImds()
    server = serve(service.respond)
    poller = AwsSpotPoller(server.url, node_id="spot-1", wall_clock=lambda: NOW)
    assert poller.poll() == []
    service.tokens.clear()  # the session token expired
    service.action = {"action": "stop", "time": iso(NOW + 90)}
    assert poller.poll() == [Notice("spot-1", 90.0, "aws")]
    assert service.issued == 2 and poller.errors == 0


def test_gcp_poller_reports_each_change_to_preempted(serve: Serve) -> None:
    service = GcpMetadata()
    server = serve(service.respond)
    assert raw_get(server.url + GcpPreemptionPoller.PATH) == 403  # the header is required
    poller = GcpPreemptionPoller(server.url, node_id="spot-2")
    assert poller.poll() == []
    service.preempted = "TRUE"
    assert poller.poll() == [Notice("spot-2", 30.0, "gcp")]
    assert poller.poll() == []
    service.preempted = "FALSE"
    assert poller.poll() == []
    service.preempted = "TRUE"
    assert poller.poll() == [Notice("spot-2", 30.0, "gcp")]


def test_azure_poller_reports_each_preempt_event_for_its_vm_once(serve: Serve) -> None:
    service = AzureScheduledEvents()
    server = serve(service.respond)
    assert raw_get(server.url + AzureScheduledEventsPoller.PATH) == 400  # the header is required
    poller = AzureScheduledEventsPoller(server.url, node_id="spot-3", resource_name="vm3", wall_clock=lambda: NOW)
    assert poller.poll() == []
    not_before = format_datetime(datetime.fromtimestamp(NOW + 45, tz=timezone.utc), usegmt=True)
    service.events = [
        {"EventId": "A", "EventType": "Freeze", "Resources": ["vm3"], "NotBefore": not_before},
        {"EventId": "B", "EventType": "Preempt", "Resources": ["vm9"], "NotBefore": not_before},
    ]
    assert poller.poll() == []  # a freeze is no eviction; vm9's eviction is not ours
    service.events.append({"EventId": "C", "EventType": "Preempt", "Resources": ["vm3"], "NotBefore": not_before})
    assert poller.poll() == [Notice("spot-3", 45.0, "azure")]
    assert poller.poll() == []
    service.events.append({"EventId": "D", "EventType": "Preempt", "Resources": ["vm3"], "NotBefore": ""})
    assert poller.poll() == [Notice("spot-3", 0.0, "azure")]  # blank NotBefore: already under way


def test_an_unreachable_service_reads_as_no_notice_with_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    server = FakeMetadata(lambda request: (200, "FALSE"))
    url = server.url
    server.close()  # nothing listens on the port any more
    poller = GcpPreemptionPoller(url, node_id="spot-4", timeout_s=0.5)
    with caplog.at_level(logging.WARNING, logger="spotlight.runtime.spot.preemption"):
        assert poller.poll() == [] and poller.poll() == []
    assert poller.errors == 2
    assert len(caplog.records) == 1 and "no notice" in caplog.records[0].getMessage()


def test_a_slow_or_confused_service_reads_as_no_notice(serve: Serve, caplog: pytest.LogCaptureFixture) -> None:
    def slow(request: BaseHTTPRequestHandler) -> tuple[int, str]:
        time.sleep(1.0)
        return 200, "TRUE"

    server = serve(slow)
    garbage = serve(lambda request: (200, "{not json"))
    with caplog.at_level(logging.WARNING, logger="spotlight.runtime.spot.preemption"):
        started = time.perf_counter()
        assert GcpPreemptionPoller(server.url, timeout_s=0.2).poll() == []
        assert time.perf_counter() - started < 0.9
        assert AzureScheduledEventsPoller(garbage.url).poll() == []
        assert AwsSpotPoller(garbage.url).poll() == []
    messages = [record.getMessage() for record in caplog.records]
    assert len(messages) == 3 and "timed out" in messages[0] and all("{not json" in m for m in messages[1:])
