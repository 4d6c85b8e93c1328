"""benchmarks/gpu/gpu_throughput.py: refuses to pass CPU numbers off as a GPU's, and its small mode runs the
recipe's path.

Without CUDA and without ``--small`` it exits 2 with one line. ``--small`` runs the SD3.5-M recipe (its
prompt set, its OCR reward overlapped with sampling, text encoders at published depths) on tiny widths on
the CPU, three timed iterations, diffusers' own pipe() on the same prompts, and writes its own JSON with
the per-phase table. The numbers describe the plumbing, not a GPU: what is checked is that each is there,
that the phases add up, and that the two paths count the same transformer FLOPs per step up to LoRA.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `benchmarks.*`

from benchmarks.gpu import gpu_throughput  # noqa: E402  (a benchmark program)

STEPS = gpu_throughput.SMALL["steps"]
IMAGES = gpu_throughput.SMALL["prompts"] * gpu_throughput.SMALL["group"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="with CUDA the benchmark runs for real")
def test_without_cuda_and_without_small_it_exits_2_with_one_line(capsys: pytest.CaptureFixture[str],
                                                                  tmp_path: Path) -> None:
    assert gpu_throughput.main(["--model", "sd35m", "--out", str(tmp_path / "gpu.json")]) == 2
    out = capsys.readouterr()
    assert out.out.count("\n") == 1 and "no CUDA device" in out.out and "--small" in out.out and not out.err
    assert not (tmp_path / "gpu.json").exists()


def test_the_small_mode_never_writes_the_gpu_results_file(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        gpu_throughput.main(["--small", "--out", str(gpu_throughput.RESULTS / "gpu_throughput.json")])
    assert stopped.value.code == 2 and "not into the GPU results file" in capsys.readouterr().err
    assert gpu_throughput.SMALL_OUT.name == "gpu_throughput_small_cpu.json"


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> dict:
    work = tmp_path_factory.mktemp("gpu-throughput")
    out = work / "result.json"
    assert gpu_throughput.main(["--small", "--model", "sd35m", "--peak-tflops", "1", "--work-dir", str(work),
                                "--out", str(out)]) == 0
    return json.loads(out.read_text())["runs"]["sd35m"]


@pytest.mark.slow
def test_the_json_names_the_commit_machine_recipe_and_published_encoder_depths(result: dict) -> None:
    assert result["benchmark"] == "gpu_throughput" and result["small"] is True
    assert result["commit"] and result["machine"] and result["device"].startswith("cpu")
    assert result["torch"] == torch.__version__ and result["diffusers"]
    assert "12 layers" in result["text_encoders"] and "32 layers" in result["text_encoders"]
    assert "t5 width 32 x 24 layers" in result["text_encoders"]
    setting = result["setting"]
    assert setting["recipe"] == "configs/sd35m-ocr-lora.yaml" and setting["dataset"].startswith("ocr")
    assert "ocr" in setting["reward"] and setting["reward_overlap"] is True and setting["steps"] == STEPS


@pytest.mark.slow
def test_three_timed_iterations_give_a_phase_table_that_adds_up(result: dict) -> None:
    spot = result["spotlight"]
    assert spot["timed_iterations"] == 3 and len(spot["iteration_s"]) == 3
    phases = spot["phases"]
    for name in (*gpu_throughput.PHASES, "reward busy", "rest", "bytes h2d", "bytes d2h", "iteration"):
        assert phases[name]["min"] <= phases[name]["median"] <= phases[name]["max"], name
    assert all(phases[name]["median"] > 0 for name in ("sample", "decode", "update"))
    assert phases["bytes h2d"]["max"] == 0 and phases["bytes d2h"]["max"] == 0  # a CPU run: nothing crosses
    for row in spot["phase_s_per_iteration"]:
        assert row["rest"] >= -1e-6 and sum(row[name] for name in gpu_throughput.PHASES) <= row["iteration"] + 1e-6
    assert spot["load_s"] >= spot["startup_encode_s"] >= 0
    assert spot["transformer_calls_per_iteration"]["sample"] == {"forward": STEPS, "training": 0}
    assert spot["transformer_calls_per_iteration"]["update"]["training"] >= 1
    assert spot["estimate_bytes"] > 0 and spot["peak_memory_bytes"] is None  # no CUDA allocator: not guessed


@pytest.mark.slow
def test_diffusers_pipe_ran_on_the_same_prompts_and_counts_the_same_flops_per_step_up_to_lora(result: dict) -> None:
    reference, spot = result["reference"], result["spotlight"]
    assert reference["prompts"] == spot["prompts_first_timed_iteration"] and reference["images"] == IMAGES
    assert reference["seconds"] > 0 and reference["transformer_calls"] == STEPS  # SD3: one batched CFG forward a step
    per_step_reference = reference["flops"] / STEPS
    per_step_spotlight = spot["flops_per_iteration"]["sample"] / STEPS
    assert per_step_reference <= per_step_spotlight <= 1.5 * per_step_reference
    derived = result["derived"]
    assert derived["images_per_gpu_s"] == pytest.approx(IMAGES / spot["iteration_s_median"])
    assert derived["mfu_update"] == pytest.approx(spot["flops_per_iteration"]["update"] / spot["phase_s"]["update"]
                                                  / 1e12)
