"""Where trainer ranks run and how they talk, chosen from ``device`` in this one place.

    cpu    gloo; ranks 1..K-1 are actors on the driver's node (the loopback rendezvous), one core each
           (`TrainConfig.rank_core`), taking no Ray CPU: the cores are the config's, not Ray's
    cuda   NCCL; ranks 1..K-1 are actors holding one Ray GPU each on the cluster's on-demand nodes (those
           offering ``on_demand``, as the driver's does: a trainer rank is never put on a spot node, whose
           loss would stop the run), across nodes in an attached cluster; rank 0 is the driver on its device

Not handled yet (no GPU was lent to try it): on the driver's own node Ray does not know which GPU the
driver holds, so it may hand that GPU to a rank; start that node's Ray with ``CUDA_VISIBLE_DEVICES``
leaving out the driver's GPU, or put the ranks on other on-demand nodes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["placement_error", "process_group_backend", "rank_options"]

ON_DEMAND_SHARE = 1e-3


def uses_gpus(device: str) -> bool:
    """Whether ``device`` (``cpu``, ``cuda``, ``cuda:1``) puts the ranks on GPUs."""
    return device.split(":")[0] == "cuda"


def process_group_backend(device: str) -> str:
    """The torch.distributed backend of the ranks' group: NCCL on GPUs, gloo on the CPU."""
    return "nccl" if uses_gpus(device) else "gloo"


def rank_options(device: str) -> dict[str, Any]:
    """`ray.remote` options of a rank actor (see the module docstring); never restarted: a lost rank stops the run."""
    if uses_gpus(device):  # a sliver of `on_demand`: any number of ranks fit an on-demand node's one unit
        return {"num_cpus": 0, "num_gpus": 1, "resources": {"on_demand": ON_DEMAND_SHARE}, "max_restarts": 0}
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    return {"num_cpus": 0, "max_restarts": 0, "scheduling_strategy": here}


def placement_error(device: str, world_size: int, nodes: Sequence[Mapping[str, Any]]) -> str | None:
    """One line when Ray cannot place ranks 1..K-1 (``nodes``: `ray.nodes()`), else None.

    Only GPUs are counted: a CPU rank takes a core the config pins (checked when the config loads), not a
    Ray CPU. The GPUs are those of the live on-demand nodes, less the driver's own; the line names the
    first rank without one and the knob.
    """
    if not uses_gpus(device) or world_size == 1:
        return None
    gpus = sum(int(node["Resources"].get("GPU", 0)) for node in nodes
               if node.get("Alive") and node["Resources"].get("on_demand", 0) > 0)
    free = max(0, gpus - 1)  # the driver's device is one of them
    if free >= world_size - 1:
        return None
    return (f"trainer rank {free + 1} of {world_size} has no GPU: trainer.devices={world_size} needs {world_size - 1} "
            f"GPUs on on-demand nodes besides the driver's, and the cluster has {free}; lower trainer.devices to "
            f"{free + 1}, or attach a cluster with more on-demand GPU nodes (--address; start them with "
            "--resources='{\"on_demand\": 1}')")
