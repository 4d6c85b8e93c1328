"""Where trainer ranks run and how they talk, chosen from ``device`` in this one place.

    cpu    gloo; ranks 1..K-1 are actors on the driver's node (the loopback rendezvous), one core each
           (`TrainConfig.rank_core`), taking no Ray CPU: the cores are the config's, not Ray's
    cuda   NCCL; ranks 1..K-1 are actors holding one Ray GPU each, on any node of the cluster (an attached
           cluster spreads them); rank 0 is the driver on its own device
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["placement_error", "process_group_backend", "rank_options"]


def uses_gpus(device: str) -> bool:
    """Whether ``device`` (``cpu``, ``cuda``, ``cuda:1``) puts the ranks on GPUs."""
    return device.split(":")[0] == "cuda"


def process_group_backend(device: str) -> str:
    """The torch.distributed backend of the ranks' group: NCCL on GPUs, gloo on the CPU."""
    return "nccl" if uses_gpus(device) else "gloo"


def rank_options(device: str) -> dict[str, Any]:
    """`ray.remote` options of a rank actor (see the module docstring); never restarted: a lost rank stops the run."""
    if uses_gpus(device):
        return {"num_cpus": 0, "num_gpus": 1, "max_restarts": 0}
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    return {"num_cpus": 0, "max_restarts": 0, "scheduling_strategy": here}


def placement_error(device: str, world_size: int, available: Mapping[str, float]) -> str | None:
    """One line when Ray cannot place ranks 1..K-1 (``available``: `ray.available_resources()`), else None.

    Only GPUs are counted: a CPU rank takes a core the config pins (checked when the config loads), not a
    Ray CPU. The line names the first rank without a GPU and the knob.
    """
    if not uses_gpus(device) or world_size == 1:
        return None
    free = int(available.get("GPU", 0))
    if free >= world_size - 1:
        return None
    return (f"trainer rank {free + 1} of {world_size} has no GPU: trainer.devices={world_size} needs {world_size - 1} "
            f"free Ray GPUs besides the driver's, and the cluster has {free}; lower trainer.devices to {free + 1}, "
            "or attach a cluster with more GPU nodes (--address)")
