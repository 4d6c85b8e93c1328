"""Mode spotlight opens the round exploring P_{i+1} with θ_i during iteration i's rollout, not at training start.

Issue 43: the spot device idled while the trainer sampled its own part of the rollout and scored it, though it
already held θ_i; the round only opened when training started. Now it opens as soon as the planner can size
it: after the trainer's sampling in the first iteration (the planner learns the cost from it), before it from
then on; and none opens at the last iteration, which has nothing left to explore.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from spotlight.config import TrainConfig, parse_config
from spotlight.trainer import Trainer


@pytest.mark.slow
def test_the_round_beside_training_opens_during_the_rollout(tmp_path: Path) -> None:
    config = parse_config(TrainConfig, {
        "mode": "spotlight", "base_checkpoint": "shapes-base", "run_dir": str(tmp_path / "run"), "iterations": 3,
        "rollout": {"prompts_per_iteration": 4, "group_size": 2, "num_steps": 4, "sde_steps": 3},
        "train": {"num_minibatches": 1, "num_epochs": 1},
        "runtime": {"trace": None, "max_wall_s": None, "num_spot_devices": 1,
                    "planner": {"num_candidates": [4], "num_steps": [2]}},
    })
    trainer = Trainer(config)
    backend = trainer.backend
    cluster = backend.cluster
    seen: dict[str, list[Any]] = {"sampling": [], "training": []}
    sample_here, training_started = backend._sample_here, backend.training_started

    def sampling(request: Any) -> Any:  # the trainer samples its part: which round is open?
        with cluster.lock:
            seen["sampling"].append(None if cluster.round is None else cluster.round.target)
        return sample_here(request)

    def training(iteration: int, budget_s: float) -> None:  # the rollout is sampled and scored: which round is open?
        with cluster.lock:
            seen["training"].append(None if cluster.round is None else cluster.round.target)
        training_started(iteration, budget_s)

    backend._sample_here, backend.training_started = sampling, training

    def device_settled() -> bool:  # up, and done with the last round's cancelled leases
        return bool(cluster.pool.devices(state="idle")) and not cluster.pool.devices(state="busy")

    try:
        for iteration in range(config.iterations):
            # the subject is where the round opens when the device is there; how soon a node starts, or drains
            # cancelled leases on a loaded machine, is not (a busy device is given no part and no round: CI)
            assert cluster.wait(device_settled, timeout_s=120.0)
            trainer.iteration(iteration)
    finally:
        backend.close()
    # open before the scoring every time, and before the trainer's sampling once the planner knew the cost
    assert seen["training"] == [1, 2, None]
    assert seen["sampling"] == [None, 2, None]
