"""Keeps a reward server up: runs `spotlight serve-reward` as a child process and starts it again whenever it exits.

A reward served over HTTP is a process of its own, and processes die (a crash, the OOM killer, a
kill). The trainer's `HTTPReward` retries a failed request with back-off, so a server that is back
at the same address within the client's retries costs the run a pause, not a failure. The
supervisor provides the "back at the same address": a fixed port (never 0, which would move it),
a watch thread that notices the exit within ``check_s`` and starts a fresh server, and a count of
restarts for the run's record. Output of each server goes to ``log_path`` (appended) when given.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from spotlight.http_fetch import FetchError, fetch

__all__ = ["RewardSupervisor", "SupervisorError", "free_port"]


class SupervisorError(RuntimeError):
    """The reward server could not be started; the message names the cause and the fix."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now, for a server that must keep one port across restarts."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


class RewardSupervisor:
    """Runs ``spotlight serve-reward --task task`` on ``host:port`` and restarts it when it exits (module docstring).

    ``startup_s``: how long a (re)started server may take to answer ``/health``; ``serve_args``: more
    arguments of serve-reward, e.g. ``["-c", "reward.yaml", "--device", "cuda:1"]`` to serve a config's reward.
    """

    def __init__(self, task: str, port: int, host: str = "127.0.0.1", check_s: float = 0.2,
                 startup_s: float = 60.0, log_path: Path | None = None, serve_args: Sequence[str] = ()) -> None:
        if port <= 0:
            raise SupervisorError(f"RewardSupervisor needs a fixed port (got {port}): a restarted server must "
                                  "answer at the same address; pick one with free_port()")
        self.task, self.host, self.port = task, host, port
        self.check_s, self.startup_s, self.log_path = check_s, startup_s, log_path
        self.serve_args = list(serve_args)
        self.restarts = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._process = self._spawn()
        self.wait_healthy()
        self._watch = threading.Thread(target=self._watch_loop, name="reward-supervisor", daemon=True)
        self._watch.start()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def pid(self) -> int:
        """The process id of the server running now."""
        with self._lock:
            return self._process.pid

    def wait_healthy(self) -> None:
        """Block until the server answers ``/health``; raises `SupervisorError` after ``startup_s``."""
        deadline = time.monotonic() + self.startup_s
        while time.monotonic() < deadline:
            try:
                if fetch(f"{self.url}/health", deadline_s=1.0, max_body_bytes=4096).status == 200:
                    return
            except FetchError:
                pass
            time.sleep(0.1)
        raise SupervisorError(f"the {self.task} reward server at {self.url} did not answer /health within "
                              f"{self.startup_s:.0f} s: see {self.log_path or 'its output'}, or raise startup_s")

    def close(self) -> None:
        """Stop watching and stop the server."""
        self._stop.set()
        self._watch.join(timeout=5.0)
        with self._lock:
            self._process.terminate()
            try:
                self._process.wait(timeout=10.0)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()

    def _spawn(self) -> subprocess.Popen:
        output = open(self.log_path, "ab") if self.log_path is not None else subprocess.DEVNULL  # noqa: SIM115
        try:
            return subprocess.Popen([sys.executable, "-m", "spotlight", "serve-reward", "--task", self.task,
                                     "--host", self.host, "--port", str(self.port), *self.serve_args],
                                    stdout=output, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        finally:
            if output is not subprocess.DEVNULL:
                output.close()

    def _watch_loop(self) -> None:
        while not self._stop.wait(self.check_s):
            with self._lock:
                if self._process.poll() is None:
                    continue
                self.restarts += 1
                self._process = self._spawn()
