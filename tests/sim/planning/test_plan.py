"""`spotlight plan` and `spotlight simulate` on a folder: the answer's parts, --json, and one line per bad input."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from spotlight.cli import app
from spotlight.sim.planning.model_folders import model_folder

runner = CliRunner()
# a 20-iteration target keeps each simulated mix short (a plan simulates ~30): the answer has every part still
SD35 = ["-s", "model.pretrained=sd3.5-medium", "-s", "rollout.resolution=512", "-s", "rollout.guidance_scale=4.5",
        "-s", "convergence.vanilla_iterations=20"]


def one_line_error(arguments: list[str]) -> str:
    result = runner.invoke(app, arguments)
    lines = [line for line in result.output.strip().splitlines() if line.strip()]
    assert result.exit_code == 2, result.output
    assert len(lines) == 1, result.output
    return lines[0]


def test_plan_json_gives_the_split_the_memory_the_mixes_and_the_assumptions() -> None:
    result = runner.invoke(app, ["plan", "48", *SD35, "--json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    work = plan["workload"]
    assert work["family"] == "sd3" and work["image_tokens"] == 1024 and work["text_tokens"] == 333
    assert work["tflop_per_forward"] == pytest.approx(2.44, rel=0.01)  # LoRA rank 4 adds a little
    assert work["rollout_forwards_per_image"] == 20  # 10 steps, true CFG
    split = plan["iteration_s"]
    assert split["rollout"] > 0 and split["update"] > 0 and split["total"] >= split["rollout"] + split["update"]
    gpu = plan["per_gpu"]
    assert 0 < gpu["memory_gib"] <= gpu["device_memory_gib"]
    assert gpu["images_per_gpu_s"] == pytest.approx(
        1 / (gpu["rollout_device_s_per_image"] + gpu["update_device_s_per_sample"]))
    best = plan["cheapest_mix"]["with_exploration"]
    assert best["meets_deadline"] and best["time_to_target_s"] <= 48 * 3600
    assert plan["cheapest_mix"]["without_exploration"] is not None
    names = {row["name"] for row in plan["assumptions"]}
    assert {"α (convergence exponent)", "τ one_step_kendall_tau", "rollout efficiency"} <= names
    assert all(row["source"] for row in plan["assumptions"])


def test_simulate_takes_its_workload_from_the_folder() -> None:
    result = runner.invoke(app, ["simulate", *SD35, "--modes", "vanilla,spotlight"])
    assert result.exit_code == 0, result.output
    assert "workload from" in result.output and "2.4" in result.output


def test_a_deadline_no_mix_meets_is_one_line() -> None:
    assert "no mix meets 0.001 h" in one_line_error(["plan", "0.001", *SD35])


def test_a_transformer_class_spotlight_does_not_know_is_one_line(tmp_path: Path) -> None:
    folder = tmp_path / "odd"
    shutil.copytree(model_folder("sd3.5-medium"), folder)
    config = folder / "transformer" / "config.json"
    config.write_text(config.read_text().replace("SD3Transformer2DModel", "HunyuanDiT2DModel"))
    line = one_line_error(["plan", "48", "-s", f"model.pretrained={folder}"])
    assert "HunyuanDiT2DModel" in line and "SD3Transformer2DModel" in line


def test_a_resolution_the_model_cannot_take_is_one_line() -> None:
    assert "divisible by 16" in one_line_error(["plan", "48", *SD35, "-s", "rollout.resolution=500"])


def test_a_missing_gpu_profile_is_one_line() -> None:
    assert "has no GPU profile" in one_line_error(["plan", "48", *SD35, "-s", "plan.gpu=B200"])


def test_a_gpu_with_no_priced_machine_is_one_line() -> None:
    assert "cluster.price_overrides" in one_line_error(["plan", "48", *SD35, "-s", "plan.gpu=H200"])


def test_a_model_that_fits_no_gpu_is_one_line() -> None:
    line = one_line_error(["plan", "48", "-s", "model.pretrained=qwen-image", "-s", "rollout.resolution=1280",
                           "-s", "model.finetune=full"])
    assert "does not fit one H100-SXM" in line and "FSDP over" in line
