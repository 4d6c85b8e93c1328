"""Network lockdown of a default run: every listening socket of the local Ray runtime must be on loopback.

The runtime is started the way ``spotlight train`` starts it (`LocalCluster`: the on-demand head, one
spot node, the queue actor pinned to the head); its processes' listening sockets are read from the
kernel and matched to them by inode, so other Ray clusters on the machine do not count.

Ray binds a node's gRPC servers to 127.0.0.1 only when it resolves the node's address to 127.0.0.1,
which `LocalCluster` arranges (`spotlight.runtime.pools._loopback_only`); without it the GCS, raylets
and workers listened on "::" and the runtime-env agents on the machine's outward address.
"""

from __future__ import annotations

import os

import pytest
import ray
from listening_sockets import is_loopback, listening_of_tree

from spotlight.runtime.pools import LocalCluster
from spotlight.runtime.queue import start_queue_actor


@pytest.mark.slow
def test_no_listening_socket_of_the_local_runtime_is_on_a_non_loopback_address() -> None:
    cluster = LocalCluster(node_timeout_s=240.0)
    try:
        cluster.add_spot_node("node0")
        queue = start_queue_actor(resource="on_demand")
        assert ray.get(queue.remaining.remote(), timeout=120.0) == 0  # the queue's worker process is up
        sockets = listening_of_tree(os.getpid())
    finally:
        cluster.shutdown()
    assert sockets, "no listening socket found for the run: the check itself is broken"
    exposed = [f"{name} (pid {pid}) on {address}:{port}" for pid, name, address, port in sockets
               if not is_loopback(address)]
    assert not exposed, "listening on a non-loopback address: " + "; ".join(exposed)
