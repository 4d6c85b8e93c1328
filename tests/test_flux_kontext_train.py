"""FLUX.1 Kontext edits end to end (issue 45): a tiny random ``FluxKontextPipeline`` folder trained on the
shipped, generated ``shapes-edit`` set.

Each sample is a row: its instruction and its source image, whose latents join the transformer's input.
The reward is ``edit-preserve`` (1 - the mean absolute difference from the row's own source image; no
model, so the run needs no download). Modes ``vanilla`` and ``spotlight`` train (the validation reward rises), every
checkpoint's LoRA loads with ``FluxKontextPipeline``'s own ``load_lora_weights`` and changes its edit, and a
vanilla run SIGKILLed after a checkpoint resumes to the uninterrupted run's weights and rewards bit for bit
(the source latents are re-encoded by the resumed process: their cache is not part of a checkpoint).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from resume_helpers import assert_a_killed_run_resumes_to, metrics

from spotlight.components.checkpoint import latest_checkpoint
from spotlight.config import TrainConfig, parse_config
from spotlight.data.shipped import resolve_dataset_folder
from spotlight.trainer import train

ITERATIONS = 4
DETERMINISTIC = ("rollout/", "train/", "val/reward")  # the rest are timings


def settings(folder: Path, run_dir: Path) -> dict[str, Any]:
    return {
        "mode": "vanilla", "iterations": ITERATIONS, "run_dir": str(run_dir), "pin_devices": False, "num_threads": 1,
        "checkpoint_every": 1,
        "model": {"pretrained": str(folder), "lora_rank": 2, "max_sequence_length": 32},
        "data": {"dataset": "shapes-edit"},
        "rollout": {"resolution": 32, "prompts_per_iteration": 2, "group_size": 8, "num_steps": 2,
                    "sde_steps": None, "guidance_scale": 2.5},
        "train": {"num_minibatches": 1, "num_epochs": 1, "learning_rate": 0.05},
        "reward": {"name": "edit-preserve"},
        "eval": {"every": 1, "seeds_per_prompt": 1, "num_steps": 2, "grid_prompts": 2, "raw_model": False,
                 "prompts": 2},
    }


@pytest.fixture(scope="module")
def vanilla_run(tiny_pipeline, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An uninterrupted vanilla run, in this process: what the other tests train from or compare with."""
    run_dir = tmp_path_factory.mktemp("kontext") / "clean"
    train(parse_config(TrainConfig, settings(tiny_pipeline("flux-kontext"), run_dir)))
    return run_dir


@pytest.mark.slow
def test_vanilla_mode_trains_kontext_edits_and_every_lora_loads_into_kontext_pipeline(vanilla_run: Path,
                                                                                      tiny_pipeline) -> None:
    import diffusers
    from PIL import Image

    folder = tiny_pipeline("flux-kontext")
    run_dir = vanilla_run
    records = metrics(run_dir)
    assert [record["iteration"] for record in records] == list(range(ITERATIONS + 1))
    assert all(record["rollout/invalid_samples"] == 0 for record in records[1:])
    # each iteration draws other rows (other source images), so the rollout's mean moves with them; the
    # validation rows and seeds are fixed: their reward rises (0.841403 -> 0.841904 when written)
    assert records[-1]["val/reward"] - records[0]["val/reward"] > 2e-4, [r["val/reward"] for r in records]

    pipe = diffusers.FluxKontextPipeline.from_pretrained(str(folder))
    pipe.set_progress_bar_config(disable=True)
    source = Image.open(resolve_dataset_folder("shapes-edit") / "images" / "0000.png").convert("RGB").resize((32, 32))

    def edit() -> torch.Tensor:
        return pipe(image=source, prompt="make the circle blue", height=32, width=32, num_inference_steps=2,
                    guidance_scale=2.5, max_sequence_length=32, max_area=32 * 32, _auto_resize=False,
                    output_type="latent", generator=torch.Generator().manual_seed(0)).images

    before = edit()
    checkpoints = sorted(path for path in run_dir.rglob("pytorch_lora_weights.safetensors"))
    assert len(checkpoints) >= ITERATIONS
    for index, checkpoint in enumerate(checkpoints):  # each with the pipeline's own loader, as an adapter of its own
        pipe.load_lora_weights(str(checkpoint.parent), adapter_name=f"iteration{index}")
        pipe.set_adapters([f"iteration{index}"])
        assert (edit() - before).abs().max() > 1e-3, checkpoint
    assert latest_checkpoint(run_dir) is not None


@pytest.mark.slow
def test_spotlight_mode_trains_kontext_edits(tiny_pipeline, tmp_path: Path) -> None:
    """Explored edits on a spot device (another process: it encodes each row's instruction and source itself)."""
    import ray

    config = settings(tiny_pipeline("flux-kontext"), tmp_path / "run")
    config.update(mode="spotlight", explore={"monitor_prompts": 1})
    config["eval"]["every"] = ITERATIONS  # the first and the last validation: what the rise is read from
    config["runtime"] = {"trace": None, "max_wall_s": None, "explore_wait_s": 120.0, "node_timeout_s": 240.0,
                         "planner": {"num_candidates": [8], "num_steps": [2]}}
    summary = train(parse_config(TrainConfig, config))
    assert any("planner/num_candidates" in record for record in summary.history[2:])
    records = metrics(tmp_path / "run")
    assert [record["iteration"] for record in records] == list(range(ITERATIONS + 1))
    assert records[-1]["val/reward"] - records[0]["val/reward"] > 2e-4, [r["val/reward"] for r in records]
    assert not ray.is_initialized()


@pytest.mark.slow
def test_a_kontext_run_killed_after_a_checkpoint_resumes_to_the_uninterrupted_result(vanilla_run: Path,
                                                                                      tiny_pipeline,
                                                                                      tmp_path: Path) -> None:
    """``spotlight train`` SIGKILLed (with everything it started) once a checkpoint is on disk and before the
    last, then ``--resume``: every iteration's rewards and losses and the final LoRA equal the clean run's."""
    assert_a_killed_run_resumes_to(settings(tiny_pipeline("flux-kontext"), tmp_path / "killed"), vanilla_run,
                                   ITERATIONS, DETERMINISTIC)
