"""Spot nodes on one machine: logical nodes of a local Ray cluster that a trace adds and takes away.

The `NodeProvider` that `ElasticSP` uses in tests, benchmarks and local runs; on a real cluster the
autoscaler provides the nodes. Kept apart from the controller so that the controller knows nodes
only through the protocol.
"""

from __future__ import annotations

import threading
from typing import Any

from spotlight.runtime.sp.agent import NodeAgentActor
from spotlight.runtime.sp.elastic import ElasticSPSettings
from spotlight.runtime.spot.ray_nodes import patient_start

__all__ = ["LocalSpotNodes"]


class LocalSpotNodes:
    """Logical spot nodes of a local Ray cluster: each node is a raylet with its own custom resource.

    Each incarnation of a node gets a fresh resource name (``spot_<id>_<n>``): a node removed without
    grace stays "alive" in Ray until its health check fails, and an agent for the node's next
    incarnation must never be scheduled onto that dead raylet.
    """

    def __init__(self, cluster: Any, cpus_per_node: int = 1) -> None:
        self.cluster, self.cpus_per_node = cluster, cpus_per_node
        self._nodes: dict[str, Any] = {}
        self._incarnations = 0
        self._lock = threading.Lock()  # `crash` comes from another thread than the controller's calls

    def start_agent(self, node_id: str, settings: ElasticSPSettings) -> Any:
        """Add the Ray node (without waiting for it) and start its agent pinned there; returns the handle."""
        self.remove(node_id)  # a node that crashed and is started again
        with self._lock:
            self._incarnations += 1
            resource = f"spot_{node_id}_{self._incarnations}"
            with patient_start(settings.agent_start_s):  # Ray's own 30 s registration wait fails under load
                self._nodes[node_id] = self.cluster.add_node(
                    wait=False, num_cpus=self.cpus_per_node, resources={"spot": 1, resource: 1}
                )
        return NodeAgentActor.options(num_cpus=0, resources={resource: 0.01}).remote(
            node_id, settings.devices_per_node, num_threads=settings.num_threads,
            collective_timeout_s=settings.collective_timeout_s,
        )

    def remove(self, node_id: str) -> None:
        """Kill the node's processes at once (a spot node taken away when its deadline passes)."""
        with self._lock:
            node = self._nodes.pop(node_id, None)
            if node is not None:
                self.cluster.remove_node(node, allow_graceful=False)

    def crash(self, node_id: str) -> None:
        """Kill the node without telling the controller: how a run emulates a node that dies without notice."""
        self.remove(node_id)
