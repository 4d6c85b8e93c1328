"""Starting logical Ray nodes on this machine, and waiting until each one serves, for as long as the caller allows.

Ray 2.60 gives a starting node a fixed 30 s: its ``Node`` constructor polls the GCS for the raylet's
registration and raises a bare ``Exception`` ("timed out during startup") after 30 s, and
``Cluster.add_node`` then waits another fixed 30 s. On a loaded machine a head node needs longer (seen in
CI: ``tests/test_resume_ray.py``'s head missed it while other jobs held both cores; with ten busy
processes on the 2 cores a head took 27 s). Here a node waits on its readiness instead: `patient_start`
makes the constructor's poll wait until the node is registered or the caller's ``timeout_s``
(``runtime.node_timeout_s``) has passed, and `start_node` then checks the node is alive, failing at once
if its processes died. Ray exposes no option for that wait, so the poll it calls
(``ray._private.services.get_node``) is wrapped while a node starts; tests/runtime/test_ray_nodes.py
fails if a Ray upgrade changes that code path.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import ray._private.services as ray_services

__all__ = ["NodeStartError", "patient_start", "start_node", "wait_until_alive"]

logger = logging.getLogger(__name__)
_starting = threading.Lock()  # one node start at a time: the wrapped poll is process-wide


class NodeStartError(RuntimeError):
    """A Ray node did not come up; the message names the node, the cause and the fix."""


def _patient(get_node: Callable[..., Any], deadline: float) -> Callable[..., Any]:
    """``get_node`` that, instead of failing while the node is not registered yet, asks again until ``deadline``."""

    def get_node_when_registered(gcs_address: str, node_id: str) -> Any:
        started = time.monotonic()
        while True:
            try:
                node = get_node(gcs_address, node_id)
                logger.info("Ray node %s registered after %.1f s", node_id[:8], time.monotonic() - started)
                return node
            except RuntimeError:  # not registered yet (Ray's own signal to poll again)
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    return get_node_when_registered


@contextmanager
def patient_start(timeout_s: float) -> Iterator[None]:
    """Ray nodes started in this block (``Cluster.add_node``, ``ray.init``) wait up to ``timeout_s`` to register."""
    with _starting:
        original = ray_services.get_node
        ray_services.get_node = _patient(original, time.monotonic() + timeout_s)
        try:
            yield
        finally:
            ray_services.get_node = original


def start_node(cluster: Any, timeout_s: float, what: str, **node_args: Any) -> Any:
    """Add a node to ``cluster`` (a ``ray.cluster_utils.Cluster``) and return it once it is alive.

    The first node added to a cluster without one is its head. ``what`` names the node in errors.
    """
    started = time.monotonic()
    try:
        with patient_start(timeout_s):
            node = cluster.add_node(wait=False, **node_args)
    except Exception as error:  # Ray raises bare Exceptions from its process start-up
        if time.monotonic() - started >= timeout_s:
            raise NodeStartError(f"{what} did not join within {timeout_s:.0f} s: the machine is overloaded; retry, "
                                 "or raise runtime.node_timeout_s") from None
        raise NodeStartError(f"{what} failed to start ({' '.join(str(error).split())[:300]}); the machine is "
                             "overloaded or out of memory: retry when it is less busy") from None
    try:
        wait_until_alive(cluster, node, max(0.0, timeout_s - (time.monotonic() - started)), what)
    except NodeStartError:
        cluster.remove_node(node, allow_graceful=False)  # a half-started node's processes end with the error
        raise
    return node


def wait_until_alive(cluster: Any, node: Any, timeout_s: float, what: str) -> None:
    """Return once ``node`` is alive in the cluster's GCS; NodeStartError at ``timeout_s`` or if it died."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            table = cluster.global_state.node_table()
        except Exception:  # the GCS itself may still be coming up under load: ask again
            table = []
        if any(row["NodeID"] == node.node_id and row["Alive"] for row in table):
            return
        dead = [kind for kind, _ in node.dead_processes()]
        if dead:
            raise NodeStartError(f"{what}: Ray's {', '.join(sorted(set(dead)))} exited while starting; its log is "
                                 f"in {node.get_logs_dir_path()}")
        if time.monotonic() > deadline:
            raise NodeStartError(f"{what} did not join within {timeout_s:.0f} s: the machine is overloaded; retry, "
                                 "or raise runtime.node_timeout_s")
        time.sleep(0.05)
