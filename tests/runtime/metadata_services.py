"""Real HTTP servers on 127.0.0.1 that play the clouds' instance metadata services, for the watcher tests.

Paths, headers and bodies are those of the real services; like them, requests without the service's
header or token are refused.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from spotlight.runtime.spot.preemption import AwsSpotPoller, AzureScheduledEventsPoller, GcpPreemptionPoller


class FakeMetadata:
    """A metadata service on 127.0.0.1 (random port) driven by ``respond(handler) -> (status, body)``."""

    def __init__(self, respond: Callable[[BaseHTTPRequestHandler], tuple[int, str]]) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self._answer()

            def do_PUT(self) -> None:
                self._answer()

            def _answer(self) -> None:
                status, body = respond(self)
                data = body.encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except BrokenPipeError:  # the client timed out and left, as a poller should
                    pass

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class AwsImds:
    """IMDSv2: PUT a token (TTL header required), then GET with the token or get 401."""

    def __init__(self) -> None:
        self.action: dict | None = None
        self.tokens: set[str] = set()
        self.issued = 0

    def respond(self, request: BaseHTTPRequestHandler) -> tuple[int, str]:
        return self.answer(request.command, request.path, request.headers)

    def answer(self, command: str, path: str, headers: Mapping[str, str]) -> tuple[int, str]:
        if command == "PUT" and path == AwsSpotPoller.TOKEN_PATH:
            if "X-aws-ec2-metadata-token-ttl-seconds" not in headers:
                return 400, "missing TTL header"
            self.issued += 1
            token = f"token-{self.issued}"
            self.tokens.add(token)
            return 200, token
        if headers.get("X-aws-ec2-metadata-token") not in self.tokens:
            return 401, "unauthorized"
        if path == AwsSpotPoller.ACTION_PATH and self.action is not None:
            return 200, json.dumps(self.action)
        return 404, "not found"


class AwsImdsPerNode:
    """One IMDSv2 per node behind one server: ``/<node id>/latest/...`` is that node's service.

    On AWS every VM reaches its own service at 169.254.169.254; here the nodes of a test cluster share
    127.0.0.1, so the node id leads the path (``runtime.metadata_url: http://127.0.0.1:PORT/{node_id}``).
    ``requests`` counts each node's requests, ``actions_served`` the 200 answers with an instance action.
    """

    def __init__(self) -> None:
        self.nodes: dict[str, AwsImds] = {}
        self.requests: dict[str, int] = {}
        self.actions_served: dict[str, int] = {}
        self._lock = threading.Lock()

    def service(self, node: str) -> AwsImds:
        """Node ``node``'s service (set its ``action`` to announce the node's end)."""
        with self._lock:
            return self.nodes.setdefault(node, AwsImds())

    def respond(self, request: BaseHTTPRequestHandler) -> tuple[int, str]:
        node, _, path = request.path[1:].partition("/")
        service = self.service(node)
        with self._lock:
            self.requests[node] = self.requests.get(node, 0) + 1
            status, body = service.answer(request.command, "/" + path, request.headers)
            if status == 200 and request.command == "GET":
                self.actions_served[node] = self.actions_served.get(node, 0) + 1
        return status, body


class GcpMetadata:
    def __init__(self) -> None:
        self.preempted = "FALSE"

    def respond(self, request: BaseHTTPRequestHandler) -> tuple[int, str]:
        if request.headers.get("Metadata-Flavor") != "Google":
            return 403, "Missing Metadata-Flavor:Google header."
        if request.path == GcpPreemptionPoller.PATH:
            return 200, self.preempted
        return 404, "not found"


class AzureScheduledEvents:
    def __init__(self) -> None:
        self.events: list[dict] = []

    def respond(self, request: BaseHTTPRequestHandler) -> tuple[int, str]:
        if request.headers.get("Metadata") != "true":
            return 400, json.dumps({"error": "Bad request. Required metadata header not specified"})
        if request.path != AzureScheduledEventsPoller.PATH:
            return 400, json.dumps({"error": "Bad request. api-version was not specified"})
        return 200, json.dumps({"DocumentIncarnation": len(self.events), "Events": self.events})


def iso(epoch: float) -> str:
    """AWS's instance-action time format (whole seconds, rounded up so that no grace is lost)."""
    return datetime.fromtimestamp(math.ceil(epoch), tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
