"""FSDP2 inside the loop: K = 2 ranks fine-tune a tiny SD3 pipeline folder's transformer in full, a SIGKILLed run
resumes on K' = 1 from its sharded checkpoint, and every checkpoint's ``transformer/`` loads in diffusers.

The reference is the same config run uninterrupted on one process (K = 1, no FSDP): the sharded run's
per-iteration metrics and final weights must equal it within all-reduce rounding, and must have moved.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch
import yaml
from brightness_reward import Brightness
from safetensors.torch import load_file

from spotlight.components.checkpoint import latest_checkpoint
from spotlight.components.sharded_checkpoint import is_sharded
from spotlight.config import TrainConfig, parse_config
from spotlight.trainer import train

TESTS = Path(__file__).parents[1]
two_cores = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="two trainer ranks pin two cores")
ITERATIONS = 3


def settings(folder: Path, run_dir: Path, devices: int, mode: str = "vanilla") -> dict[str, Any]:
    """A full fine-tune of the folder's transformer, small enough for a CPU; EMA and trust term on (both sharded)."""
    config: dict[str, Any] = {
        "mode": mode, "run_dir": str(run_dir), "iterations": ITERATIONS, "seed": 0, "checkpoint_every": 1,
        "reward": {"name": "paced_reward:paced"},  # mean brightness: contrast inside every group of a random folder
        "model": {"pretrained": str(folder), "finetune": "full"},
        "trainer": {"devices": devices, "sharding": "fsdp" if devices > 1 else "ddp"},
        "rollout": {"prompts_per_iteration": 2, "group_size": 2, "num_steps": 2, "resolution": 32},
        "train": {"num_minibatches": 1, "learning_rate": 1e-3, "ema_decay": 0.5, "nft_kl_beta": 0.1},
        "eval": {"every": 100, "prompts": 2, "seeds_per_prompt": 1, "num_steps": 2, "grid_prompts": 1},
    }
    if mode == "spotlight":
        config["explore"] = {"monitor_prompts": 1}
        config["runtime"] = {"trace": None, "max_wall_s": None, "node_timeout_s": 240.0,
                             "planner": {"num_candidates": [4], "num_steps": [2]}}
    return config


def records(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def start(config_file: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS.parent), str(TESTS)])}
    return subprocess.Popen([sys.executable, "-m", "spotlight", "train", "-c", str(config_file), *extra],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)


def latest_name(run_dir: Path) -> str:
    pointer = run_dir / "checkpoints" / "latest"
    return pointer.read_text().strip() if pointer.is_file() else ""


def check_transformer_folder(checkpoint: Path) -> None:
    """The consolidated export rank 0 wrote loads with diffusers' ``from_pretrained`` as the checkpoint's weights."""
    from diffusers import SD3Transformer2DModel

    loaded = SD3Transformer2DModel.from_pretrained(checkpoint / "transformer").state_dict()
    weights = load_file(str(checkpoint / "model.safetensors"))
    assert weights and set(weights) == set(loaded)
    assert all(torch.equal(loaded[name], value) for name, value in weights.items())


