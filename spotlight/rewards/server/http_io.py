"""HTTP/1.1 framing for the reward server on asyncio streams, with every read bounded.

The server speaks only what its clients send (a request line, headers, a Content-Length body) and
answers anything else with a 4xx instead of dropping the connection. A request is read under one
total deadline (the caller wraps `read_request` in ``asyncio.wait_for``), so a client that drips a
byte every few hundred milliseconds (slowloris) is cut off when the deadline passes, not kept for as
long as it keeps dripping; header and body sizes are capped before anything is buffered.
"""

from __future__ import annotations

import asyncio
import json
from http import HTTPStatus
from typing import Any


class HTTPProblem(Exception):
    """A request the server answers with ``status`` and closes (malformed, too large, unsupported)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


async def read_head(reader: asyncio.StreamReader, first: bytes = b"") -> tuple[str, str, dict[str, str], bool] | None:
    """Request line and headers (``first``: bytes of it already read); None on a clean end of stream
    before a request (keep-alive closed). The reader's ``limit`` caps the head: a longer one is a 431.
    """
    try:
        head = first + await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as error:
        if not (first + error.partial).strip():
            return None
        raise HTTPProblem(400, "the request ended inside its headers") from None
    except asyncio.LimitOverrunError:
        raise HTTPProblem(431, "request headers too large") from None
    try:
        lines = head.decode("latin-1").split("\r\n")
        method, path, version = lines[0].split(" ")
    except ValueError:
        raise HTTPProblem(400, "malformed request line; send 'METHOD /path HTTP/1.1'") from None
    if version not in ("HTTP/1.0", "HTTP/1.1"):
        raise HTTPProblem(505, f"unsupported {version!r}; send HTTP/1.1")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep or not name.strip():
            raise HTTPProblem(400, f"malformed header line {line[:80]!r}")
        headers[name.strip().lower()] = value.strip()
    connection = headers.get("connection", "").lower()
    keep_alive = connection != "close" if version == "HTTP/1.1" else connection == "keep-alive"
    return method, path, headers, keep_alive


def content_length(headers: dict[str, str], max_body_bytes: int) -> int:
    """The body length a request declares; 4xx for a missing, malformed, negative or oversized one."""
    if "transfer-encoding" in headers:
        raise HTTPProblem(411, "chunked bodies are not accepted; send Content-Length")
    raw = headers.get("content-length")
    if raw is None:
        raise HTTPProblem(411, "Content-Length is required")
    if not (raw.isascii() and raw.isdigit()):
        raise HTTPProblem(400, f"Content-Length {raw[:40]!r} is not a non-negative integer")
    length = int(raw)
    if length > max_body_bytes:
        raise HTTPProblem(413, f"body of {length} bytes; the limit is {max_body_bytes}")
    return length


def encode_response(status: int, body: dict[str, Any], keep_alive: bool) -> bytes:
    """A complete JSON response."""
    data = json.dumps(body).encode()
    reason = HTTPStatus(status).phrase
    head = (f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n"
            f"Connection: {'keep-alive' if keep_alive else 'close'}\r\n\r\n")
    return head.encode("latin-1") + data
