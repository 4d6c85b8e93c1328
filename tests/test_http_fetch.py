"""fetch: a total deadline per request and a cap on the answer, against real hostile peers on 127.0.0.1."""

from __future__ import annotations

import time

import pytest
from drip_server import dripping_server

from spotlight.http_fetch import FetchError, fetch


@pytest.mark.parametrize("drip_head", [True, False])
def test_a_dripping_server_cannot_hold_a_request_past_its_deadline(drip_head: bool) -> None:
    # A byte every 0.2 s never trips a per-read timeout of 1 s; only a total deadline ends it.
    with dripping_server(interval_s=0.2, drip_head=drip_head) as url:
        started = time.monotonic()
        with pytest.raises(FetchError, match="within 1 s"):
            fetch(url, deadline_s=1.0, max_body_bytes=1 << 20)
        assert time.monotonic() - started < 1.8


def test_an_answer_declared_larger_than_the_cap_is_refused_unread() -> None:
    with dripping_server(head=b"HTTP/1.1 200 OK\r\nContent-Length: 1000000000\r\n\r\n", interval_s=0.0,
                         drip_head=False) as url:
        started = time.monotonic()
        with pytest.raises(FetchError, match="more than the 1000 allowed"):
            fetch(url, deadline_s=5.0, max_body_bytes=1000)
        assert time.monotonic() - started < 1.0


def test_an_undeclared_answer_is_read_only_up_to_the_cap() -> None:
    with dripping_server(head=b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n", interval_s=0.0,
                         drip_head=False, chunk_bytes=4096) as url:
        started = time.monotonic()
        with pytest.raises(FetchError, match="more than the 1000 bytes allowed"):
            fetch(url, deadline_s=5.0, max_body_bytes=1000)
        assert time.monotonic() - started < 2.0


def test_an_unreachable_server_is_one_line() -> None:
    with pytest.raises(FetchError, match="unreachable") as error:
        fetch("http://127.0.0.1:9/", deadline_s=2.0, max_body_bytes=100)
    assert "\n" not in str(error.value)
