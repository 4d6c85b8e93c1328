"""Which physical GPUs the Ray nodes a run starts on its own machine see (`GpuLayout`).

Ray does not know which GPU the driver trains on, and a logical node offering "one GPU" maps it to the first GPU
its ``CUDA_VISIBLE_DEVICES`` lists: each node is told its GPUs explicitly, through its raylet's environment, so
that no rank is given the driver's GPU and the spot nodes spread over distinct ones (`spotlight.ranks.placement`
says where ranks go; `spotlight.runtime.spot.pools.LocalCluster` starts the nodes).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

__all__ = ["GpuLayout", "gpu_layout"]


class GpuLayout:
    """Which physical GPUs (ids as ``CUDA_VISIBLE_DEVICES`` spells them) the Ray nodes of a run on this machine see.

    ``driver``: the GPU this process trains on; ``ranks``: the GPUs the on-demand head offers ranks 1..K-1,
    every other one (never the driver's: rank 0 computes there already); ``spot``: the GPUs spot nodes go
    round, the others from the last (Ray gives ranks the head's GPUs from the first, so a few spot nodes
    and a few ranks do not meet), or the driver's alone when there is no other (a one-GPU machine: the
    trainer and its spot devices share it, as a spot device shares a GPU with nothing else on a cloud).
    A spot node keeps its GPU when the trace brings it back (`spot_gpu` remembers each name).
    """

    def __init__(self, driver: str, others: Sequence[str]) -> None:
        self.driver = driver
        self.ranks = tuple(others)
        self.spot = tuple(reversed(others)) or (driver,)
        self._of_node: dict[str, str] = {}

    def head_args(self) -> dict[str, Any]:
        """`Cluster.add_node` arguments of the on-demand head: as many Ray GPUs as ``ranks``, mapped to them."""
        return {"num_gpus": len(self.ranks), "env_vars": {"CUDA_VISIBLE_DEVICES": ",".join(self.ranks)}}

    def spot_gpu(self, node: str) -> str:
        """The physical GPU of spot node ``node``: the next of ``spot`` for a new name, its own for a known one."""
        if node not in self._of_node:
            self._of_node[node] = self.spot[len(self._of_node) % len(self.spot)]
        return self._of_node[node]

    def spot_args(self, node: str) -> dict[str, Any]:
        """`Cluster.add_node` arguments of spot node ``node``: one Ray GPU, which is `spot_gpu` (its raylet's
        ``CUDA_VISIBLE_DEVICES``, which Ray maps its GPU 0 through for the node's workers)."""
        return {"num_gpus": 1, "env_vars": {"CUDA_VISIBLE_DEVICES": self.spot_gpu(node)}}


def gpu_layout(device: str) -> GpuLayout | None:
    """The `GpuLayout` of a driver training on ``device`` (``cuda``, ``cuda:1``); None off CUDA or without one.

    The physical ids are this process's ``CUDA_VISIBLE_DEVICES`` (a driver started on a subset: its device 0
    is the first listed), or 0..N-1 of the GPUs CUDA counts.
    """
    import torch

    if device.split(":")[0] != "cuda" or not torch.cuda.is_available():
        return None
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [i.strip() for i in listed.split(",") if i.strip()] if listed is not None else \
        [str(i) for i in range(torch.cuda.device_count())]
    index = torch.device(device).index
    mine = ids[torch.cuda.current_device() if index is None else index]
    return GpuLayout(mine, [i for i in ids if i != mine])
