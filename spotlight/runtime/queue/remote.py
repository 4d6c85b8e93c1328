"""The request queue over Ray: one actor pinned to the on-demand node, and blocking calls to it for workers.

`QueueClient` is what a worker loop needs of a queue; `RequestQueue` fits it in-process and
`RemoteQueue` over a Ray actor handle, so the same loop runs in unit tests and on spot nodes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import ray
import torch

from spotlight.runtime.queue.request_queue import Lease, QueueError, RequestQueue

__all__ = ["QueueActor", "QueueClient", "RemoteQueue", "start_queue_actor"]


class QueueClient(Protocol):
    """What a worker needs from the queue; `RequestQueue` (in-process) and `RemoteQueue` (Ray) both fit."""

    def pull(
        self, worker_id: str, max_requests: int, weights_version: int, holding: Sequence[str] | None = None
    ) -> list[Lease]: ...

    def heartbeat(self, worker_id: str, holding: Sequence[str] | None = None) -> list[str]: ...

    def commit(
        self, worker_id: str, request_id: str, latent: torch.Tensor, step: int, weights_version: int,
        keep_lease: bool = False,
    ) -> bool: ...

    def complete(self, worker_id: str, request_id: str, result: torch.Tensor, weights_version: int) -> bool: ...

    def complete_many(
        self, worker_id: str, results: Sequence[tuple[str, torch.Tensor]], weights_version: int
    ) -> list[bool]: ...

    def remaining(self, weights_version: int | None = None) -> int: ...


QueueActor = ray.remote(RequestQueue)


class RemoteQueue:
    """Blocking calls to a queue actor, so a worker loop runs the same against Ray or in-process."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle

    def pull(
        self, worker_id: str, max_requests: int, weights_version: int, holding: Sequence[str] | None = None
    ) -> list[Lease]:
        return ray.get(self.handle.pull.remote(worker_id, max_requests, weights_version, holding))

    def heartbeat(self, worker_id: str, holding: Sequence[str] | None = None) -> list[str]:
        return ray.get(self.handle.heartbeat.remote(worker_id, holding))

    def commit(
        self, worker_id: str, request_id: str, latent: torch.Tensor, step: int, weights_version: int,
        keep_lease: bool = False,
    ) -> bool:
        return ray.get(self.handle.commit.remote(worker_id, request_id, latent, step, weights_version, keep_lease))

    def complete(self, worker_id: str, request_id: str, result: torch.Tensor, weights_version: int) -> bool:
        return ray.get(self.handle.complete.remote(worker_id, request_id, result, weights_version))

    def complete_many(
        self, worker_id: str, results: Sequence[tuple[str, torch.Tensor]], weights_version: int
    ) -> list[bool]:
        return ray.get(self.handle.complete_many.remote(worker_id, list(results), weights_version))

    def remaining(self, weights_version: int | None = None) -> int:
        return ray.get(self.handle.remaining.remote(weights_version))


def start_queue_actor(lease_timeout_s: float = 10.0, resource: str | None = "on_demand") -> Any:
    """Start the queue as a Ray actor and return its handle.

    The queue is the one piece whose loss loses work, so it is pinned to a node that offers the
    custom ``resource`` (the on-demand node; ``None`` places it anywhere). It takes no CPU slot and
    serves one call at a time, which is what makes every `RequestQueue` method atomic.
    """
    options: dict[str, Any] = {"num_cpus": 0, "max_concurrency": 1}
    if resource is not None:
        if ray.cluster_resources().get(resource, 0) <= 0:
            raise QueueError(
                f"no Ray node offers the resource {resource!r} to pin the queue to: start the on-demand "
                f"node with resources={{{resource!r}: 1}}, or pass resource=None"
            )
        options["resources"] = {resource: 0.001}
    return QueueActor.options(**options).remote(lease_timeout_s=lease_timeout_s)
