"""Where trainer ranks run and how they talk, chosen from ``device`` in this one place.

    cpu    gloo; ranks 1..K-1 are actors on the driver's node (the loopback rendezvous), one core each
           (`TrainConfig.rank_core`), taking no Ray CPU: the cores are the config's, not Ray's
    cuda   NCCL; ranks 1..K-1 are actors holding one Ray GPU each on the cluster's on-demand nodes (those
           offering ``on_demand``, as the driver's does: a trainer rank is never put on a spot node, whose
           loss would stop the run), across nodes in an attached cluster; rank 0 is the driver on its device.
           They are placed as one placement group (`rank_placement`): K-1 one-GPU bundles, PACK (as few
           nodes as possible, so NVLink carries most of each collective), reserved all at once or not at
           all, so a run never starts with half its ranks and waits for the rest

Ray does not know which GPU the driver holds: a Ray node that detects this machine's GPUs would hand the
driver's to a rank while another idles, and every logical spot node offering "one GPU" would map it to the
first GPU it sees, all of them the same one. So the Ray nodes a run starts on its machine are told their
physical GPUs (`spotlight.runtime.gpus.GpuLayout`, read once from CUDA and ``CUDA_VISIBLE_DEVICES``): the
on-demand head offers the ranks every GPU but the driver's, and each spot node sees one GPU of its own,
spread over the other GPUs from the last (those the ranks take last), or the driver's GPU on a machine
with no other (the trainer and a spot device share it). An attached cluster's nodes were started before
the run: start the driver node's Ray with ``CUDA_VISIBLE_DEVICES`` leaving out the GPU the driver will
use, or run the driver on a node without ranks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["PlacementTimeout", "placement_error", "process_group_backend", "rank_options", "rank_placement"]

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


def rank_placement(device: str, world_size: int, timeout_s: float) -> tuple[Any | None, list[dict[str, Any]]]:
    """The placement group of ranks 1..K-1 (None on the CPU) and each rank's `ray.remote` options.

    Raises `PlacementTimeout` (one line naming the knob) when Ray cannot reserve every bundle in ``timeout_s``.
    """
    if not uses_gpus(device):
        return None, [rank_options(device) for _ in range(1, world_size)]
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    bundle = {"GPU": 1.0, "on_demand": ON_DEMAND_SHARE}
    group = placement_group([dict(bundle) for _ in range(1, world_size)], strategy="PACK")
    if not group.wait(timeout_seconds=timeout_s):
        remove_placement_group(group)
        raise PlacementTimeout(f"trainer ranks 1..{world_size - 1}: Ray could not reserve {world_size - 1} GPUs on "
                               f"on-demand nodes in {timeout_s:.0f} s (other jobs hold them, or the cluster is still "
                               f"growing): lower trainer.devices, free GPUs, or raise runtime.node_timeout_s")
    return group, [{**rank_options(device), "scheduling_strategy": PlacementGroupSchedulingStrategy(
        group, placement_group_bundle_index=index)} for index in range(world_size - 1)]


class PlacementTimeout(RuntimeError):
    """Ray could not reserve the ranks' placement group in time (the message is one line with the fix)."""


def placement_error(device: str, world_size: int, nodes: Sequence[Mapping[str, Any]],
                    counts_driver_gpu: bool = True) -> str | None:
    """One line when Ray cannot place ranks 1..K-1 (``nodes``: `ray.nodes()`), else None.

    Only GPUs are counted: a CPU rank takes a core the config pins (checked when the config loads), not a
    Ray CPU. The GPUs are those of the live on-demand nodes, less the driver's own when Ray counts it (an
    attached cluster; the head a run starts leaves it out, `GpuLayout`); the line names the first
    rank without one and the knob.
    """
    if not uses_gpus(device) or world_size == 1:
        return None
    gpus = sum(int(node["Resources"].get("GPU", 0)) for node in nodes
               if node.get("Alive") and node["Resources"].get("on_demand", 0) > 0)
    free = max(0, gpus - int(counts_driver_gpu))
    if free >= world_size - 1:
        return None
    return (f"trainer rank {free + 1} of {world_size} has no GPU: trainer.devices={world_size} needs {world_size - 1} "
            f"GPUs on on-demand nodes besides the driver's, and the cluster has {free}; lower trainer.devices to "
            f"{free + 1}, or attach a cluster with more on-demand GPU nodes (--address; start them with "
            "--resources='{\"on_demand\": 1}')")
