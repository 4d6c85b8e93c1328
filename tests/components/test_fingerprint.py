"""Runs known by content: a moved run or model folder resumes, replaced weights and damaged files are one line."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner, Result

from spotlight.cli import app
from spotlight.components.fingerprint import FINGERPRINT_FILE, ModelFilesError, model_fingerprint, record_model
from spotlight.components.run_dir import RunDirError, check_resume_config
from spotlight.config import TrainConfig, dump_config, parse_config
from spotlight.models.pipelines.tiny import save_tiny_pipeline

TRANSFORMER = "transformer/diffusion_pytorch_model.safetensors"


def started_run(run_dir: Path, model: Path) -> TrainConfig:
    """What a run leaves before its first iteration: its config and its model's fingerprint."""
    config = parse_config(TrainConfig, {"run_dir": str(run_dir), "model": {"pretrained": str(model)}})
    run_dir.mkdir(parents=True)
    dump_config(config, run_dir / "config.yaml")
    record_model(run_dir, config)
    return config


def test_a_copied_model_folder_has_the_same_fingerprint_and_other_weights_another(tiny_pipeline, tmp_path) -> None:
    folder = tiny_pipeline("sd3")
    copy = shutil.copytree(folder, tmp_path / "elsewhere" / "sd3")
    assert model_fingerprint(copy) == model_fingerprint(folder)
    other = save_tiny_pipeline("sd3", tmp_path / "seed1", seed=1)  # the same architecture, other weights
    shutil.copy(other / TRANSFORMER, copy / TRANSFORMER)
    changed = [name for name, entry in model_fingerprint(copy).items() if entry != model_fingerprint(folder)[name]]
    assert changed == [TRANSFORMER]


def test_resume_accepts_the_model_moved_and_refuses_replaced_weights_in_one_line(tiny_pipeline, tmp_path) -> None:
    model = shutil.copytree(tiny_pipeline("sd3"), tmp_path / "model")
    config = started_run(tmp_path / "run", model)
    moved = model.rename(tmp_path / "moved-model")
    check_resume_config(tmp_path / "run" / "config.yaml",
                        config.model_copy(update={"model": config.model.model_copy(update={"pretrained": str(moved)})}))
    with pytest.raises(RunDirError, match="model.pretrained"):  # without the record, a path is all there is
        os.remove(tmp_path / "run" / FINGERPRINT_FILE)
        check_resume_config(tmp_path / "run" / "config.yaml", config.model_copy(
            update={"model": config.model.model_copy(update={"pretrained": str(moved)})}))
    config = started_run(tmp_path / "run2", moved)
    other = save_tiny_pipeline("sd3", tmp_path / "seed1", seed=1)
    shutil.copy(other / TRANSFORMER, moved / TRANSFORMER)
    with pytest.raises(ModelFilesError) as refused:
        check_resume_config(tmp_path / "run2" / "config.yaml", config)
    line = str(refused.value)
    assert "\n" not in line and f"{TRANSFORMER} differs" in line and "does not hold the weights" in line


def test_a_truncated_file_a_missing_shard_and_missing_weights_are_named_with_the_fix(tiny_pipeline,
                                                                                     tmp_path) -> None:
    folder = shutil.copytree(tiny_pipeline("sd3"), tmp_path / "model")
    weights = folder / TRANSFORMER
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size - 100])  # a download cut short
    with pytest.raises(ModelFilesError, match=f"{weights} is unreadable, truncated .*download it again"):
        model_fingerprint(folder)
    weights.write_bytes(b"\x00" * 3)
    with pytest.raises(ModelFilesError, match="shorter than a safetensors header"):
        model_fingerprint(folder)
    weights.unlink()
    (folder / "transformer" / "diffusion_pytorch_model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"a": "diffusion_pytorch_model-00001-of-00002.safetensors"}}))
    with pytest.raises(ModelFilesError, match="00001-of-00002.safetensors is missing"):
        model_fingerprint(folder)
    (folder / "transformer" / "diffusion_pytorch_model.safetensors.index.json").unlink()
    with pytest.raises(ModelFilesError, match=f"{folder / 'transformer'} has a config.json but no weights file"):
        model_fingerprint(folder)


def spotlight_train(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "spotlight", "train", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=300, env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])})


def test_spotlight_train_on_a_truncated_download_is_one_line_naming_the_file(tiny_pipeline, tmp_path) -> None:
    folder = shutil.copytree(tiny_pipeline("sd3"), tmp_path / "model")
    weights = folder / TRANSFORMER
    weights.write_bytes(weights.read_bytes()[:-1])
    result = spotlight_train("-s", f"model.pretrained={folder}", "-s", f"run_dir={tmp_path / 'run'}",
                             "-s", "mode=vanilla", cwd=tmp_path)
    assert result.returncode == 2, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    size = weights.stat().st_size
    assert errors == [f"error: {weights} is unreadable, truncated ({size} bytes; its header describes {size + 1}): "
                      "the download is incomplete or damaged; download it again (or copy it again from a good copy) "
                      "and retry"]


def spotlight_train_here(*args: str, cwd: Path, monkeypatch: pytest.MonkeyPatch) -> Result:
    """``spotlight train`` in this process, run from ``cwd`` (the run directory, not the process, is the subject)."""
    with monkeypatch.context() as here:
        here.chdir(cwd)
        return CliRunner().invoke(app, ["train", *args])


@pytest.mark.slow
def test_a_run_directory_moved_elsewhere_and_named_by_another_spelling_resumes(tiny_base_model, tmp_path,
                                                                               monkeypatch) -> None:
    settings = {"base_checkpoint": str(tiny_base_model), "mode": "vanilla", "iterations": 1, "num_threads": 1,
                "checkpoint_every": 1, "rollout": {"prompts_per_iteration": 1, "group_size": 2, "num_steps": 2},
                "eval": {"every": 100, "seeds_per_prompt": 1, "num_steps": 1, "grid_prompts": 1}}
    (tmp_path / "disk1").mkdir()
    config_file = tmp_path / "config.yaml"
    config_file.write_text(yaml.safe_dump({**settings, "run_dir": "runs/first"}))  # relative, as users write it
    first = spotlight_train_here("-c", str(config_file), cwd=tmp_path / "disk1", monkeypatch=monkeypatch)
    assert first.exit_code == 0, first.output[-2000:]
    moved = shutil.move(tmp_path / "disk1" / "runs" / "first", tmp_path / "disk2" / "renamed")
    result = spotlight_train_here("-c", str(config_file), "-s", f"run_dir={moved}", "-s", "iterations=2", "--resume",
                                  cwd=tmp_path, monkeypatch=monkeypatch)
    assert result.exit_code == 0, result.output[-2000:]
    assert [json.loads(line)["iteration"] for line in (Path(moved) / "metrics.jsonl").read_text().splitlines()] \
        == [0, 1, 2]
