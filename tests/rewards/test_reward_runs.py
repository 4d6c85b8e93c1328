"""Rewards in real runs: reward.name http against `spotlight serve-reward`, and a composite logging its terms."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from spotlight.cli import app
from spotlight.cli_serve import served_reward
from spotlight.config import TrainConfig, parse_config
from spotlight.rewards.base import RewardError, guarded_score
from spotlight.rewards.registry import build_reward
from spotlight.rewards.section import RewardSection
from spotlight.rewards.server.client import HTTPReward
from spotlight.rewards.server.server import RewardServer
from spotlight.rewards.server.supervisor import free_port
from spotlight.task_presets import get_task
from spotlight.trainer import train

HERE = Path(__file__).resolve().parent


def run_config(base: str, run_dir: Path, task: str, reward: dict) -> TrainConfig:
    return parse_config(TrainConfig, {
        "mode": "vanilla", "task": task, "base_checkpoint": base, "run_dir": str(run_dir), "iterations": 2,
        "num_threads": 1, "checkpoint_every": 2, "reward": reward,
        "rollout": {"prompts_per_iteration": 2, "group_size": 3, "num_steps": 2},
        "train": {"num_minibatches": 1, "num_epochs": 1},
        "eval": {"every": 2, "seeds_per_prompt": 1, "num_steps": 2, "grid_prompts": 2, "raw_model": False,
                 "prompts": 4}})


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def serving(reward) -> tuple[RewardServer, threading.Thread]:
    server = RewardServer(reward, port=0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    return server, thread


def test_http_reward_carries_metadata_and_terms_at_any_image_size():
    served = served_reward(parse_config(TrainConfig, {"reward": {"weights": {"reward_functions:brightness": 2.0}}}),
                           "shapes", None)
    assert served.image_size is None  # a config's reward judges any size
    server, thread = serving(served.reward)
    try:
        reward = build_reward(RewardSection(name="http", url=server.url))
        assert isinstance(reward, HTTPReward) and reward.name.startswith("http[")
        images = torch.stack([torch.full((3, 600, 800), 0.25), torch.full((3, 600, 800), 0.5)])
        out = guarded_score(reward, images, ["a", "b"], [{"bonus": 1}, {}])
        seen = torch.tensor([64 / 255 + 1, 128 / 255])  # pixels travel as uint8: 0.25 -> 64/255, 0.5 -> 128/255
        torch.testing.assert_close(out.rewards, 2 * seen)
        torch.testing.assert_close(out.terms["reward_functions:brightness"], seen)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def test_an_unreachable_reward_url_fails_at_start_up_in_one_line():
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(RewardError, match=f"reward.url {url} is unreachable at start-up .*serve-reward") as error:
        build_reward(RewardSection(name="http", url=url, deadline_s=2))
    assert "\n" not in str(error.value)


def test_serving_an_http_reward_is_refused():
    with pytest.raises(RewardError, match="config's reward is http"):
        served_reward(parse_config(TrainConfig, {"reward": {"name": "http", "url": "http://x:1"}}), "shapes", None)


def test_serve_reward_with_a_bad_model_folder_fails_in_one_line(tmp_path):
    result = CliRunner().invoke(app, ["serve-reward", "-s", "reward.name=clipscore",
                                      "-s", f"reward.models.clip={tmp_path / 'none'}", "--port", "0"])
    assert result.exit_code == 2
    assert "reward.models.clip" in result.output and "does not exist" in result.output


@pytest.mark.slow
def test_two_iterations_with_reward_name_http_against_spotlight_serve_reward(tiny_base_model, tmp_path):
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "spotlight", "serve-reward", "-s", "reward.name=shapes",
                               "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              env={**os.environ, "PYTHONPATH": str(HERE)})
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(300):  # the server imports torch first: wait for /health
            try:
                build_reward(RewardSection(name="http", url=url))
                break
            except RewardError:
                import time
                time.sleep(0.1)
        summary = train(run_config(str(tiny_base_model), tmp_path / "http", "shapes",
                                   {"name": "http", "url": url, "deadline_s": 30}))
        records = metrics(summary.run_dir)
        assert [r["iteration"] for r in records] == [0, 1, 2]
        assert records[1]["rollout/invalid_samples"] == 0 and 0 <= records[1]["rollout/reward_mean"] <= 1
        assert "val/strict_accuracy" in records[2]
    finally:
        server.terminate()
        server.wait(timeout=10)


@pytest.mark.slow
def test_a_composite_run_logs_each_term_in_metrics_and_the_report(tiny_clip, tmp_path):
    from spotlight.report.plots import reward_terms
    from spotlight.report.run_data import load_run

    assert get_task("ocr").image_size == (32, 128)
    summary = train(run_config("ocr-base", tmp_path / "composite", "ocr",
                               {"weights": {"ocr": 1.0, "clipscore": 0.5}, "models": {"clip": str(tiny_clip)}}))
    records = metrics(summary.run_dir)
    for record in records[1:]:
        assert {"rollout/reward/ocr", "rollout/reward/clipscore"} <= set(record)
        expected = record["rollout/reward/ocr"] + 0.5 * record["rollout/reward/clipscore"]
        assert record["rollout/reward_mean"] == pytest.approx(expected, abs=1e-5)
    panel = reward_terms([load_run(summary.run_dir)])
    assert panel.png is not None and panel.note == ""


@pytest.mark.slow
def test_the_supervisor_serves_a_config_reward_given_serve_args(monkeypatch):
    from spotlight.rewards.server.supervisor import RewardSupervisor

    monkeypatch.setenv("PYTHONPATH", str(HERE))
    supervisor = RewardSupervisor("shapes", free_port(), serve_args=["-s", "reward.name=reward_functions:brightness"])
    try:
        reward = build_reward(RewardSection(name="http", url=supervisor.url))
        out = guarded_score(reward, torch.full((2, 3, 60, 100), 0.2), ["a", "b"])  # not the shapes task's 32x32
        torch.testing.assert_close(out.rewards, torch.full((2,), 51 / 255))
    finally:
        supervisor.close()


@pytest.mark.slow
def test_a_run_with_overlap_scores_in_the_worker_and_learns_what_a_run_without_it_learns(tiny_base_model, tmp_path):
    from spotlight.rewards.background import BackgroundReward
    from spotlight.rewards.pool import PooledReward
    from spotlight.trainer import Trainer

    runs = {}
    for overlap, worker in ((False, "thread"), (True, "process"), (True, "thread")):
        reward = {"name": "shapes", "overlap": overlap, "overlap_groups": 1, "overlap_worker": worker}
        trainer = Trainer(run_config(str(tiny_base_model), tmp_path / f"overlap-{overlap}-{worker}", "shapes", reward))
        summary = trainer.run()
        runs[overlap, worker] = metrics(summary.run_dir)
        if overlap:  # both rollouts were scored chunk by chunk during sampling, not again afterwards
            kind = PooledReward if worker == "process" else BackgroundReward
            assert isinstance(trainer.reward, kind) and trainer.reward.prefetched_used == 2
            trainer.reward.close()
    for overlapped in ((True, "process"), (True, "thread")):
        for plain, scored in zip(runs[False, "thread"][1:], runs[overlapped][1:], strict=True):
            for key in ("rollout/reward_mean", "rollout/group_reward_std", "train/loss"):
                assert scored[key] == pytest.approx(plain[key], rel=1e-4, abs=1e-6), (overlapped, key)
