"""A hostile HTTP peer on 127.0.0.1 for client tests: answers with a byte every `interval_s`, forever."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def dripping_server(head: bytes = b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n",
                    interval_s: float = 0.2, drip_head: bool = True, limit_s: float = 20.0,
                    chunk_bytes: int = 1) -> Iterator[str]:
    """Yield the URL of a server that drips ``head`` (or sends it at once), then 'x' bytes ``chunk_bytes`` at a time.

    Each connection lasts at most ``limit_s`` (the test's own bound), so a client that never gives up
    still cannot hang the test run. A flood (``interval_s=0``) in big chunks reaches a size cap within
    milliseconds; one byte per send would take seconds to, so the client's deadline would end it first.
    """
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.1)
    stop = threading.Event()

    def drip(conn: socket.socket) -> None:
        started = time.monotonic()
        with conn:
            try:
                conn.settimeout(1.0)
                try:
                    conn.recv(65536)  # the request (not checked)
                except TimeoutError:
                    pass
                if not drip_head:
                    conn.sendall(head)
                payload = (head if drip_head else b"") + b"x" * 1_000_000
                step = 1 if drip_head else chunk_bytes
                for offset in range(0, len(payload), step):
                    if stop.is_set() or time.monotonic() - started > limit_s:
                        return
                    conn.sendall(payload[offset:offset + step])
                    time.sleep(interval_s)
            except OSError:
                return

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=drip, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(timeout=5)
        listener.close()
