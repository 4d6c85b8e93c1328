"""benchmarks/sim/plan_vs_measured.py: a recorded run is re-planned as it ran, and a profile written from it
predicts it.

The run record here is a fixture in gpu_throughput.py's format with made-up seconds and FLOPs (no GPU
was measured): what is checked is the plumbing from a record to the plan's prediction, and that the
efficiency `--write-profile` writes is the one that makes the plan predict that run's seconds exactly.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `benchmarks.*`

from benchmarks.sim import plan_vs_measured  # noqa: E402  (a benchmark program)
from spotlight.sim.planning.device_profiles import load_profiles  # noqa: E402

SECONDS = {"sample": 9.0, "update": 12.0}  # fixture values, not measurements


def _record() -> dict:
    return {"command": "benchmarks/gpu/gpu_throughput.py --model sd35m", "model": "sd35m", "small": False,
            "device": "NVIDIA H200", "commit": "fixture",
            "setting": {"resolution": 512, "steps": 10, "guidance": 4.5, "prompts": 4, "group": 8, "dtype": "bfloat16"},
            "spotlight": {"images_per_iteration": 32, "phase_s": dict(SECONDS),
                          "flops_per_iteration": {"sample": 1.5e15, "update": 1.6e15}}}


@pytest.fixture(autouse=True)
def _private_count_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPOTLIGHT_CACHE_DIR", str(tmp_path / "count-cache"))


def test_a_gpu_run_is_replanned_at_its_own_setting_and_priced_with_its_gpus_profile(tmp_path: Path) -> None:
    profiles = load_profiles()
    row = plan_vs_measured.compare(_record(), tmp_path, profiles, None)
    sample = row["phases"]["sample"]
    assert row["text_tokens"] == 333  # SD3: CLIP's 77 + T5's 256, not the small setting's
    # 32 images x 10 steps x 2 (true CFG at 4.5) forwards of SD3.5-Medium at 512² (2.44 TFLOP + LoRA 32)
    assert sample["predicted_flops"] == pytest.approx(32 * 10 * 2 * 2.44e12, rel=0.02)
    peak = profiles["H200"].peak_bf16_dense_tflops * 1e12
    assert sample["predicted_s"] == pytest.approx(sample["work_flops"] / (0.17 * peak))
    assert sample["work_flops"] == sample["predicted_flops"]  # a rollout recomputes nothing
    assert sample["time_ratio"] == pytest.approx(sample["predicted_s"] / SECONDS["sample"])
    update = row["phases"]["update"]  # the recipe checkpoints: the device also runs a recompute forward per backward
    assert update["work_flops"] > update["predicted_flops"]


def test_a_profile_written_from_a_run_predicts_that_run(tmp_path: Path) -> None:
    path = tmp_path / "gpus.yaml"
    row = plan_vs_measured.compare(_record(), tmp_path, load_profiles(), None)
    plan_vs_measured._write_profiles(path, [row], Path("gpu_throughput.json"), load_profiles())
    again = plan_vs_measured.compare(_record(), tmp_path, load_profiles(path), None)
    for phase in ("sample", "update"):
        assert again["phases"][phase]["time_ratio"] == pytest.approx(1.0)
    assert "fixture" in load_profiles(path)["H200"].efficiency_source
