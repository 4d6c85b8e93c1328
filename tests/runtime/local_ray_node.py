"""Shared set-up of the runtime tests: one local Ray node per test module, started the safe way."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import ray

from spotlight.runtime.spot.ray_auth import LocalTokenAuth
from spotlight.runtime.spot.ray_nodes import patient_start

NODE_START_S = 240.0  # a bound for failing on a machine too busy to start Ray at all, not a wait


@contextmanager
def local_ray(num_cpus: int, resources: dict[str, float]) -> Iterator[None]:
    """A local Ray node with custom resources (``on_demand``, ``spot``) for the test's actors.

    ``address="local"`` never attaches to a stale cluster, the node asks for a token of its own as a run's
    do (`LocalTokenAuth`; Ray's default would write one to ~/.ray), and it is shut down with
    ``ray.shutdown()`` (never ``ray stop``, which kills every Ray process on the machine).
    """
    auth = LocalTokenAuth()
    try:
        with patient_start(NODE_START_S):  # waits on the node's readiness, not Ray's fixed 30 s (ray_nodes.py)
            ray.init(address="local", num_cpus=num_cpus, resources=resources, include_dashboard=False,
                     logging_level="ERROR", log_to_driver=False)
        yield
    finally:
        ray.shutdown()
        auth.undo()
