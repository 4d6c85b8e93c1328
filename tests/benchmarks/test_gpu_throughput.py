"""benchmarks/gpu_throughput.py's small mode runs on a CPU and writes every number the GPU run is judged by.

The numbers describe the plumbing (tiny widths, two steps, one thread), not a GPU: what is checked is
that each is there, positive where it is a time, and that the ratios are the ratios of the times. One
cross-check comes from a second path: diffusers' own pipeline and Spotlight's sampler run the same
transformer on the same rows (prompts x images x CFG halves, the same padded text), so their FLOPs per
step agree up to Spotlight's LoRA adapters.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import gpu_throughput  # noqa: E402  (a benchmark program, imported from its folder)

STEPS = gpu_throughput.SMALL["steps"]
IMAGES = gpu_throughput.SMALL["prompts"] * gpu_throughput.SMALL["group"]


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> dict:
    work = tmp_path_factory.mktemp("gpu-throughput")
    out = work / "result.json"
    assert gpu_throughput.main(["--small", "--model", "sd35m", "--peak-tflops", "1", "--work-dir", str(work),
                                "--out", str(out)]) == 0
    return json.loads(out.read_text())["runs"]["sd35m"]


def test_the_json_names_the_commit_device_versions_and_what_the_text_encoders_are(result: dict) -> None:
    assert result["benchmark"] == "gpu_throughput" and result["small"] is True
    assert result["commit"] and result["device"].startswith("cpu")
    assert result["torch"] == torch.__version__ and result["diffusers"]
    assert "2 layer(s)" in result["text_encoders"] and "t5 width" in result["text_encoders"]
    assert result["setting"]["steps"] == STEPS and result["peak_flops"] == 1e12


def test_every_phase_took_time_and_the_forwards_run_are_the_ones_counted(result: dict) -> None:
    reference, spot = result["reference"], result["spotlight"]
    assert reference["seconds"] > 0 and reference["images"] == IMAGES
    assert all(spot["phase_s"][phase] > 0 for phase in ("sample", "decode", "reward", "update"))
    assert spot["timed_iterations"] == 1 and spot["iteration_s_median"] >= sum(spot["phase_s"].values())
    # SD3 with CFG: one batched forward (conditional and negative halves) per step, in both loops
    assert reference["transformer_calls"] == STEPS
    assert spot["transformer_calls_per_iteration"]["sample"] == {"forward": STEPS, "training": 0}
    assert spot["transformer_calls_per_iteration"]["update"]["training"] >= 1
    assert spot["estimate_bytes"] > 0
    assert spot["peak_memory_bytes"] is None  # no CUDA allocator here: not measured, not guessed


def test_ratios_are_the_ratios_of_the_measured_times_and_flops(result: dict) -> None:
    reference, spot, derived = result["reference"], result["spotlight"], result["derived"]
    phase = spot["phase_s"]
    assert derived["images_per_gpu_s"] == pytest.approx(IMAGES / spot["iteration_s_median"])
    assert derived["sample_plus_decode_vs_reference"] == pytest.approx(
        (phase["sample"] + phase["decode"]) / reference["seconds"])
    flops = spot["flops_per_iteration"]
    assert derived["mfu_update"] == pytest.approx(flops["update"] / phase["update"] / 1e12)
    assert 0 < derived["mfu_sample"] < 1 and 0 < derived["mfu_reference"] < 1
    assert derived["estimate_vs_peak_memory"] is None


def test_the_sampler_and_diffusers_pipeline_count_the_same_flops_per_step_up_to_lora(result: dict) -> None:
    per_step_reference = result["reference"]["flops"] / STEPS
    per_step_spotlight = result["spotlight"]["flops_per_iteration"]["sample"] / STEPS
    assert per_step_reference <= per_step_spotlight <= 1.5 * per_step_reference
