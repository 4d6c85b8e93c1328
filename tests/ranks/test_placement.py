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
from spotlight.runtime.gpus import gpu_layout


@ray.remote
class Probe:
    def gpus(self) -> list:
        return ray.get_gpu_ids()


@pytest.mark.slow
def test_gpu_ranks_are_one_packed_placement_group_reserved_all_at_once() -> None:
    # without the autoscaler's monitor and the log monitor (nothing autoscales here, no output is read): two
    # processes fewer to start, as `LocalCluster` starts its head
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "num_gpus": 2,
                                                            "resources": {"on_demand": 1.0}, "no_monitor": True,
                                                            "include_log_monitor": False, "include_dashboard": False})
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
            rank_placement("cuda", 4, timeout_s=1.0)  # three GPUs asked of a cluster with two: never placed
        line = str(caught.value)
        assert "\n" not in line and line.startswith("trainer ranks 1..3") and "trainer.devices" in line
        assert all(entry["state"] == "REMOVED" for entry in placement_group_table().values())  # none left waiting
        assert rank_placement("cpu", 3, timeout_s=1.0)[0] is None  # CPU ranks take pinned cores, not Ray's
    finally:
        ray.shutdown()
        cluster.shutdown()


def fake_gpus(monkeypatch, count: int, visible: str | None = None) -> None:
    """A machine with ``count`` CUDA GPUs as torch sees them (``visible``: the driver's CUDA_VISIBLE_DEVICES)."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)


def test_one_gpu_the_trainer_and_its_spot_devices_share_it_and_no_rank_gets_it(monkeypatch) -> None:
    fake_gpus(monkeypatch, 1)
    layout = gpu_layout("cuda")
    assert layout.driver == "0" and layout.ranks == ()
    assert layout.head_args() == {"num_gpus": 0, "env_vars": {"CUDA_VISIBLE_DEVICES": ""}}
    assert [layout.spot_gpu(f"node{k}") for k in range(3)] == ["0", "0", "0"]
    assert layout.spot_args("node0") == {"num_gpus": 1, "env_vars": {"CUDA_VISIBLE_DEVICES": "0"}}


def test_two_gpus_ranks_and_spot_devices_take_the_one_the_driver_does_not_train_on(monkeypatch) -> None:
    fake_gpus(monkeypatch, 2)
    layout = gpu_layout("cuda:1")
    assert layout.driver == "1" and layout.ranks == ("0",)
    assert [layout.spot_gpu(f"node{k}") for k in range(2)] == ["0", "0"]
    layout = gpu_layout("cuda")
    assert layout.driver == "0" and layout.ranks == ("1",) and layout.spot_gpu("node0") == "1"


def test_eight_gpus_spot_nodes_spread_over_distinct_gpus_from_the_last_and_keep_theirs(monkeypatch) -> None:
    fake_gpus(monkeypatch, 8)
    layout = gpu_layout("cuda:2")
    assert layout.driver == "2" and layout.ranks == ("0", "1", "3", "4", "5", "6", "7")
    assert layout.head_args()["env_vars"] == {"CUDA_VISIBLE_DEVICES": "0,1,3,4,5,6,7"}
    assert layout.head_args()["num_gpus"] == 7
    spot = [layout.spot_gpu(f"node{k}") for k in range(8)]
    assert spot == ["7", "6", "5", "4", "3", "1", "0", "7"]  # seven distinct, never the driver's, then round again
    assert layout.spot_gpu("node1") == "6"  # a node the trace brings back gets its own GPU again


def test_a_driver_started_on_a_subset_of_gpus_maps_through_its_visible_devices(monkeypatch) -> None:
    fake_gpus(monkeypatch, 3, visible="4,5,6")  # its device 0 is physical GPU 4
    layout = gpu_layout("cuda")
    assert layout.driver == "4" and layout.ranks == ("5", "6") and layout.spot_gpu("node0") == "6"
    assert gpu_layout("cpu") is None
    monkeypatch.setattr(__import__("torch").cuda, "is_available", lambda: False)
    assert gpu_layout("cuda") is None


@ray.remote
class VisibleGpus:
    def ids(self) -> str:
        import os

        return os.environ.get("CUDA_VISIBLE_DEVICES", "")


def spot_probe(node_id: str):
    """An actor asking for what a spot device asks (`SpotPool.node_added`): the node's one GPU and its ``spot``."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return VisibleGpus.options(num_cpus=1, num_gpus=1, resources={"spot": 1}, max_restarts=0,
                               scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)).remote()


@pytest.mark.slow
def test_a_one_gpu_machine_starts_spot_nodes_on_the_driver_gpu_and_offers_ranks_none(monkeypatch) -> None:
    """The Ray nodes a run starts (logical GPUs: no GPU needed) on a faked one-GPU machine: a spot node starts and
    its device sees GPU 0, the driver's; the head offers no GPU, so a second rank is one line, not the driver's GPU."""
    from spotlight.ranks.placement import placement_error
    from spotlight.runtime.spot.pools import LocalCluster

    fake_gpus(monkeypatch, 1, visible="0")
    cluster = LocalCluster(node_timeout_s=240.0, gpus=gpu_layout("cuda"))
    try:
        node_id = cluster.add_spot_node("node0")
        assert ray.get(spot_probe(node_id).ids.remote(), timeout=240) == "0"
        problem = placement_error("cuda", 2, ray.nodes(), counts_driver_gpu=False)
        assert problem is not None and problem.startswith("trainer rank 1 of 2 has no GPU")
    finally:
        cluster.shutdown()


@pytest.mark.slow
def test_on_eight_gpus_ranks_never_get_the_driver_gpu_and_spot_nodes_get_distinct_ones(monkeypatch) -> None:
    from spotlight.runtime.spot.pools import LocalCluster

    fake_gpus(monkeypatch, 8)
    cluster = LocalCluster(node_timeout_s=240.0, gpus=gpu_layout("cuda:2"))
    try:
        nodes = [cluster.add_spot_node(f"node{k}") for k in range(2)]
        group, options = rank_placement("cuda", 3, timeout_s=120.0)
        ranks = ray.get([VisibleGpus.options(**option).remote().ids.remote() for option in options], timeout=240)
        spot = ray.get([spot_probe(node).ids.remote() for node in nodes], timeout=240)
        assert spot == ["7", "6"]  # one physical GPU each, distinct, from the last
        assert len(set(ranks)) == 2 and "2" not in ranks and not set(ranks) & set(spot)  # Ray hands out the first
        ray.util.remove_placement_group(group)
    finally:
        cluster.shutdown()
