"""The reward service: a reward that needs a heavy model runs in its own process behind HTTP.

`spotlight serve-reward` starts it; `spotlight.rewards.http_client.HTTPReward` is the trainer's side.
Concurrent requests (several rollout workers) are merged into one call of the reward by a batcher
thread — a heavy model's throughput comes from batches — and the results are split back. A failure
of the reward marks the samples it affects (through `guarded_score`), and is answered, never dropped.

Endpoints: POST /score (body: `spotlight.rewards.wire`), GET /health. Bound to 127.0.0.1 unless told
otherwise: the service runs arbitrary images through a model and has no authentication.

Fault injection (`FaultPlan`) makes a share of requests fail (HTTP 500) or answer late, so that the
client's retries and timeouts can be tested against a real server.
"""

from __future__ import annotations

import json
import queue
import random
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import torch

from spotlight.rewards.base import Reward, RewardError, RewardOutput, guarded_score
from spotlight.rewards.wire import WireError, decode_request, encode_output

MAX_BODY_BYTES = 256 * 1024 * 1024
_STOP = object()  # tells the batcher thread to end


@dataclass(frozen=True)
class FaultPlan:
    """Share of requests to fail with HTTP 500 and to answer only after `delay_s`; seeded."""

    failure_rate: float = 0.0
    delay_rate: float = 0.0
    delay_s: float = 1.0
    seed: int = 0


@dataclass
class _Job:
    images: torch.Tensor
    prompts: list[str]
    result: Future


class Batcher:
    """Merges queued requests into batches of at most `max_batch` samples, waiting up to `max_wait_s`."""

    def __init__(self, reward: Reward, max_batch: int = 256, max_wait_s: float = 0.01) -> None:
        self.reward = reward
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self.batches_scored = 0
        self._jobs: queue.Queue[_Job | object] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="reward-batcher", daemon=True)
        self._thread.start()

    def submit(self, images: torch.Tensor, prompts: list[str]) -> Future:
        """Queue one request; the future resolves to its RewardOutput (or the exception that stopped it)."""
        job = _Job(images, prompts, Future())
        self._jobs.put(job)
        return job.result

    def close(self) -> None:
        self._jobs.put(_STOP)
        self._thread.join(timeout=5)

    def _collect(self, first: _Job) -> tuple[list[_Job], _Job | object | None]:
        """`first` and the jobs queued within max_wait_s that share its image size and fit the batch.

        Returns (jobs, leftover): a job that did not fit (scored next round), _STOP, or None.
        """
        jobs, size = [first], len(first.prompts)
        deadline = time.monotonic() + self.max_wait_s
        while size < self.max_batch:
            try:
                job = self._jobs.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            fits = job is not _STOP and job.images.shape[1:] == first.images.shape[1:]
            if not fits or size + len(job.prompts) > self.max_batch:
                return jobs, job
            jobs.append(job)
            size += len(job.prompts)
        return jobs, None

    def _run(self) -> None:
        job = self._jobs.get()
        while job is not _STOP:
            jobs, leftover = self._collect(job)
            self._score(jobs)
            job = leftover if leftover is not None else self._jobs.get()

    def _score(self, jobs: list[_Job]) -> None:
        prompts = [prompt for job in jobs for prompt in job.prompts]
        try:
            out = guarded_score(self.reward, torch.cat([job.images for job in jobs]), prompts)
        except RewardError as error:  # every sample failed: each is marked, with the reason
            batch = len(prompts)
            out = RewardOutput(torch.zeros(batch), torch.zeros(batch, dtype=torch.bool),
                               torch.zeros(batch, dtype=torch.bool), [str(error)])
        except Exception as error:  # a malformed batch (e.g. wrong shape): answer every request with it
            for job in jobs:
                job.result.set_exception(error)
            return
        self.batches_scored += 1
        start = 0
        for job in jobs:
            stop = start + len(job.prompts)
            job.result.set_result(RewardOutput(out.rewards[start:stop].clone(), out.strict[start:stop].clone(),
                                               out.valid[start:stop].clone(), _errors_for(out, start, stop)))
            start = stop


def _errors_for(out: RewardOutput, start: int, stop: int) -> list[str]:
    """The error lines of samples [start, stop) of a merged batch, renumbered from 0 for their request.

    guarded_score writes 'sample i (prompt): ...'; other lines (the reward's own) go to every request
    with an invalid sample, since they cannot be attributed.
    """
    lines = []
    for line in out.errors:
        words = line.split(" ", 2)
        if len(words) == 3 and words[0] == "sample" and words[1].isdigit():
            if start <= int(words[1]) < stop:
                lines.append(f"sample {int(words[1]) - start} {words[2]}")
        elif not out.valid[start:stop].all():
            lines.append(line)
    return lines


class RewardServer(ThreadingHTTPServer):
    """The HTTP server; `serve_forever()` runs it, `shutdown()` + `server_close()` stop it."""

    daemon_threads = True

    def __init__(self, reward: Reward, host: str = "127.0.0.1", port: int = 8765, max_batch: int = 256,
                 max_wait_s: float = 0.01, request_timeout_s: float = 300.0, faults: FaultPlan | None = None) -> None:
        super().__init__((host, port), _Handler)
        self.reward = reward
        self.batcher = Batcher(reward, max_batch, max_wait_s)
        self.request_timeout_s = request_timeout_s
        self.faults = faults or FaultPlan()
        self._fault_rng = random.Random(self.faults.seed)
        self._fault_lock = threading.Lock()
        self.faults_injected = {"fail": 0, "delay": 0}

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"

    def draw_fault(self) -> str | None:
        """'fail', 'delay' or None for the next request, by the fault plan."""
        with self._fault_lock:
            draw = self._fault_rng.random()
            fault = None
            if draw < self.faults.failure_rate:
                fault = "fail"
            elif draw < self.faults.failure_rate + self.faults.delay_rate:
                fault = "delay"
            if fault is not None:
                self.faults_injected[fault] += 1
        return fault

    def server_close(self) -> None:
        self.batcher.close()
        super().server_close()


class _Handler(BaseHTTPRequestHandler):
    server: RewardServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass  # one line per request would drown the trainer's console

    def _send(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (its timeout); it retries or marks the samples itself

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        if self.path != "/health":
            self._send(404, {"error": f"no endpoint {self.path}; use POST /score or GET /health"})
            return
        self._send(200, {"status": "ok", "reward": self.server.reward.name})

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        if self.path != "/score":
            self._send(404, {"error": f"no endpoint {self.path}; use POST /score or GET /health"})
            return
        length = int(self.headers.get("Content-Length") or 0)
        if not 0 < length <= MAX_BODY_BYTES:
            self._send(413 if length else 411, {"error": f"body of {length} bytes; send 1 to {MAX_BODY_BYTES}"})
            return
        try:
            images, prompts = decode_request(json.loads(self.rfile.read(length)))
        except (WireError, json.JSONDecodeError, UnicodeDecodeError) as error:
            self._send(400, {"error": str(error)})
            return
        fault = self.server.draw_fault()
        if fault == "fail":
            self._send(500, {"error": "injected failure (FaultPlan)"})
            return
        if fault == "delay":
            time.sleep(self.server.faults.delay_s)
        try:
            out = self.server.batcher.submit(images, prompts).result(timeout=self.server.request_timeout_s)
        except Exception as error:  # the batch could not be scored at all: the client marks the samples
            self._send(500, {"error": f"{type(error).__name__}: {error}"})
            return
        self._send(200, {"reward": self.server.reward.name, **encode_output(out)})
