"""The cloud metadata pollers against hostile endpoints on 127.0.0.1: bounded in time, quiet when failing."""

from __future__ import annotations

import logging
import time

import pytest
from drip_server import dripping_server
from metadata_services import FakeMetadata

from spotlight.runtime.spot.preemption import AwsSpotPoller, AzureScheduledEventsPoller, GcpPreemptionPoller

POLLERS = [AwsSpotPoller, GcpPreemptionPoller, AzureScheduledEventsPoller]


@pytest.mark.parametrize("poller_type", POLLERS)
def test_a_dripping_endpoint_cannot_hold_a_poll_past_its_timeout(poller_type) -> None:
    # One byte every 0.2 s: urllib's per-read timeout of 1 s never fired (a poll took > 25 s before).
    with dripping_server(interval_s=0.2) as url:
        poller = poller_type(url, node_id="spot-1", timeout_s=1.0)
        started = time.monotonic()
        assert poller.poll() == []
        assert time.monotonic() - started < 1.8
        assert poller.errors == 1


@pytest.mark.parametrize("poller_type", POLLERS)
def test_an_endless_answer_is_cut_at_the_cap(poller_type) -> None:
    with dripping_server(head=b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n", interval_s=0.0, drip_head=False,
                         chunk_bytes=4096) as url:
        poller = poller_type(url, node_id="spot-1", timeout_s=5.0)
        started = time.monotonic()
        assert poller.poll() == []
        assert time.monotonic() - started < 2.0  # the cap ended it, not the 5-s deadline
        assert poller.errors == 1


@pytest.mark.parametrize("status", [404, 500])
@pytest.mark.parametrize("poller_type", [GcpPreemptionPoller, AzureScheduledEventsPoller])
def test_an_endpoint_failing_on_every_poll_is_logged_once_per_streak(poller_type, status: int,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    answer = {"status": status, "body": "oops"}
    healthy = {GcpPreemptionPoller: "FALSE", AzureScheduledEventsPoller: '{"Events": []}'}[poller_type]
    service = FakeMetadata(lambda request: (answer["status"], answer["body"]))
    try:
        poller = poller_type(service.url, node_id="spot-1", timeout_s=2.0)
        with caplog.at_level(logging.WARNING, logger="spotlight.runtime.spot.preemption"):
            for _ in range(5):
                assert poller.poll() == []
            answer.update(status=200, body=healthy)
            assert poller.poll() == []  # the streak ends
            answer.update(status=status, body="oops")
            for _ in range(3):
                assert poller.poll() == []
    finally:
        service.close()
    assert poller.errors == 8
    assert len(caplog.records) == 2, [record.getMessage() for record in caplog.records]  # one per streak


def test_aws_answering_500_on_every_poll_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    service = FakeMetadata(lambda request: (500, "internal"))
    try:
        poller = AwsSpotPoller(service.url, node_id="spot-1", timeout_s=2.0)
        with caplog.at_level(logging.WARNING, logger="spotlight.runtime.spot.preemption"):
            for _ in range(5):
                assert poller.poll() == []
    finally:
        service.close()
    assert poller.errors == 5 and len(caplog.records) == 1
