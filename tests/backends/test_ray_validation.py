"""Validation shared with the spot devices is the trainer's validation, bit for bit, and survives a lost device.

Issue 43: the default run's spot device idled through every validation (7 of the run's 24 minutes), because
validation ran on the trainer alone. Now the Ray backend hands the evaluated weights to the spot devices and
shares validation's fixed-size chunks with them. Every chunk is a pure function of (weights, its rows, plan),
so the numbers must equal validation sampled wholly in this process: the same latents, images and metrics. A
spot device that dies while it samples a chunk gives the chunk back to the trainer: nothing is lost.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import ray
import torch

from spotlight.backends.ray_share import SampleShare
from spotlight.config import TrainConfig, parse_config
from spotlight.loop.evaluation import EvalResult, evaluate
from spotlight.loop.rollout import rollout_plan
from spotlight.trainer import Trainer


def spotlight_trainer(run_dir: Path) -> Trainer:
    config = parse_config(TrainConfig, {
        "mode": "spotlight", "base_checkpoint": "shapes-base", "run_dir": str(run_dir), "iterations": 1,
        # 128 rows: 4 chunks of 32, enough for the trainer and the device to share them (the device sampled
        # about half of 8 chunks) and for a chunk to be on the device when it is killed
        "eval": {"seeds_per_prompt": 16, "prompts": 8, "num_steps": 6, "raw_model": False},
        "runtime": {"trace": None, "max_wall_s": None, "num_spot_devices": 1},
    })
    return Trainer(config)


def here(trainer: Trainer) -> EvalResult:
    """Validation sampled wholly in this process (no backend)."""
    section = trainer.config.eval
    return evaluate(trainer.eval_model, trainer.val_prompts, trainer.reward, section.seeds_per_prompt,
                    section.num_steps, trainer.config.rollout.shift, trainer.dataset.kind_of,
                    rollout_plan(trainer.config))


def shared(trainer: Trainer) -> dict[str, int]:
    """The last `validation_shared` event: how many chunks the spot devices sampled and gave back."""
    events = [json.loads(line) for line in (trainer.run_dir / "events.jsonl").read_text().splitlines()]
    return [event for event in events if event["kind"] == "validation_shared"][-1]


def assert_same(result: EvalResult, expected: EvalResult) -> None:
    assert result.metrics() == expected.metrics()
    assert torch.equal(result.images, expected.images)
    assert torch.equal(result.rewards, expected.rewards)


def kill_the_device_once_it_samples(trainer: Trainer, killed: list[str]) -> None:
    """Wait for a shared validation's first chunk on a spot device, then kill that device's process."""
    cluster = trainer.backend.cluster
    deadline = time.monotonic() + 60.0
    while time.monotonic() < deadline:
        with cluster.lock:
            share = getattr(cluster.feed, "__self__", None)
            running = dict(share.running) if isinstance(share, SampleShare) else {}
            if running:
                device = next(iter(running))
                ray.kill(cluster.pool._devices[device].handle, no_restart=True)
                killed.append(device)
                return
        time.sleep(0.002)


@pytest.mark.slow
def test_validation_on_spot_devices_equals_the_trainers_and_loses_nothing_to_a_lost_device(tmp_path: Path) -> None:
    trainer = spotlight_trainer(tmp_path / "run")
    try:
        expected = here(trainer)
        assert_same(trainer._evaluate(trainer.eval_model), expected)
        event = shared(trainer)
        assert event["chunks"] == 4 and event["on_spot"] >= 1 and event["returned"] == 0
        ledger = trainer.backend.cluster.ledger
        assert ledger.activity_s("spot", 0.0, trainer.backend.cluster.now())["eval"] > 0

        killed: list[str] = []
        killer = threading.Thread(target=kill_the_device_once_it_samples, args=(trainer, killed))
        killer.start()
        result = trainer._evaluate(trainer.eval_model)
        killer.join()
        assert killed, "no chunk went to a spot device"
        assert_same(result, expected)  # its chunk came back to the trainer
        assert shared(trainer)["returned"] >= 1
        with trainer.backend.cluster.lock:
            assert trainer.backend.cluster.pool.devices() == []  # the device is gone, and forgotten
    finally:
        trainer.backend.close()
        trainer._lock.release()
