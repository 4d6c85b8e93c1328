"""One HTTP request with a total deadline and a cap on the answer's size.

``urllib``'s ``timeout`` bounds each socket operation, not the request: a server that drips one byte
every half second never trips a 1 s timeout and holds the caller for as long as it likes, and a body
is read whole however large it is. Here a watchdog timer shuts the socket down when the deadline
passes (a blocked read returns at once), and the body is read up to ``max_body_bytes`` and refused
beyond. The reward client and the cloud metadata pollers share it.
"""

from __future__ import annotations

import http.client
import socket
import threading
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

__all__ = ["FetchError", "Response", "fetch"]


class FetchError(OSError):
    """The request got no complete answer: unreachable, past its deadline, or an answer too large."""


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes


def fetch(url: str, *, method: str = "GET", body: bytes | None = None, headers: dict[str, str] | None = None,
          deadline_s: float, max_body_bytes: int) -> Response:
    """Send one request and read its whole answer within ``deadline_s``; any status is returned, not raised.

    Raises FetchError (one line) when no complete answer arrives in time or it exceeds ``max_body_bytes``.
    """
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise FetchError(f"unsupported URL {url!r}: use http://host:port/path")
    connection = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=deadline_s)
    expired = threading.Event()

    def cut_off() -> None:
        expired.set()
        if connection.sock is not None:
            try:
                connection.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    watchdog = threading.Timer(deadline_s, cut_off)
    watchdog.daemon = True
    started = time.monotonic()
    watchdog.start()
    try:
        target = parts.path or "/"
        if parts.query:
            target += f"?{parts.query}"
        connection.request(method, target, body=body, headers=headers or {})
        response = connection.getresponse()
        declared = response.getheader("Content-Length")
        if declared is not None and declared.isdigit() and int(declared) > max_body_bytes:
            raise FetchError(f"{url} answered {declared} bytes, more than the {max_body_bytes} allowed")
        data = response.read(max_body_bytes + 1)
        if len(data) > max_body_bytes:
            raise FetchError(f"{url} answered more than the {max_body_bytes} bytes allowed")
        if expired.is_set():
            raise FetchError(f"{url} timed out: no complete answer within {deadline_s:g} s")
        return Response(response.status, data)
    except (OSError, http.client.HTTPException) as error:
        if isinstance(error, FetchError):
            raise
        if expired.is_set() or time.monotonic() - started >= deadline_s:
            raise FetchError(f"{url} timed out: no complete answer within {deadline_s:g} s") from None
        raise FetchError(f"{url} unreachable ({type(error).__name__}: {' '.join(str(error).split())[:160]})") from None
    finally:
        watchdog.cancel()
        connection.close()
