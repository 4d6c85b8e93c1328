"""The request queue's write-ahead log: one JSON line per change of a request, on disk before the queue answers.

Why a log: the queue actor is the one process whose loss loses work (the partial latents workers
committed, the results they finished). `spotlight.runtime.queue.durable` appends a record for every
request that a call changed and fsyncs once before the call returns, so whatever a worker or the
driver was told has happened survives the actor; a restarted actor replays the file.

The format cannot run code when read: JSON objects, one per line, tensors as their dtype, shape and
raw bytes in base64 (bit for bit). A process killed in the middle of an append leaves at most a torn
last line (no newline, or not JSON); `read_log` drops it and `QueueLog` cuts it off before appending
again. A damaged line before the last is not something a crash makes, and is refused in one line.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import torch

from spotlight.diffusion.sampler import SamplingPlan
from spotlight.runtime.queue.request_queue import Request

__all__ = ["QueueLog", "QueueLogError", "decode_request", "decode_tensor", "encode_request", "encode_tensor",
           "read_log"]


class QueueLogError(RuntimeError):
    """A log the queue cannot replay; the message names the file, the line and the fix."""


def encode_tensor(tensor: torch.Tensor) -> dict[str, Any]:
    """A JSON-safe copy of ``tensor`` that `decode_tensor` turns back into the same bits."""
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    raw = flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""
    return {"dtype": str(flat.dtype).removeprefix("torch."), "shape": list(tensor.shape),
            "data": base64.b64encode(raw).decode("ascii")}


def decode_tensor(encoded: dict[str, Any]) -> torch.Tensor:
    """The tensor `encode_tensor` wrote."""
    dtype = getattr(torch, encoded["dtype"])
    raw = bytearray(base64.b64decode(encoded["data"]))
    if not raw:
        return torch.zeros(encoded["shape"], dtype=dtype)
    return torch.frombuffer(raw, dtype=torch.uint8).view(dtype).reshape(encoded["shape"]).clone()


def encode_request(request: Request) -> dict[str, Any]:
    """A request as JSON (its plan as the plan's fields)."""
    return {"request_id": request.request_id, "prompt": request.prompt, "seed": request.seed,
            "plan": dataclasses.asdict(request.plan), "weights_version": request.weights_version}


def decode_request(encoded: dict[str, Any]) -> Request:
    """The request `encode_request` wrote (equal to it, so a retried submit is recognised)."""
    return Request(encoded["request_id"], encoded["prompt"], int(encoded["seed"]), SamplingPlan(**encoded["plan"]),
                   int(encoded["weights_version"]))


def read_log(path: Path) -> tuple[list[dict[str, Any]], int]:
    """The records of the log at ``path`` (none if it does not exist) and the byte length of its intact part.

    A torn last line is left out (its bytes lie past the intact length); any other unreadable line is an error.
    """
    if not path.exists():
        return [], 0
    data = path.read_bytes()
    records, intact = [], 0
    lines = data.split(b"\n")
    for number, line in enumerate(lines[:-1], start=1):  # every element but the last ended with a newline
        try:
            records.append(json.loads(line))
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            if number == len(lines) - 1 and not lines[-1]:  # the last line, torn inside before its newline
                return records, intact
            raise QueueLogError(f"queue log {path} line {number} is damaged ({error}), and it is not the last line: "
                                "the file was changed after it was written; move it aside to start the queue "
                                "empty") from None
        intact += len(line) + 1
    return records, intact  # lines[-1] (no newline): empty, or a torn append


class QueueLog:
    """Appends records to the log at ``path``, cutting off a torn tail first; `sync` makes them durable."""

    def __init__(self, path: Path, intact_bytes: int) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "ab")  # noqa: SIM115 -- open for the queue's life, closed by close()
        if self._file.tell() > intact_bytes:
            self._file.truncate(intact_bytes)
            self._file.seek(intact_bytes)

    def append(self, record: dict[str, Any]) -> None:
        """Write one record (buffered until `sync`)."""
        self._file.write(json.dumps(record, separators=(",", ":")).encode() + b"\n")

    def sync(self) -> None:
        """Everything appended is on disk when this returns."""
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        self._file.close()
