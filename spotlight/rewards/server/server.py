"""The reward service: a reward that needs a heavy model runs in its own process behind HTTP.

`spotlight serve-reward` starts it; `spotlight.rewards.server.client.HTTPReward` is the trainer's side.
Concurrent requests (several rollout workers) are merged into one call of the reward by a batcher
thread — a heavy model's throughput comes from batches — and the results are split back. A failure
of the reward marks the samples it affects (through `guarded_score`), and is answered, never dropped.

Endpoints: POST /score (body: `spotlight.rewards.server.wire`), GET /health. Bound to 127.0.0.1 unless told
otherwise: the service runs arbitrary images through a model and has no authentication.

It must stay up under clients that misbehave, so connections live on one asyncio event loop (a stalled
connection costs a coroutine, not a thread) and every resource is bounded (`ServerLimits`): open
connections (503 beyond), bytes of request bodies in flight (503), one body (413), the head (431),
and the total time to read one request (408, then closed: a slowloris client cannot hold a slot). A
malformed request gets a 4xx and the connection closes; images of the wrong size are answered as
invalid samples with the reason, never scored. Asyncio streams (standard library) rather than a
server package: the framing needed is small (`spotlight.rewards.server.http_io`) and adds no dependency.

Fault injection (`FaultPlan`) makes a share of requests fail (HTTP 500) or answer late, so that the
client's retries and timeouts can be tested against a real server.
"""

from __future__ import annotations

import asyncio
import json
import queue
import random
import socket
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from spotlight.rewards.base import Reward, RewardError, RewardOutput, guarded_score
from spotlight.rewards.server.http_io import HTTPProblem, content_length, encode_response, read_head
from spotlight.rewards.server.wire import WireError, decode_metadata, decode_request, encode_output

MAX_BODY_BYTES = 64 * 1024 * 1024  # 64 MiB: ~200k shapes images (32x32 RGB) in one request
# Connections the kernel completes before the loop accepts them. Beyond it Linux drops the SYN and the
# client retries only after 1 s, then 3 s: a burst of clients on a busy machine would wait seconds.
LISTEN_BACKLOG = 1024
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
    metadata: list[dict[str, Any]] | None = None


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

    def submit(self, images: torch.Tensor, prompts: list[str],
               metadata: list[dict[str, Any]] | None = None) -> Future:
        """Queue one request; the future resolves to its RewardOutput (or the exception that stopped it)."""
        job = _Job(images, prompts, Future(), metadata)
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
            fits = (job is not _STOP and job.images.shape[1:] == first.images.shape[1:]
                    and (job.metadata is None) == (first.metadata is None))
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
        metadata = None if jobs[0].metadata is None else [record for job in jobs for record in job.metadata or []]
        try:
            out = guarded_score(self.reward, torch.cat([job.images for job in jobs]), prompts, metadata)
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
            terms = {term: values[start:stop].clone() for term, values in out.terms.items()}
            job.result.set_result(RewardOutput(out.rewards[start:stop].clone(), out.strict[start:stop].clone(),
                                               out.valid[start:stop].clone(), _errors_for(out, start, stop), terms))
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


class RewardServerError(OSError):
    """The server cannot start (its address is taken or not allowed); one line with the fix."""


@dataclass(frozen=True)
class ServerLimits:
    """What one client, or many, may hold of the server; see the module docstring."""

    max_connections: int = 1024
    idle_timeout_s: float = 10.0  # a connection with no request under way is closed (silently) after this
    read_timeout_s: float = 10.0  # total, for the head and body of one request, from its first byte
    write_timeout_s: float = 10.0
    max_header_bytes: int = 64 * 1024
    max_body_bytes: int = MAX_BODY_BYTES
    max_inflight_bytes: int = 4 * MAX_BODY_BYTES
    min_image_side: int = 8  # without an expected image_size, sides outside [min, max] are invalid samples
    max_image_side: int = 1024


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number the wire format allows")