@pytest.mark.slow
@two_cores
def test_a_sharded_run_sigkilled_resumes_on_one_rank_as_if_never_stopped(tiny_pipeline, tmp_path: Path) -> None:
    folder = tiny_pipeline("sd3")
    run_dir = tmp_path / "sharded"
    config_file = tmp_path / "config.yaml"
    config_file.write_text(yaml.safe_dump(settings(folder, run_dir, devices=2)))
    driver = start(config_file)
    deadline = time.monotonic() + 400
    while latest_name(run_dir) != "iter-000002":  # two iterations checkpointed: the third is running
        assert driver.poll() is None, driver.stderr.read()[-3000:]
        assert time.monotonic() < deadline, "two iterations did not end within 400 s"
        time.sleep(0.05)
    started = psutil.Process(driver.pid).children(recursive=True)  # the Ray cluster and rank 1
    driver.send_signal(signal.SIGKILL)
    driver.communicate(timeout=60)
    checkpoint = latest_checkpoint(run_dir)
    assert checkpoint is not None and checkpoint.name == "iter-000002" and is_sharded(checkpoint)
    assert len(list((checkpoint / "dcp").glob("*.distcp"))) == 2  # each rank wrote its own shards
    check_transformer_folder(checkpoint)
    deadline = time.monotonic() + 120  # the run's reaper stops what it started
    while [p for p in started if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]:
        assert time.monotonic() < deadline, "the killed run's Ray processes outlived it by 120 s"
        time.sleep(0.1)

    # the resume on K' = 1 runs in this process (its imports are warm): the subprocess above is what the kill needs
    train(parse_config(TrainConfig, settings(folder, run_dir, devices=1)), resume=True)
    assert not is_sharded(latest_checkpoint(run_dir))  # one process writes the usual checkpoint

    clean_dir = tmp_path / "clean"
    train(parse_config(TrainConfig, settings(folder, clean_dir, devices=1)))
    clean, again = records(clean_dir), records(run_dir)
    assert [r["iteration"] for r in again] == [r["iteration"] for r in clean] == list(range(ITERATIONS + 1))
    for one, sharded in zip(clean[1:], again[1:], strict=True):
        for name in ("train/loss", "train/kl", "rollout/reward_mean"):
            assert sharded[name] == pytest.approx(one[name], rel=1e-4, abs=1e-6), name
    assert all(r["train/grad_norm"] > 0 for r in clean[1:])  # the weights moved: their equality says something
    # the weights: within rounding of the clean run's, measured against how far training moved them (Adam divides
    # by the root of the second moment, so a gradient's last-bit rounding moves a weight by up to ~1e-5 per step;
    # a resume that lost the moments, the EMA or θ_old would be off by a step, ~lr = 1e-3)
    base = load_file(str(folder / "transformer" / "diffusion_pytorch_model.safetensors"))
    final_clean = load_file(str(latest_checkpoint(clean_dir) / "model.safetensors"))
    final_again = load_file(str(latest_checkpoint(run_dir) / "model.safetensors"))
    moved = max((value - base[name].float()).abs().max().item() for name, value in final_clean.items())
    off = max((final_again[name] - value).abs().max().item() for name, value in final_clean.items())
    assert moved > 1e-3 and off < 0.05 * moved, (moved, off)
    check_transformer_folder(latest_checkpoint(run_dir))


@pytest.mark.slow
@two_cores
def test_a_sharded_run_trains_a_pipeline_folder_in_mode_spotlight(tiny_pipeline, tmp_path: Path) -> None:
    """Mode spotlight: spot devices get the whole sampler (θ_old gathered) and explore; the ranks train sharded."""
    folder = tiny_pipeline("sd3")
    run_dir = tmp_path / "spotlight"
    train(parse_config(TrainConfig, settings(folder, run_dir, devices=2, mode="spotlight")), reward=Brightness())
    history = records(run_dir)
    assert [r["iteration"] for r in history] == list(range(ITERATIONS + 1))
    assert all(r["train/grad_norm"] > 0 for r in history[1:])
    assert any("explore/seed_reward_var" in r or "planner/num_candidates" in r for r in history[1:])
    checkpoint = latest_checkpoint(run_dir)
    assert is_sharded(checkpoint)
    check_transformer_folder(checkpoint)


@pytest.mark.slow
def test_fsdp_on_one_device_is_a_group_of_one_that_trains_as_one_process(tiny_base_model, tmp_path: Path) -> None:
    """``trainer.sharding: fsdp`` with ``trainer.devices: 1`` (the one-GPU NCCL check's path, gloo here): no Ray, a
    process group of one, sharded checkpoints; the toy's metrics equal the plain process's bit for bit."""
    def run(sharding: str) -> list[dict[str, Any]]:
        run_dir = tmp_path / sharding
        train(parse_config(TrainConfig, {
            "mode": "vanilla", "base_checkpoint": str(tiny_base_model), "run_dir": str(run_dir), "iterations": 2,
            "seed": 0, "trainer": {"sharding": sharding}, "train": {"ema_decay": 0.5},
            "reward": {"name": "paced_reward:paced"},
            "rollout": {"prompts_per_iteration": 2, "group_size": 2, "num_steps": 2},
            "eval": {"every": 2, "prompts": 4, "seeds_per_prompt": 1, "num_steps": 2, "grid_prompts": 1}}))
        assert is_sharded(latest_checkpoint(run_dir)) == (sharding == "fsdp")
        return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in records(run_dir)]

    plain, sharded = run("ddp"), run("fsdp")
    assert plain == sharded and any(r.get("train/grad_norm", 0.0) > 0 for r in plain)


