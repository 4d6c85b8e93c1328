"""The reward server under hostile clients: real sockets on 127.0.0.1, every probe bounded in time."""

from __future__ import annotations

import base64
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch
from drip_server import dripping_server
from typer.testing import CliRunner

from spotlight.cli import app
from spotlight.http_fetch import fetch
from spotlight.rewards.geneval.reward import GenEvalReward
from spotlight.rewards.server.client import HTTPReward
from spotlight.rewards.server.server import RewardServer, RewardServerError, ServerLimits
from spotlight.tasks.render import render_batch
from spotlight.tasks.shapes import train_val_split


@contextmanager
def running(limits: ServerLimits) -> Iterator[RewardServer]:
    reward_server = RewardServer(GenEvalReward(), port=0, limits=limits, image_size=(32, 32))
    thread = threading.Thread(target=reward_server.serve_forever, daemon=True)
    thread.start()
    try:
        wait_until_answering(reward_server)
        yield reward_server
    finally:
        reward_server.shutdown()
        reward_server.server_close()
        thread.join(timeout=10)


def wait_until_answering(server: RewardServer, within_s: float = 60.0) -> None:
    """Return once /health answered and its connection is closed on the server's side too.

    A probe that starts earlier measures the thread's start-up, not the server; one that starts while this
    probe's connection is still counted sees one connection too many.
    """
    deadline = time.monotonic() + within_s
    while True:
        try:
            if fetch(f"{server.url}/health", deadline_s=5.0, max_body_bytes=1000).status == 200:
                break
        except OSError:
            pass
        assert time.monotonic() < deadline, f"the reward server did not answer /health within {within_s:g} s"
        time.sleep(0.01)
    while server.open_connections > 0:
        assert time.monotonic() < deadline, f"the /health probe's connection stayed open {within_s:g} s"
        time.sleep(0.01)


@pytest.fixture
def server() -> Iterator[RewardServer]:
    limits = ServerLimits(idle_timeout_s=1.0, read_timeout_s=1.0, max_body_bytes=32 * 1024 * 1024)
    with running(limits) as reward_server:
        yield reward_server


def exchange(server: RewardServer, raw: bytes, timeout_s: float = 5.0) -> bytes:
    """Send ``raw`` on a fresh connection and return everything the server answers before closing."""
    with socket.create_connection(server.server_address[:2], timeout=timeout_s) as conn:
        conn.sendall(raw)
        chunks = []
        while chunk := conn.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def post(body: bytes, length: str | None = None) -> bytes:
    return (f"POST /score HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body) if length is None else length}\r\n\r\n"
            .encode() + body)


def score_body(shape: list, pixels: bytes = b"", prompts: list | None = None) -> bytes:
    return json.dumps({"shape": shape, "pixels": base64.b64encode(pixels).decode(),
                       "prompts": prompts if prompts is not None else ["a red circle"]}).encode()


def timed_health(server: RewardServer) -> float:
    started = time.monotonic()
    response = fetch(f"{server.url}/health", deadline_s=5.0, max_body_bytes=1000)
    assert response.status == 200
    return time.monotonic() - started