class RewardServer:
    """The HTTP server; `serve_forever()` runs it (blocking), `shutdown()` + `server_close()` stop it.

    ``image_size`` (height, width) is the size the reward judges (the task's); other sizes are
    answered as invalid samples. The socket is bound here, so a taken port fails at construction.
    """

    def __init__(self, reward: Reward, host: str = "127.0.0.1", port: int = 8765, max_batch: int = 256,
                 max_wait_s: float = 0.01, request_timeout_s: float = 300.0, faults: FaultPlan | None = None,
                 limits: ServerLimits | None = None, image_size: tuple[int, int] | None = None) -> None:
        try:
            self._socket = socket.create_server((host, port), backlog=LISTEN_BACKLOG)
        except OSError as error:
            raise RewardServerError(f"cannot listen on {host}:{port} ({error.strerror or error}): pick another "
                                    "--port (0 takes any free one) or stop what holds it") from None
        self.server_address = self._socket.getsockname()
        self.reward = reward
        self.limits = limits or ServerLimits()
        self.image_size = image_size
        self.batcher = Batcher(reward, max_batch, max_wait_s)
        self.request_timeout_s = request_timeout_s
        self.faults = faults or FaultPlan()
        self._fault_rng = random.Random(self.faults.seed)
        self._fault_lock = threading.Lock()
        self.faults_injected = {"fail": 0, "delay": 0}
        self.counters = {"connections": 0, "refused_busy": 0, "timed_out": 0, "bad_requests": 0}
        self.open_connections = 0
        self.inflight_bytes = 0
        self._decoder = ThreadPoolExecutor(max_workers=2, thread_name_prefix="reward-decode")
        self._writers: set[asyncio.StreamWriter] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._state_lock = threading.Lock()  # orders serve_forever against a shutdown that comes first
        self._shutdown_requested = False
        self._running = False
        self._serving = threading.Event()
        self._stopped = threading.Event()

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

    def serve_forever(self, poll_interval: float = 0.5) -> None:
        """Serve until `shutdown()` (``poll_interval`` is accepted for http.server compatibility)."""
        with self._state_lock:
            if self._shutdown_requested:
                return
            self._running = True
        self._loop = asyncio.new_event_loop()
        try:
            self._loop.run_until_complete(self._serve())
        finally:
            self._loop.close()
            self._stopped.set()

    def shutdown(self) -> None:
        """Stop `serve_forever` (from another thread) and wait for it; one that starts later returns at once."""
        with self._state_lock:
            self._shutdown_requested = True
            if not self._running:
                return
        while not (self._serving.wait(timeout=0.01) or self._stopped.is_set()):
            pass
        if self._serving.is_set() and self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._stopped.wait(timeout=10)

    def server_close(self) -> None:
        self.batcher.close()
        self._decoder.shutdown(wait=False)
        self._socket.close()

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        # asyncio listen()s the socket again with its own backlog (default 100), so it is passed here too.
        server = await asyncio.start_server(self._connection, sock=self._socket, backlog=LISTEN_BACKLOG,
                                            limit=self.limits.max_header_bytes)
        self._serving.set()
        try:
            await self._stop.wait()
        finally:
            server.close()
            for writer in list(self._writers):  # each handler sees the end of its stream and returns
                writer.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            _, pending = await asyncio.wait(tasks, timeout=2.0) if tasks else (set(), set())
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.counters["connections"] += 1
        if self.open_connections >= self.limits.max_connections:
            self.counters["refused_busy"] += 1
            await self._answer(writer, 503, {"error": f"server busy ({self.open_connections} connections); retry"})
            return
        self.open_connections += 1
        self._writers.add(writer)
        try:
            keep_alive = True
            while keep_alive:
                try:  # idle until a request's first byte: closed without an answer a client could misread
                    first = await asyncio.wait_for(reader.read(1), self.limits.idle_timeout_s)
                except (TimeoutError, ConnectionError):
                    return
                if not first:
                    return
                deadline = asyncio.get_running_loop().time() + self.limits.read_timeout_s
                try:
                    head = await asyncio.wait_for(read_head(reader, first), self.limits.read_timeout_s)
                    if head is None:
                        return
                    method, path, headers, keep_alive = head
                    status, body = await self._request(reader, method, path, headers, deadline)
                except TimeoutError:
                    self.counters["timed_out"] += 1
                    await self._answer(writer, 408, {"error": "request not received in full within "
                                                              f"{self.limits.read_timeout_s:g} s"})
                    return
                except HTTPProblem as problem:
                    self.counters["bad_requests"] += 1
                    await self._answer(writer, problem.status, {"error": str(problem)})
                    return
                if not await self._answer(writer, status, body, keep_alive):
                    return
        finally:
            self.open_connections -= 1
            self._writers.discard(writer)
            writer.close()

    async def _answer(self, writer: asyncio.StreamWriter, status: int, body: dict[str, Any],
                      keep_alive: bool = False) -> bool:
        """Write a response within write_timeout_s; False if the client is gone or not reading."""
        try:
            writer.write(encode_response(status, body, keep_alive))
            await asyncio.wait_for(writer.drain(), self.limits.write_timeout_s)
            return True
        except (TimeoutError, ConnectionError):
            return False
        finally:
            if not keep_alive:
                writer.close()

    async def _request(self, reader: asyncio.StreamReader, method: str, path: str, headers: dict[str, str],
                       deadline: float) -> tuple[int, dict[str, Any]]:
        """The answer to one request whose head was read; its body must arrive by ``deadline`` (loop time)."""
        if path == "/health" and method == "GET":
            return 200, {"status": "ok", "reward": self.reward.name}
        if path not in ("/health", "/score"):
            raise HTTPProblem(404, f"no endpoint {path[:80]}; use POST /score or GET /health")
        if method != "POST" or path != "/score":
            raise HTTPProblem(405, f"{method[:10]} {path} is not served; use POST /score or GET /health")
        length = content_length(headers, self.limits.max_body_bytes)
        if self.inflight_bytes + length > self.limits.max_inflight_bytes:
            self.counters["refused_busy"] += 1
            return 503, {"error": f"server busy ({self.inflight_bytes} body bytes in flight); retry"}
        self.inflight_bytes += length
        try:
            try:  # head and body share one deadline: dripping the body buys no time either
                remaining = max(0.0, deadline - asyncio.get_running_loop().time())
                raw = await asyncio.wait_for(reader.readexactly(length), remaining)
            except asyncio.IncompleteReadError:
                raise HTTPProblem(400, f"the body ended after fewer than {length} bytes") from None
            return await self._score(raw)
        finally:
            self.inflight_bytes -= length

    async def _score(self, raw: bytes) -> tuple[int, dict[str, Any]]:
        loop = asyncio.get_running_loop()
        try:
            images, prompts, metadata = await loop.run_in_executor(self._decoder, _decode, raw)
        except WireError as error:
            raise HTTPProblem(400, str(error)) from None
        fault = self.draw_fault()
        if fault == "fail":
            return 500, {"error": "injected failure (FaultPlan)"}
        if fault == "delay":
            await asyncio.sleep(self.faults.delay_s)
        wrong_size = self._size_problem(tuple(images.shape[-2:]))  # an image's or a video frame's
        if wrong_size is not None:
            batch = len(prompts)
            errors = [f"sample {i} ({prompt!r}): {wrong_size}" for i, prompt in enumerate(prompts)]
            out = RewardOutput(torch.zeros(batch), torch.zeros(batch, dtype=torch.bool),
                               torch.zeros(batch, dtype=torch.bool), errors)
            return 200, {"reward": self.reward.name, **encode_output(out)}
        try:
            future = asyncio.wrap_future(self.batcher.submit(images, prompts, metadata))
            out = await asyncio.wait_for(future, self.request_timeout_s)
        except Exception as error:  # the batch could not be scored at all: the client marks the samples
            return 500, {"error": f"{type(error).__name__}: {error}"}
        return 200, {"reward": self.reward.name, **encode_output(out)}

    def _size_problem(self, size: tuple[int, ...]) -> str | None:
        """Why images of (height, width) ``size`` cannot be judged, or None."""
        height, width = size
        if self.image_size is not None:
            if (height, width) != tuple(self.image_size):
                return (f"image {height}x{width}, the {self.reward.name} reward judges "
                        f"{self.image_size[0]}x{self.image_size[1]} images; send the task's size")
            return None
        low, high = self.limits.min_image_side, self.limits.max_image_side
        if not (low <= height <= high and low <= width <= high):
            return f"image {height}x{width}: sides must be {low} to {high} pixels"
        return None


def _decode(raw: bytes) -> tuple[torch.Tensor, list[str], list[dict[str, Any]] | None]:
    """A request body's images and prompts; WireError for anything malformed (JSON, nesting, numbers)."""
    try:
        body = json.loads(raw, parse_constant=_reject_constant)
    except RecursionError:
        raise WireError("the request body is nested too deeply; send the flat wire format") from None
    except (ValueError, UnicodeDecodeError) as error:
        raise WireError(f"the request body is not JSON ({' '.join(str(error).split())[:120]})") from None
    if not isinstance(body, dict):
        raise WireError("the request body must be a JSON object {'shape', 'pixels', 'prompts'}")
    images, prompts = decode_request(body)
    return images, prompts, decode_metadata(body, len(prompts))
