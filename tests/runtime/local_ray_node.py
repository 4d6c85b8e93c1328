"""Shared set-up of the runtime tests: one local Ray node per test module, started the safe way."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import ray

from spotlight.runtime.spot.ray_auth import LocalTokenAuth
from spotlight.runtime.spot.ray_nodes import start_node

NODE_START_S = 240.0  # a bound for failing on a machine too busy to start Ray at all, not a wait
# Nothing autoscales a test's cluster and its driver takes no worker output (log_to_driver=False): its head
# goes without Ray's autoscaler monitor and log monitor, two Python processes (~0.5 CPU-s, ~1 s of wall on
# the loaded 2-core box) fewer per start, as `LocalCluster`'s head does (spotlight/runtime/spot/pools.py).
LEAN_HEAD = {"no_monitor": True, "include_log_monitor": False}
OBJECT_STORE_BYTES = 300 << 20  # a tiny model's weights and latents; Cluster's default is 150 MiB


@contextmanager
def local_ray(num_cpus: int, resources: dict[str, float]) -> Iterator[None]:
    """A local Ray node with custom resources (``on_demand``, ``spot``) for the test's actors.

    A fresh head node of its own, never a stale cluster; it asks for a token of its own as a run's do
    (`LocalTokenAuth`; Ray's default would write one to ~/.ray); the driver connects to it, and it is shut
    down with ``ray.shutdown()`` and its own processes' end (never ``ray stop``, which kills every Ray
    process on the machine). `start_node` waits on the node's readiness, not Ray's fixed 30 s (ray_nodes.py).
    """
    from ray.cluster_utils import Cluster

    auth = LocalTokenAuth()
    cluster = Cluster()
    try:
        start_node(cluster, NODE_START_S, "the test's Ray node", num_cpus=num_cpus, resources=resources,
                   include_dashboard=False, object_store_memory=OBJECT_STORE_BYTES, **LEAN_HEAD)
        ray.init(address=cluster.address, logging_level="ERROR", log_to_driver=False)
        yield
    finally:
        ray.shutdown()
        cluster.shutdown()
        auth.undo()
