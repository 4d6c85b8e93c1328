"""`log.trackers` (issue 44): TensorBoard, W&B and MLflow get every iteration's scalars, validation grids and
the config, read back through each library's own reader; a resumed run continues the same W&B and MLflow run
and the same TensorBoard log dir with every step exactly once; a tracker that fails never stops training."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import yaml
from tracker_readers import mlflow_client, tensorboard_run, wandb_run
from typer.testing import CliRunner

from spotlight.cli import app
from spotlight.tracking import LogSection, TrackerHub

ALL = ["tensorboard", "wandb", "mlflow"]
TESTS = Path(__file__).resolve().parents[1]
SMALL = ["-s", "rollout.resolution=32", "-s", "rollout.prompts_per_iteration=2", "-s", "rollout.group_size=2",
         "-s", "rollout.num_steps=2", "-s", "rollout.sde_steps=null", "-s", "train.num_minibatches=1",
         "-s", "train.num_epochs=1", "-s", "eval.seeds_per_prompt=1", "-s", "eval.num_steps=2",
         "-s", "eval.grid_prompts=2", "-s", "eval.raw_model=false", "-s", "eval.prompts=2", "-s", "model.lora_rank=2",
         "-s", "pin_devices=false", "-s", "num_threads=1"]


@pytest.fixture(autouse=True)
def offline_wandb(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WANDB_MODE", raising=False)  # the tracker's own default: offline
    monkeypatch.setenv("WANDB_SILENT", "true")


def mlflow_steps(run_dir: Path, key: str) -> tuple[list[str], list[int]]:
    client = mlflow_client(run_dir)
    experiment = client.get_experiment_by_name("spotlight")
    runs = client.search_runs([experiment.experiment_id])
    history = client.get_metric_history(runs[0].info.run_id, key)
    return [run.info.run_id for run in runs], sorted(metric.step for metric in history)


def test_a_tiny_pipeline_run_logs_scalars_images_and_config_to_all_three(tiny_pipeline, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    trackers = "[" + ",".join(ALL) + "]"
    result = CliRunner().invoke(app, ["train", *SMALL, "-s", f"model.pretrained={tiny_pipeline('sd3')}",
                                      "-s", "iterations=3", "-s", "mode=vanilla", "-s", f"run_dir={run_dir}",
                                      "-s", "eval.every=2", "-s", f"log.trackers={trackers}"])
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    iterations = [record["iteration"] for record in records]
    assert iterations == [0, 1, 2, 3]
    losses = {r["iteration"]: r["train/loss"] for r in records if "train/loss" in r}
    assert sorted(losses) == [1, 2, 3]

    board = tensorboard_run(run_dir / "tensorboard")
    assert [e.step for e in board.Scalars("time/wall_s")] == iterations
    assert {e.step: e.value for e in board.Scalars("train/loss")} == pytest.approx(losses)
    assert [e.step for e in board.Images("val/samples")] == [0, 2, 3]  # a grid per validation
    assert "seed" in board.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()

    logged = wandb_run(run_dir)
    assert len(logged["ids"]) == 1
    assert sorted(step for key, step in logged["steps"] if key == "time/wall_s") == iterations
    assert {step for key, step in logged["steps"] if key.startswith("val/samples/")} == {0, 2, 3}
    assert logged["config"]["seed"] == 0 and logged["config"]["log.trackers"] == json.dumps(ALL)
    assert all("(" in caption for caption in logged["captions"])  # prompts with their rewards
    assert "commit" in logged["config"] and "machine" in logged["config"]

    run_ids, steps = mlflow_steps(run_dir, "time/wall_s")
    assert len(run_ids) == 1 and steps == iterations
    client = mlflow_client(run_dir)
    assert client.get_run(run_ids[0]).data.params["seed"] == "0"
    assert {f.path for f in client.list_artifacts(run_ids[0], "val/samples")} >= {"val/samples/iter-00000.png"}
    assert {f.path for f in client.list_artifacts(run_ids[0])} >= {"config.yaml", "summary.json"}
    assert json.loads((run_dir / "trackers.json").read_text())["wandb"]["logged_through"] == 3


def test_a_resumed_hub_redoes_steps_once_in_each_tracker(tmp_path: Path) -> None:
    """A stop after step 5 with the last checkpoint at 2: the resumed run redoes 3..5 and goes on to 6. TensorBoard
    purges and replaces 3..5; W&B and MLflow keep the first 3..5; every tracker holds 1..6 exactly once."""
    section = LogSection(trackers=ALL)
    first = TrackerHub(section, tmp_path, {"seed": 0}, "seed: 0\n", first_step=0)
    for step in range(1, 6):
        first.log(step, {"iteration": step, "x": float(step)})
    first.close()
    again = TrackerHub(section, tmp_path, {"seed": 0}, "seed: 0\n", first_step=3)
    for step in range(3, 7):
        again.log(step, {"iteration": step, "x": 10.0 * step})
    again.close()
    assert [(e.step, e.value) for e in tensorboard_run(tmp_path / "tensorboard").Scalars("x")] == \
        [(1, 1.0), (2, 2.0), (3, 30.0), (4, 40.0), (5, 50.0), (6, 60.0)]
    logged = wandb_run(tmp_path)
    assert len(logged["ids"]) == 1 and len(logged["files"]) == 2  # one W&B run, continued
    assert Counter(step for key, step in logged["steps"] if key == "x") == Counter(range(1, 7))
    run_ids, steps = mlflow_steps(tmp_path, "x")
    assert len(run_ids) == 1 and steps == list(range(1, 7))


def test_a_tracker_that_fails_is_one_warning_and_the_others_go_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    """An MLflow server that is down: one warning naming it; TensorBoard still gets every step."""
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    section = LogSection(trackers=["tensorboard", "mlflow"], mlflow={"tracking_uri": "http://127.0.0.1:9"})
    hub = TrackerHub(section, tmp_path, {}, "", first_step=0)
    for step in (1, 2):
        hub.log(step, {"iteration": step, "x": float(step)})
    hub.close()
    assert [e.step for e in tensorboard_run(tmp_path / "tensorboard").Scalars("x")] == [1, 2]
    warnings = [r.getMessage() for r in caplog.records if "switched off" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].startswith("trackers: mlflow failed"), warnings
    assert [t.name for t in hub.trackers] == ["tensorboard"]


def test_a_missing_tracker_library_is_one_line_at_start(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(TESTS.parent)}
    code = "import sys; sys.modules['wandb'] = None; from spotlight.cli import app; app()"  # as if not installed
    result = subprocess.run([sys.executable, "-c", code, "train", "-s", f"run_dir={tmp_path / 'run'}",
                             "-s", "log.trackers=[wandb]"], capture_output=True, text=True, env=env, timeout=120)
    lines = [line for line in result.stdout.splitlines() + result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2, result.stdout + result.stderr
    assert lines == ["error: log.trackers lists wandb, but the wandb package is not installed: "
                     "pip install 'spotlight-rl[wandb]', or remove wandb from log.trackers"]
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


@pytest.mark.slow
def test_sigterm_and_resume_continue_the_same_runs_with_every_step_once(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    run_dir = tmp_path / "run"
    config = {"mode": "vanilla", "run_dir": str(run_dir), "iterations": 3, "num_threads": 1, "pin_devices": False,
              "checkpoint_every": 100, "reward": {"name": "paced_reward:paced"},
              "rollout": {"prompts_per_iteration": 2, "group_size": 2, "num_steps": 3},
              "train": {"num_minibatches": 1}, "log": {"trackers": ALL},
              "eval": {"every": 100, "seeds_per_prompt": 1, "num_steps": 1, "grid_prompts": 1, "prompts": 2}}
    config_file = tmp_path / "config.yaml"
    config_file.write_text(yaml.safe_dump(config))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS.parent), str(TESTS)]), "PACE_S": "0.3"}
    driver = subprocess.Popen([sys.executable, "-m", "spotlight", "train", "-c", str(config_file)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 300
    metrics = run_dir / "metrics.jsonl"
    while not (metrics.is_file() and len(metrics.read_text().splitlines()) >= 2):  # iteration 1 done
        assert driver.poll() is None and time.monotonic() < deadline, driver.stderr.read()[-3000:]
        time.sleep(0.05)
    driver.send_signal(signal.SIGTERM)
    _, stderr = driver.communicate(timeout=120)
    assert driver.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    first_ids = json.loads((run_dir / "trackers.json").read_text())
    # the resume is not the signal's: it runs the same command in this process (the trackers' libraries imported)
    monkeypatch.setenv("PACE_S", "0")
    resumed = CliRunner().invoke(app, ["train", "-c", str(config_file), "--resume"])
    assert resumed.exit_code == 0, f"{resumed.output[-3000:]} {resumed.exception!r}"
    ids = json.loads((run_dir / "trackers.json").read_text())
    assert ids["wandb"]["run_id"] == first_ids["wandb"]["run_id"]
    assert ids["mlflow"]["run_id"] == first_ids["mlflow"]["run_id"]
    iterations = [json.loads(line)["iteration"] for line in metrics.read_text().splitlines()]
    assert iterations == [0, 1, 2, 3]
    assert [e.step for e in tensorboard_run(run_dir / "tensorboard").Scalars("time/wall_s")] == iterations
    logged = wandb_run(run_dir)
    assert len(logged["ids"]) == 1 and len(logged["files"]) == 2
    assert sorted(step for key, step in logged["steps"] if key == "time/wall_s") == iterations
    run_ids, steps = mlflow_steps(run_dir, "time/wall_s")
    assert len(run_ids) == 1 and steps == iterations
