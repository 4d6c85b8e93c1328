"""Network lockdown of a default run: every listening socket of the local Ray runtime must be on loopback.

The runtime is started the way ``spotlight train`` starts it (`LocalCluster`: the on-demand head, one
spot node, the queue actor pinned to the head) in a fresh interpreter, as a run starts, so the Ray
state that earlier tests leave in the pytest process does not count. Its processes' listening sockets
are read from the kernel and matched to them by inode, so other Ray clusters on the machine do not count.

Ray binds a node's gRPC servers to 127.0.0.1 only when it resolves the node's address to 127.0.0.1,
which `LocalCluster` arranges (`spotlight.runtime.pools._loopback_only`); without it the GCS, raylets
and workers listened on "::" and the runtime-env agents on the machine's outward address.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from listening_sockets import is_loopback

START_RUNTIME = """
import json, os, sys
sys.path.insert(0, {here!r})
import ray
from listening_sockets import listening_of_tree
from spotlight.runtime.pools import LocalCluster
from spotlight.runtime.queue import start_queue_actor
cluster = LocalCluster(node_timeout_s=240.0)
try:
    cluster.add_spot_node("node0")
    queue = start_queue_actor(resource="on_demand")
    assert ray.get(queue.remaining.remote(), timeout=120.0) == 0  # the queue's worker process is up
    print(json.dumps(listening_of_tree(os.getpid())))
finally:
    cluster.shutdown()
"""


@pytest.mark.slow
def test_no_listening_socket_of_the_local_runtime_is_on_a_non_loopback_address() -> None:
    script = START_RUNTIME.format(here=str(Path(__file__).parent))
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    sockets = json.loads(result.stdout.strip().splitlines()[-1])
    assert sockets, "no listening socket found for the run: the check itself is broken"
    exposed = [f"{name} (pid {pid}) on {address}:{port}" for pid, name, address, port in sockets
               if not is_loopback(address)]
    assert not exposed, "listening on a non-loopback address: " + "; ".join(exposed)
