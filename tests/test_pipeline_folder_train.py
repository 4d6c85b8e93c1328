"""``spotlight train`` on a diffusers pipeline folder (issue 22): end to end from the command line, and
the bad inputs that must stop it in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from spotlight.cli import app

runner = CliRunner()

# the smallest run that goes through every step: 2 prompts x 2 samples, 2 denoising steps at 32 px
SMALL = ["-s", "rollout.resolution=32", "-s", "rollout.prompts_per_iteration=2", "-s", "rollout.group_size=2",
         "-s", "rollout.num_steps=2", "-s", "rollout.sde_steps=null", "-s", "train.num_minibatches=1",
         "-s", "train.num_epochs=1", "-s", "eval.seeds_per_prompt=1", "-s", "eval.num_steps=2",
         "-s", "eval.grid_prompts=2", "-s", "eval.raw_model=false", "-s", "eval.prompts=4", "-s", "model.lora_rank=2",
         "-s", "pin_devices=false", "-s", "num_threads=1"]


def train(*overrides: str):
    return runner.invoke(app, ["train", *SMALL, *overrides])


def one_line_error(result) -> str:
    """The run's one error line (exit code 2); the start-up memory estimate, if printed before it, aside."""
    lines = [line for line in result.output.splitlines() if line.strip() and not line.startswith("memory estimate")]
    assert result.exit_code == 2, result.output
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0]


@pytest.mark.parametrize(("family", "algorithm", "guidance"), [("sd3", "nft", "2.0"), ("flux", "flow-grpo", "3.5"),
                                                               ("qwen-image", "nft", "1.0")])
def test_spotlight_train_runs_two_iterations_on_a_pipeline_folder(family: str, algorithm: str, guidance: str,
                                                                 tiny_pipeline, tmp_path: Path) -> None:
    folder = tiny_pipeline(family)
    run_dir = tmp_path / "run"
    result = train("-s", f"model.pretrained={folder}", "-s", "iterations=2", "-s", "mode=vanilla",
                   "-s", f"run_dir={run_dir}", "-s", f"train.algorithm={algorithm}",
                   "-s", f"rollout.guidance_scale={guidance}")
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [record["iteration"] for record in records] == [0, 1, 2]
    assert all(record["rollout/invalid_samples"] == 0 for record in records[1:])
    description = json.loads((run_dir / "checkpoints" / "iter-000002" / "model.json").read_text())
    assert description["config"]["pretrained"] == str(folder.resolve())
    assert description["config"]["family"] == family


def test_full_fine_tuning_in_bfloat16_with_gradient_checkpointing_runs(tiny_pipeline, tmp_path: Path) -> None:
    """Every transformer weight trained (float32 master weights, the forward under bfloat16 autocast), the
    EMA and the previous weights as frozen copies of all of them."""
    run_dir = tmp_path / "run"
    result = train("-s", f"model.pretrained={tiny_pipeline('flux')}", "-s", "iterations=2", "-s", "mode=vanilla",
                   "-s", f"run_dir={run_dir}", "-s", "model.finetune=full", "-s", "model.gradient_checkpointing=true",
                   "-s", "model.autocast=true", "-s", "dtype=bfloat16", "-s", "rollout.guidance_scale=3.5")
    assert result.exit_code == 0, result.output
    weights = json.loads((run_dir / "checkpoints" / "iter-000002" / "model.json").read_text())["config"]
    assert weights["finetune"] == "full" and weights["dtype"] == "bfloat16"


def test_a_folder_that_is_not_a_pipeline_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "weights.safetensors").write_bytes(b"")
    line = one_line_error(train("-s", f"model.pretrained={tmp_path}", "-s", f"run_dir={tmp_path / 'run'}"))
    assert "model.pretrained" in line and "model_index.json" in line


def test_an_unsupported_pipeline_family_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "model_index.json").write_text(json.dumps({"_class_name": "StableDiffusionXLPipeline"}))
    line = one_line_error(train("-s", f"model.pretrained={tmp_path}", "-s", f"run_dir={tmp_path / 'run'}"))
    assert "StableDiffusionXLPipeline" in line and "FluxPipeline" in line


def test_a_resolution_the_model_cannot_take_is_one_line(tiny_pipeline, tmp_path: Path) -> None:
    line = one_line_error(train("-s", f"model.pretrained={tiny_pipeline('flux')}", "-s", "rollout.resolution=30",
                                "-s", f"run_dir={tmp_path / 'run'}"))
    assert "rollout.resolution 30x30" in line and "divisible by 4" in line


def test_a_family_that_contradicts_the_folder_is_one_line(tiny_pipeline, tmp_path: Path) -> None:
    line = one_line_error(train("-s", f"model.pretrained={tiny_pipeline('sd3')}", "-s", "model.family=flux",
                                "-s", f"run_dir={tmp_path / 'run'}"))
    assert "set model.family to sd3" in line


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_device_cuda_without_cuda_is_one_line(tiny_pipeline, tmp_path: Path) -> None:
    line = one_line_error(train("-s", f"model.pretrained={tiny_pipeline('sd3')}", "-s", "device=cuda",
                                "-s", f"run_dir={tmp_path / 'run'}"))
    assert "device: cuda" in line and "set device: cpu" in line


def test_sequence_parallelism_on_a_pipeline_folder_is_refused_in_one_line(tiny_pipeline, tmp_path: Path) -> None:
    line = one_line_error(train("-s", f"model.pretrained={tiny_pipeline('flux')}", "-s", "runtime.sp_degree=2",
                                "-s", "mode=spotlight", "-s", f"run_dir={tmp_path / 'run'}"))
    assert "runtime.sp_degree=2" in line and "set runtime.sp_degree 1" in line


def test_guidance_without_a_pipeline_is_one_line(tmp_path: Path) -> None:
    line = one_line_error(train("-s", "model.family=sd3", "-s", "rollout.guidance_scale=3",
                                "-s", f"run_dir={tmp_path / 'run'}"))
    assert "rollout.guidance_scale" in line and "model.pretrained" in line


def test_make_tiny_pipeline_writes_a_folder_train_reads(tmp_path: Path) -> None:
    from spotlight.models.pipelines.folder import read_pipeline_folder

    result = runner.invoke(app, ["make-tiny-pipeline", "qwen-image", str(tmp_path / "qwen")])
    assert result.exit_code == 0, result.output
    assert read_pipeline_folder(tmp_path / "qwen").family == "qwen-image"
    assert one_line_error(runner.invoke(app, ["make-tiny-pipeline", "sdxl", str(tmp_path / "x")])).endswith(
        "use one of sd3, flux, qwen-image, wan, flux-kontext, qwen-image-edit, qwen-image-edit-plus, wan22")
