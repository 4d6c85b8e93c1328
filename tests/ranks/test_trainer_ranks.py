"""`trainer.devices: 2` in the loop: the same numbers as one rank, a bit-exact resume, any K' resumes, a dead rank.

The run is the tiny TinyDiT of `tests/test_pipeline.py` in mode vanilla, trained on a brightness reward
(its rewards vary, so every update moves the weights). Rank 1 is a Ray actor pinned to its own core;
the reference for K = 2 is the same run with K = 1, which equals it within float tolerance, and the
reference for a resume is the uninterrupted K = 2 run, which it equals bit for bit.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from brightness_reward import Brightness

from spotlight.components.checkpoint import latest_checkpoint, load_model_state
from spotlight.config import TrainConfig, parse_config
from spotlight.trainer import train

# Ray starts a local cluster and a rank actor per run: end-to-end, so marked slow (they still run in CI)
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="two trainer ranks pin two cores")]

DETERMINISTIC = ("rollout/", "train/")  # the rest are timings


def settings(base: Path, run_dir: Path, devices: int, iterations: int = 3) -> dict:
    return {
        "mode": "vanilla", "base_checkpoint": str(base), "run_dir": str(run_dir), "iterations": iterations,
        "checkpoint_every": 1, "trainer": {"devices": devices},
        "runtime": {"node_timeout_s": 600},  # a loaded machine starts Ray slowly
        "rollout": {"prompts_per_iteration": 2, "group_size": 3, "num_steps": 3},
        "train": {"num_minibatches": 2, "ema_decay": 0.5, "learning_rate": 3e-3},
        "eval": {"every": 10, "seeds_per_prompt": 1, "num_steps": 2, "grid_prompts": 2},
    }


def run(base: Path, run_dir: Path, devices: int, iterations: int = 3, resume: bool = False) -> list[dict]:
    config = parse_config(TrainConfig, settings(base, run_dir, devices, iterations))
    return train(config, resume=resume, reward=Brightness()).history


def deterministic(history: list[dict]) -> list[dict]:
    return [{key: value for key, value in record.items() if key.startswith(DETERMINISTIC)} for record in history]


def final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_model_state(latest_checkpoint(run_dir))


@pytest.fixture(scope="module")
def ray_cluster():
    """One local Ray cluster for the in-process runs (their ranks start on it instead of each starting one); its
    processes import this module's rewards by name, as those of a CLI run started with `python_path` do."""
    from spotlight.runtime.spot.pools import LocalCluster

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PYTHONPATH", python_path())
        cluster = LocalCluster(node_timeout_s=600)
    yield cluster
    cluster.shutdown()


def test_two_ranks_train_as_one_and_resume_bit_for_bit_with_any_number_of_ranks(ray_cluster, tiny_base_model,
                                                                                 tmp_path) -> None:
    one = run(tiny_base_model, tmp_path / "one", devices=1)
    two = run(tiny_base_model, tmp_path / "two", devices=2)
    assert json.loads((tmp_path / "two" / "trainer-ranks.json").read_text()).keys() == {"0", "1"}
    assert all(record["train/trained_samples"] > 0 for record in two[1:])  # the updates trained something
    for a, b in zip(deterministic(one), deterministic(two), strict=True):
        assert a.keys() == b.keys()
        for key in a:
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), key
    uninterrupted = final_weights(tmp_path / "two")
    start = final_weights(tmp_path / "one")
    assert max(float((uninterrupted[k] - start[k]).abs().max()) for k in start) < 1e-4  # K=2 ≈ K=1 in weights too

    run(tiny_base_model, tmp_path / "cut", devices=2, iterations=2)
    shutil.copytree(tmp_path / "cut", tmp_path / "cut-k1")
    saved = tmp_path / "cut-k1" / "config.yaml"  # the same run, moved: its config names the new run_dir
    saved.write_text(yaml.safe_dump({**yaml.safe_load(saved.read_text()), "run_dir": str(tmp_path / "cut-k1")}))
    resumed = run(tiny_base_model, tmp_path / "cut", devices=2, resume=True)
    assert deterministic(resumed) == deterministic(two)
    weights = final_weights(tmp_path / "cut")
    assert all(torch.equal(weights[key], uninterrupted[key]) for key in uninterrupted)  # bit for bit

    on_one = run(tiny_base_model, tmp_path / "cut-k1", devices=1, resume=True)  # a K=2 checkpoint, K'=1
    assert [record["iteration"] for record in on_one] == [0, 1, 2, 3]
    for key, value in final_weights(tmp_path / "cut-k1").items():
        torch.testing.assert_close(value, uninterrupted[key], rtol=1e-4, atol=1e-5)


def brightness(images: torch.Tensor, prompts, metadata) -> list[float]:
    """`Brightness` as a ``pkg.module:function`` reward, for the CLI."""
    return images.float().mean(dim=(1, 2, 3)).tolist()


def paced_brightness(images: torch.Tensor, prompts, metadata) -> list[float]:
    """`brightness` after half a second: iterations long enough that a rank killed right after the first
    checkpoint dies mid-run (on an idle machine the toy's last three iterations took less than the kill)."""
    time.sleep(0.5)
    return brightness(images, prompts, metadata)


def python_path() -> str:
    """This module's folder and the tests' helpers, for the processes Ray starts (they import the reward by name)."""
    paths = [str(Path(__file__).parent), str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")]
    return os.pathsep.join(paths)


def spotlight_train(config: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "spotlight", "train", "-c", str(config), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": python_path()})


def test_a_rank_killed_mid_run_stops_the_run_with_one_line_and_resume_finishes_it(ray_cluster, tiny_base_model,
                                                                                  tmp_path) -> None:
    run_dir = tmp_path / "run"
    config = tmp_path / "config.yaml"
    data = settings(tiny_base_model, run_dir, devices=2, iterations=4)
    data["reward"] = {"name": "test_trainer_ranks:paced_brightness"}  # rewards that vary: every update trains
    config.write_text(yaml.safe_dump(data))
    process = spotlight_train(config)
    ranks_file, deadline = run_dir / "trainer-ranks.json", time.monotonic() + 240
    while latest_checkpoint(run_dir) is None and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert process.poll() is None, process.communicate()
    os.kill(json.loads(ranks_file.read_text())["1"], signal.SIGKILL)
    killed = time.monotonic()
    _, stderr = process.communicate(timeout=90)
    assert time.monotonic() - killed < 60
    assert process.returncode != 0
    errors = [line[line.index("error: "):] for line in stderr.splitlines() if "error: " in line]  # after progress
    assert len(errors) == 1 and errors[0].startswith("error: trainer rank 1 of 2 died"), stderr
    assert "--resume" in errors[0]

    # the resume runs in this process, on the module's cluster (warm imports, no cluster to start): the killed run
    # above is the subprocess the test needs
    train(parse_config(TrainConfig, data), resume=True)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert records[-1]["iteration"] == 4
