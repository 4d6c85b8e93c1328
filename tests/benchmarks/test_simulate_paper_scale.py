"""benchmarks/sim/simulate_paper_scale.py: the README's paper-scale workload is counted from a folder, not typed.

The default run derives the simulator's workload from the shipped config-only Qwen-Image folder through
`PlanConfig` (as `spotlight simulate -s model.pretrained=...` does), a later ``-s`` wins over the
default's, ``--typed`` keeps the file's hand-typed section, and the results page names the folder.
Meta-device counts are kept in the default count cache, as tests/sim/planning/test_plan.py's are.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # the repository root: `benchmarks.*`

from benchmarks.headline import headline  # noqa: E402
from benchmarks.sim import simulate_paper_scale as paper  # noqa: E402  (a benchmark program)
from benchmarks.sim.sections import simulate_paper_scale  # noqa: E402

CONFIG = str(REPO / "configs" / "simulate-paper.yaml")


def test_the_default_workload_is_counted_from_the_qwen_image_folder() -> None:
    config, _, source = paper.load_simulation(CONFIG, list(paper.QWEN_IMAGE))
    assert source["kind"] == "folder" and source["folder"] == "spotlight/sim/planning/model_configs/qwen-image"
    assert source["overrides"] == list(paper.QWEN_IMAGE) and source["resolution"] == [1280, 1280]
    # 6400 image + 37 text tokens through Qwen-Image's 60 blocks with LoRA 64 (docs/planning.md: 119 TFLOP)
    assert source["flops_per_forward"] == pytest.approx(119.3e12, rel=0.02)
    assert config.workload.flops_per_forward == source["flops_per_forward"]  # the simulator runs on the count
    assert config.workload.train_flops_per_sample == source["update_flops_per_sample"]
    assert config.workload.num_layers == 60 and config.workload.mfu == source["gpu_profile"]["rollout_efficiency"]
    assert (config.loop.prompts_per_iteration, config.loop.group_size) == (32, 16)


def test_a_later_override_wins_and_typed_keeps_the_files_section() -> None:
    config, _, source = paper.load_simulation(CONFIG, [*paper.QWEN_IMAGE, "rollout.resolution=512"])
    assert source["resolution"] == [512, 512] and config.workload.resolution == 512
    assert source["flops_per_forward"] < 119.3e12 / 5  # 1,024 image tokens, not 6,400
    typed, _, typed_source = paper.load_simulation(CONFIG, [])
    assert typed_source == {"kind": "typed", "config": "configs/simulate-paper.yaml", "overrides": []}
    assert typed.workload.flops_per_forward is None and typed.workload.params == 20e9


def test_the_page_and_readme_row_name_the_folder_not_a_typed_model() -> None:
    source = {"kind": "folder", "pretrained": "qwen-image", "resolution": [1280, 1280], "algorithm": "nft",
              "finetune": "lora", "lora_rank": 64, "flops_per_forward": 119.3e12, "overrides": ["x=1"]}
    result = {"workload_source": source, "config": {"cluster": {"on_demand_devices": 32, "spot_devices": 32,
                                                                "trace": "t.csv"}},
              "ratios": {"vanilla": {"faster": 1.5, "cheaper": 1.25}}, "drivers": {"alpha": 1.2}}
    row = headline(lambda stem: result if stem == "simulate_paper_scale" else None).rows[0]
    assert "`qwen-image`'s workload derived from its folder's configs: 1280×1280, nft lora 64, 119 TFLOP" in row[0]
    assert "B-parameter" not in row[0] and "**1.50× faster, 1.25× cheaper**" in row[1]
    tables = simulate_paper_scale(result)
    assert "derived from its folder's configs" in tables[0].caption and tables[0].rows[1][1] == "`x=1`"
    typed = {**result, "workload_source": {"kind": "typed"},
             "config": {"workload": {"params": 20e9, "resolution": 1280}}}
    assert "typed workload: 20 B-parameter DiT at 1280²" in simulate_paper_scale(typed)[0].caption
