"""The local Ray runtime as a run starts it: listening on loopback only, and off the trainer's core.

Network lockdown: every listening socket of the local Ray runtime must be on loopback.

The runtime is started the way ``spotlight train`` starts it (`LocalCluster`: the on-demand head, one
spot node, the queue actor pinned to the head) in a fresh interpreter, as a run starts, so the Ray
state that earlier tests leave in the pytest process does not count. Its processes' listening sockets
are read from the kernel and matched to them by inode, so other Ray clusters on the machine do not count.

Ray binds a node's gRPC servers to 127.0.0.1 only when it resolves the node's address to 127.0.0.1,
which `LocalCluster` arranges (`spotlight.runtime.spot.pools._loopback_only`); without it the GCS, raylets
and workers listened on "::" and the runtime-env agents on the machine's outward address.

Placement: the driver is pinned to the trainer's core (0) as `spotlight train` pins it, and the cluster
is given the other core for Ray's own processes (`control_cores`). Every process of the runtime (GCS,
raylets, the queue actor's worker) and the driver's Ray threads must then run off core 0, and the
driver's main thread must be back on core 0 alone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from listening_sockets import is_loopback

START_RUNTIME = """
import json, os, sys, threading
sys.path.insert(0, {here!r})
import psutil
import ray
from listening_sockets import listening_of_tree
from spotlight.runtime.spot.pools import LocalCluster
from spotlight.runtime.queue.remote import start_queue_actor
os.sched_setaffinity(0, {{0}})  # the trainer's core
cluster = LocalCluster(node_timeout_s=240.0, control_cores=[1])
try:
    cluster.add_spot_node("node0")
    queue = start_queue_actor(resource="on_demand")
    assert ray.get(queue.remaining.remote(), timeout=120.0) == 0  # the queue's worker process is up
    me = psutil.Process()
    main_thread = threading.get_native_id()
    placement = {{
        "main": sorted(os.sched_getaffinity(0)),
        "children": {{f"{{p.name()}} ({{p.pid}})": sorted(p.cpu_affinity()) for p in me.children(recursive=True)}},
        "driver_threads": sorted({{tuple(sorted(os.sched_getaffinity(t.id)))
                                  for t in me.threads() if t.id != main_thread}}),
    }}
    print(json.dumps({{"sockets": listening_of_tree(os.getpid()), "placement": placement}}))
finally:
    cluster.shutdown()
"""


@pytest.fixture(scope="module")
def runtime() -> dict:
    """What the started runtime reported: its listening sockets and where its processes run."""
    script = START_RUNTIME.format(here=str(Path(__file__).parent))
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_no_listening_socket_of_the_local_runtime_is_on_a_non_loopback_address(runtime: dict) -> None:
    sockets = runtime["sockets"]
    assert sockets, "no listening socket found for the run: the check itself is broken"
    exposed = [f"{name} (pid {pid}) on {address}:{port}" for pid, name, address, port in sockets
               if not is_loopback(address)]
    assert not exposed, "listening on a non-loopback address: " + "; ".join(exposed)


@pytest.mark.slow
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores: one for the trainer, one for Ray")
def test_rays_processes_and_the_drivers_ray_threads_run_off_the_trainers_core(runtime: dict) -> None:
    placement = runtime["placement"]
    assert placement["main"] == [0], "the driver's main thread was not given back its core"
    assert placement["children"], "no Ray process found under the driver: the check itself is broken"
    on_trainer = {name: cores for name, cores in placement["children"].items() if 0 in cores}
    assert not on_trainer, f"Ray processes on the trainer's core: {on_trainer}"
    assert placement["driver_threads"] and all(0 not in cores for cores in placement["driver_threads"]), \
        f"the driver's Ray threads share the trainer's core: {placement['driver_threads']}"