@pytest.mark.parametrize("raw,status", [
    (post(b"{}", length="abc"), 400),
    (post(b"{}", length="-5"), 400),
    (post(b"", length=str(10**12)), 413),
    (b"POST /score HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 411),
    (post(b"not json"), 400),
    (post(b"[" * 100_000 + b"]" * 100_000), 400),  # deep nesting: a RecursionError in a naive parser
    (post(score_body([1, 3, "Infinity", 4])), 400),
    (post(b'{"shape": [1, 3, Infinity, 4], "pixels": "", "prompts": ["a"]}'), 400),
    (post(score_body([-1, 3, -4, 4], bytes(48))), 400),  # negative sizes whose product matches the pixels
    (post(score_body([2**62, 3, 2**62, 4])), 400),
    (b"GARBAGE\r\n\r\n", 400),
    (b"GET /nowhere HTTP/1.1\r\n\r\n", 404),
])
def test_malformed_requests_get_a_4xx_not_a_dropped_connection(server: RewardServer, raw: bytes, status: int) -> None:
    answer = exchange(server, raw)
    assert answer.startswith(f"HTTP/1.1 {status} ".encode()), answer[:200]
    assert b'"error"' in answer
    assert timed_health(server) < 1.0  # and the server is still there


@pytest.mark.parametrize("height,width", [(1, 1), (5, 7), (2048, 2048), (32, 128)])
def test_images_of_the_wrong_size_are_invalid_samples_with_the_reason(server: RewardServer, height: int,
                                                                      width: int) -> None:
    batch = 1 if height > 1000 else 2  # one 2048x2048 image is 17 MB on the wire, under the body cap
    out = HTTPReward(server.url, timeout_s=10, retries=0).score(torch.rand(batch, 3, height, width), ["a", "b"][:batch])
    assert not out.valid.any()
    assert len(out.errors) == batch
    assert all(f"image {height}x{width}" in line and "32x32" in line for line in out.errors)


def test_a_slowloris_client_is_cut_off_at_the_read_deadline(server: RewardServer) -> None:
    head = b"POST /score HTTP/1.1\r\nHost: x\r\nX-Padding: " + b"a" * 200
    with socket.create_connection(server.server_address[:2], timeout=5) as conn:
        started = time.monotonic()
        answer = b""
        try:
            for byte in head:  # one byte every 50 ms: no single read ever waits long
                conn.sendall(bytes([byte]))
                time.sleep(0.05)
                if time.monotonic() - started > 3.0:
                    break
        except OSError:  # the server closed the connection
            pass
        conn.settimeout(2.0)
        try:
            answer = conn.recv(65536)
        except OSError:
            pass
        elapsed = time.monotonic() - started
    assert answer.startswith(b"HTTP/1.1 408 ") or answer == b""
    assert elapsed < 2.5 and server.counters["timed_out"] >= 1


def test_a_thousand_stalled_connections_leave_health_and_scoring_answering() -> None:
    with running(ServerLimits(idle_timeout_s=4.0, read_timeout_s=4.0)) as server:
        stalled_connections_probe(server)


def test_an_idle_connection_is_closed_without_an_answer() -> None:
    with running(ServerLimits(idle_timeout_s=0.5)) as server, \
            socket.create_connection(server.server_address[:2], timeout=5) as conn:
        started = time.monotonic()
        assert conn.recv(100) == b""  # closed, and no 408 that a keep-alive client could take for its answer
        assert 0.4 < time.monotonic() - started < 2.0


def stalled_connections_probe(server: RewardServer) -> None:
    """1,000 stalled connections at once; health and scoring answer while every one of them is still held.

    "While still held" (none timed out yet, at least 900 open) is what proves the stalled connections do not
    block the server: a server that queued requests behind them would answer only once the read deadline
    freed them. A wall-clock bound would instead measure how busy the machine is.
    """
    stalled = []
    before = server.counters["connections"]  # the readiness probe's
    try:
        # One burst, faster than the loop accepts: it needs the server's listen backlog (1024), which needs
        # net.core.somaxconn >= 1000 (Linux's default is 4096).
        for index in range(1000):  # half send nothing, half a partial request that never completes
            conn = socket.create_connection(server.server_address[:2], timeout=5)
            if index % 2:
                conn.sendall(post(b"{", length="100000")[:-1])
            stalled.append(conn)
        deadline = time.monotonic() + 30  # a bound for failing, not a wait: the loop returns at 1,000
        while server.counters["connections"] - before < 1000 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert server.counters["connections"] - before == 1000, server.counters  # every connect reached it
        assert server.open_connections >= 900  # they really are held open by the server
        assert fetch(f"{server.url}/health", deadline_s=5.0, max_body_bytes=1000).status == 200
        still_held(server)
        validation = train_val_split()[1][:4]
        images = ((render_batch(validation, seed=3) + 1) / 2 * 255).round() / 255
        out = HTTPReward(server.url, timeout_s=5, retries=0).score(images, validation)
        assert out.valid.all()
        still_held(server)
        deadline = time.monotonic() + 30  # the read deadline (4 s) frees every stalled slot
        while server.open_connections > 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.open_connections == 0
        assert server.counters["timed_out"] == 500  # the partial requests got their 408, the idle ones none
    finally:
        for conn in stalled:
            conn.close()


def still_held(server: RewardServer) -> None:
    """The stalled connections have not reached their deadline: the answer just read did not wait for them."""
    assert server.counters["timed_out"] == 0 and server.open_connections >= 900, (
        f"answered only after stalled connections were released ({server.counters}, "
        f"{server.open_connections} open)")


def test_connections_beyond_the_limit_get_503_at_once() -> None:
    with running(ServerLimits(max_connections=4, read_timeout_s=5)) as reward_server:
        held = [socket.create_connection(reward_server.server_address[:2], timeout=5) for _ in range(4)]
        try:
            deadline = time.monotonic() + 5
            while reward_server.open_connections < 4 and time.monotonic() < deadline:
                time.sleep(0.01)
            started = time.monotonic()
            response = fetch(f"{reward_server.url}/health", deadline_s=3, max_body_bytes=1000)
            assert response.status == 503 and b"busy" in response.body
            assert time.monotonic() - started < 1.0
        finally:
            for conn in held:
                conn.close()


def test_a_port_in_use_is_one_line_with_the_fix() -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        with pytest.raises(RewardServerError, match=f"cannot listen on 127.0.0.1:{port}.*another --port") as error:
            RewardServer(GenEvalReward(), port=port)
        assert "\n" not in str(error.value)
        result = CliRunner().invoke(app, ["serve-reward", "--task", "shapes", "--port", str(port)])
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1 and "Traceback" not in result.output, result.output


def test_the_client_returns_within_its_deadline_from_a_dripping_server() -> None:
    with dripping_server(interval_s=0.2) as url:
        started = time.monotonic()
        out = HTTPReward(url, timeout_s=1.0, retries=1, backoff_s=0.01).score(torch.rand(2, 3, 32, 32), ["a", "b"])
        elapsed = time.monotonic() - started
    assert not out.valid.any() and all("within 1 s" in line for line in out.errors)
    assert elapsed < 3.0  # two attempts of 1 s each, not a wait as long as the server drips


def test_serve_reward_judges_only_its_tasks_image_size() -> None:
    # The command's server (a real process) answers a 5x7 image as an invalid sample naming the task's size.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "spotlight", "serve-reward", "--task", "shapes", "--port", str(port)]
    served = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if fetch(f"http://127.0.0.1:{port}/health", deadline_s=1, max_body_bytes=1000).status == 200:
                    break
            except OSError:
                time.sleep(0.2)
        out = HTTPReward(f"http://127.0.0.1:{port}", timeout_s=10, retries=0).score(torch.rand(1, 3, 5, 7), ["a"])
        assert not out.valid.any() and "judges 32x32 images" in out.errors[0]
    finally:
        served.terminate()
        served.wait(timeout=10)