@pytest.mark.slow
def test_bf16_whole_weights_halve_the_sampler_and_the_gathers_and_keep_float32_shards(tiny_pipeline,
                                                                                     tmp_path: Path) -> None:
    """``trainer.whole_dtype: bfloat16``: the whole copy each rank samples with is bf16, and so are the weights
    FSDP2 gathers for θ's forward (its mixed-precision policy), while θ's shards, which AdamW steps, stay
    float32; the run trains and exports."""
    from spotlight.trainer import Trainer

    config = parse_config(TrainConfig, {**settings(tiny_pipeline("sd3"), tmp_path / "bf16", devices=1),
                                        "iterations": 1, "trainer": {"sharding": "fsdp", "whole_dtype": "bfloat16"}})
    trainer = Trainer(config)
    assert {p.dtype for p in trainer.sampler.shard_root.parameters()} == {torch.bfloat16}
    gathered: set[torch.dtype] = set()
    linear = next(m for m in trainer.model.shard_root.modules() if isinstance(m, torch.nn.Linear))
    linear.register_forward_pre_hook(lambda module, args: gathered.add(module.weight.dtype))
    summary = trainer.run()
    assert summary.history[-1]["train/grad_norm"] > 0
    assert gathered == {torch.bfloat16}
    assert {p.dtype for p in trainer.model.shard_root.parameters()} == {torch.float32}
    check_transformer_folder(latest_checkpoint(tmp_path / "bf16"))


@pytest.mark.slow
def test_fsdp_on_one_device_resumes_from_its_shards_and_from_a_plain_checkpoint(tiny_base_model,
                                                                                   tmp_path: Path) -> None:
    """A group of one resumes its own sharded checkpoint, and a plain process's, as if never stopped: the versions
    are given storage and the start's weights (the reference is not in a checkpoint) before the checkpoint fills
    them, and the sampler is gathered after; the toy's numbers equal the uninterrupted run's bit for bit."""
    def run(name: str, iterations: int, sharding: str, resume: bool = False) -> list[dict[str, Any]]:
        config = parse_config(TrainConfig, {
            "mode": "vanilla", "base_checkpoint": str(tiny_base_model), "run_dir": str(tmp_path / name),
            "iterations": iterations, "seed": 0, "checkpoint_every": 1, "trainer": {"sharding": sharding},
            "train": {"ema_decay": 0.5, "nft_kl_beta": 0.1}, "reward": {"name": "paced_reward:paced"},
            "rollout": {"prompts_per_iteration": 2, "group_size": 2, "num_steps": 2},
            "eval": {"every": 3, "prompts": 4, "seeds_per_prompt": 1, "num_steps": 2, "grid_prompts": 1}})
        history = train(config, resume=resume).history  # (a run validates at its end: iteration 2 of the cut one)
        kept = ("train/", "rollout/")
        return [{k: v for k, v in r.items() if k.startswith(kept if r["iteration"] < 3 else (*kept, "val"))}
                for r in history]

    straight = run("straight", 3, "fsdp")
    run("sharded", 2, "fsdp")
    assert is_sharded(latest_checkpoint(tmp_path / "sharded"))
    assert run("sharded", 3, "fsdp", resume=True) == straight
    run("plain", 2, "ddp")
    assert not is_sharded(latest_checkpoint(tmp_path / "plain"))
    assert run("plain", 3, "fsdp", resume=True) == straight
    assert straight[-1]["train/grad_norm"] > 0 and "val/reward" in straight[-1]
