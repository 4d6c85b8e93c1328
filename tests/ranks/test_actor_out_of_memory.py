"""A CUDA out-of-memory error in a Ray actor ends the run in the driver's one out-of-memory line, naming the actor.

A trainer rank (its reward model taking its share of the rollout) and a spot device (taking its first weights) raise
``torch.OutOfMemoryError`` in their own processes, as a GPU out of memory does; the driver gets the line the
trainer gives its own (`out_of_memory_message`: the estimate and the knobs that lower it), not Ray's traceback.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import ray
import torch

from spotlight.config import TrainConfig, parse_config
from spotlight.run_error import RunError
from spotlight.trainer import train

CUDA_LINE = "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 139.81 GiB"
pytestmark = pytest.mark.slow  # a Ray cluster and an actor per test (they still run in CI)


class OutOfMemoryOffTheDriver:
    """Mean brightness, whose chunks are handed over as they are sampled (`prefetch`, as a reward model on the GPU
    takes them): on the driver it keeps nothing, in any other process (a trainer rank) the GPU runs out of memory."""

    name = "brightness"

    def __init__(self) -> None:
        self.driver = os.getpid()

    def prefetch(self, images: torch.Tensor, prompts, metadata=None) -> None:
        if os.getpid() != self.driver:
            raise torch.OutOfMemoryError(CUDA_LINE)

    def score(self, images: torch.Tensor, prompts) -> Any:
        from spotlight.rewards.base import RewardOutput

        count = len(prompts)
        return RewardOutput(rewards=images.mean(dim=(1, 2, 3)), strict=torch.zeros(count, dtype=torch.bool),
                            valid=torch.ones(count, dtype=torch.bool))


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="two trainer ranks pin two cores")
def test_a_rank_out_of_gpu_memory_ends_the_run_in_the_one_out_of_memory_line(tiny_base_model, tmp_path: Path) -> None:
    config = parse_config(TrainConfig, {
        "mode": "vanilla", "base_checkpoint": str(tiny_base_model), "run_dir": str(tmp_path / "run"),
        "iterations": 1, "trainer": {"devices": 2}, "runtime": {"node_timeout_s": 600},
        "rollout": {"prompts_per_iteration": 2, "group_size": 2, "num_steps": 2},
        # the validation before the first rollout, small: the default samples every prompt 20 times in 10 steps
        "eval": {"prompts": 2, "seeds_per_prompt": 1, "num_steps": 2, "grid_prompts": 1, "raw_model": False}})
    with pytest.raises(RunError) as caught:
        train(config, reward=OutOfMemoryOffTheDriver())
    line = str(caught.value)
    assert "\n" not in line, line
    assert line.startswith("the GPU ran out of memory (trainer rank 1 of 2 while sampling iteration 1's rollout: "
                           "CUDA out of memory. Tried to allocate 2.00 GiB"), line
    assert "train.micro_batch_size" in line and "Traceback" not in line
    assert not ray.is_initialized()  # the run's ranks and cluster are gone


class OutOfMemoryWeights(Mapping):
    """Weights whose copy to the device runs out of GPU memory (as a model too large for a spot GPU does)."""

    def __getitem__(self, name: str) -> Any:
        raise torch.OutOfMemoryError(CUDA_LINE)

    def __iter__(self) -> Iterator[str]:
        raise torch.OutOfMemoryError(CUDA_LINE)

    def __len__(self) -> int:
        return 1


def test_a_spot_device_out_of_gpu_memory_is_the_drivers_out_of_memory_error(tmp_path: Path) -> None:
    from ray import cloudpickle

    from spotlight.market.billing import DeviceLedger
    from spotlight.market.prices import default_prices
    from spotlight.models.pipelines.memory_estimate import out_of_memory_message
    from spotlight.runtime.queue.remote import start_queue_actor
    from spotlight.runtime.section import RuntimeSection
    from spotlight.runtime.spot.events import EventLog
    from spotlight.runtime.spot.pools import LocalCluster, SpotPool
    from spotlight.runtime.spot.worker import WorkerSettings

    cloudpickle.register_pickle_by_value(__import__(__name__))  # the spot device cannot import this test module
    prices = RuntimeSection().prices
    cluster = LocalCluster(node_timeout_s=240.0)
    try:
        pool = SpotPool(start_queue_actor(resource="on_demand"), {"image_size": 8}, WorkerSettings(),
                        DeviceLedger(default_prices(prices.instance, prices.on_demand_per_gpu_hour,
                                                    prices.spot_per_gpu_hour)), EventLog(None), lambda: 0.0,
                        time.time())
        pool.node_added("node0", cluster.add_spot_node("node0"))
        pool.set_weights(0, ray.put(OutOfMemoryWeights()))
        deadline = time.monotonic() + 240.0
        with pytest.raises(torch.OutOfMemoryError) as caught:
            while time.monotonic() < deadline:
                pool.poll(1.0)
    finally:
        cluster.shutdown()
    assert str(caught.value) == f"spot device spot-0 in broadcast: {CUDA_LINE}"
    line = out_of_memory_message(parse_config(TrainConfig, {"run_dir": str(tmp_path)}), caught.value)
    assert "\n" not in line and line.startswith("the GPU ran out of memory (spot device spot-0 in broadcast: CUDA")
