"""GPU trainer ranks are reserved as one placement group on on-demand nodes: one GPU each, all or none.

Ray counts GPUs as resources, so a local cluster whose on-demand head declares two (logical) GPUs is
enough to see the reservation: probes scheduled with the ranks' options each hold a distinct GPU, and a
third rank that cannot be placed is one line naming the knob, with nothing left reserved.
"""

from __future__ import annotations

import pytest
import ray
from ray.cluster_utils import Cluster
from ray.util import placement_group_table

from spotlight.ranks.placement import PlacementTimeout, rank_placement


@ray.remote
class Probe:
    def gpus(self) -> list:
        return ray.get_gpu_ids()


@pytest.mark.slow
def test_gpu_ranks_are_one_packed_placement_group_reserved_all_at_once() -> None:
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "num_gpus": 2,
                                                            "resources": {"on_demand": 1.0}})
    ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False)
    try:
        group, options = rank_placement("cuda", 3, timeout_s=60.0)
        assert group is not None and len(options) == 2
        probes = [Probe.options(**option).remote() for option in options]
        held = ray.get([probe.gpus.remote() for probe in probes], timeout=60)
        assert sorted(gpu for gpus in held for gpu in gpus) == [0, 1]  # one GPU each, none shared
        for probe in probes:
            ray.kill(probe)
        ray.util.remove_placement_group(group)

        with pytest.raises(PlacementTimeout) as caught:
            rank_placement("cuda", 4, timeout_s=2.0)  # three GPUs asked of a cluster with two
        line = str(caught.value)
        assert "\n" not in line and line.startswith("trainer ranks 1..3") and "trainer.devices" in line
        assert all(entry["state"] == "REMOVED" for entry in placement_group_table().values())  # none left waiting
        assert rank_placement("cpu", 3, timeout_s=1.0)[0] is None  # CPU ranks take pinned cores, not Ray's
    finally:
        ray.shutdown()
        cluster.shutdown()


def test_ray_started_by_a_gpu_run_leaves_out_the_gpu_the_driver_trains_on(monkeypatch) -> None:
    """The driver on cuda:1 of four visible GPUs: Ray nodes started inside the block see the other three (Ray gives
    its actors GPUs from CUDA_VISIBLE_DEVICES), and the variable is as it was after."""
    import os

    import torch

    from spotlight.ranks.placement import hidden_driver_gpu

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with hidden_driver_gpu("cuda:1"):
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,2,3"
    assert "CUDA_VISIBLE_DEVICES" not in os.environ
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6")  # a driver started on a subset: its device 0 is GPU 4
    with hidden_driver_gpu("cuda"):
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "5,6"
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "4,5,6"
    with hidden_driver_gpu("cpu"):
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "4,5,6"
