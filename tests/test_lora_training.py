"""`spotlight train` on diffusers transformers with LoRA (configs/*-tiny-lora.yaml): every family in vanilla
mode, SD3 in stale-explore mode and through the CLI; checkpoints hold only LoRA tensors and the base reference."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from spotlight.cli import app
from spotlight.components.checkpoint import load_model, load_training_state
from spotlight.config import TrainConfig, load_config
from spotlight.loop.base_policy import build_policy
from spotlight.models.generation import prompt_tokens
from spotlight.rewards.base import RewardOutput
from spotlight.trainer import train

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
FAMILIES = ["sd3", "flux", "qwen-image"]


class BrightnessReward:
    """Mean pixel brightness: every sample of a random base earns a different reward, so LoRA is updated
    (the shapes reward gives a random base's noise 0 everywhere: no advantage, no update)."""

    name = "brightness"

    def score(self, images: torch.Tensor, prompts) -> RewardOutput:
        rewards = images.mean(dim=(1, 2, 3))
        return RewardOutput(rewards, rewards > 0.5, torch.ones(len(prompts), dtype=torch.bool))


def lora_config(family: str, run_dir: Path, *overrides: str) -> TrainConfig:
    return load_config(TrainConfig, CONFIGS / f"{family}-tiny-lora.yaml", [
        "iterations=2", f"run_dir={run_dir}", "pin_devices=false", "num_threads=1", "checkpoint_every=1",
        "eval.every=2", "eval.prompts=4", *overrides])


def is_lora(name: str) -> bool:
    return ".lora_A." in name or ".lora_B." in name


@pytest.fixture(scope="module")
def vanilla_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A finished 2-iteration vanilla run of every family (shared: a run takes seconds)."""
    runs = {}
    for family in FAMILIES:
        run_dir = tmp_path_factory.mktemp(family) / "run"
        train(lora_config(family, run_dir), reward=BrightnessReward())
        runs[family] = run_dir
    return runs


@pytest.mark.parametrize("family", FAMILIES)
def test_a_lora_run_checkpoints_only_lora_tensors_and_a_reference_to_its_base(family: str,
                                                                                vanilla_runs: dict) -> None:
    run_dir = vanilla_runs[family]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [record["iteration"] for record in records] == [0, 1, 2]
    checkpoint = run_dir / "checkpoints" / "iter-000002"
    description = json.loads((checkpoint / "model.json").read_text())
    assert description["architecture"] == "DiffusersPolicy"
    assert description["base"] == {"tiny": True, "init_seed": 0}
    assert description["config"]["family"] == family and description["config"]["task"] == "shapes"
    lora_shapes: set[tuple[int, ...]] = set()
    for path in [*checkpoint.glob("*.safetensors"), run_dir / "checkpoints" / "best" / "model.safetensors"]:
        tensors = load_file(str(path))
        assert tensors and all(is_lora(name) for name in tensors), path.name
        lora_shapes |= {tuple(t.shape) for t in tensors.values()}
    lora_numel = sum(t.numel() for t in load_file(str(checkpoint / "model.safetensors")).values())
    optimizer = load_training_state(checkpoint).optimizer
    moments = [t for state in optimizer["state"].values() for t in state.values() if t.dim() > 0]
    # Adam's two moments of the LoRA matrices that got a gradient, nothing of the base
    assert moments and {tuple(t.shape) for t in moments} <= lora_shapes
    assert sum(t.numel() for t in moments) <= 2 * lora_numel
    policy = build_policy(lora_config(family, run_dir))
    assert lora_numel < sum(p.numel() for p in policy.parameters()) / 4


@pytest.mark.parametrize("family", FAMILIES)
def test_a_lora_checkpoint_loads_into_the_trained_policy_on_a_rebuilt_base(family: str, vanilla_runs: dict) -> None:
    checkpoint = vanilla_runs[family] / "checkpoints" / "iter-000002"
    trained = load_model(checkpoint)
    start = build_policy(lora_config(family, vanilla_runs[family]))
    saved = load_file(str(checkpoint / "model.safetensors"))
    assert all(torch.equal(trained.broadcast_state()[name], tensor) for name, tensor in saved.items())
    moved = [name for name, tensor in start.broadcast_state().items() if not torch.equal(tensor, saved[name])]
    assert any(".lora_B." in name for name in moved)  # the updates reached LoRA
    base = {n: t for n, t in start.state_dict().items() if "lora_" not in n}
    assert all(torch.equal(t, base[n]) for n, t in trained.state_dict().items() if "lora_" not in n)
    x = torch.randn(2, *trained.latent_shape, generator=torch.Generator().manual_seed(0))
    tokens = prompt_tokens(trained, ["a red circle", "a blue square"])
    with torch.no_grad():
        assert not torch.equal(trained(x, torch.tensor([0.5, 0.5]), tokens), start(x, torch.tensor([0.5, 0.5]), tokens))


def test_resuming_a_lora_run_gives_the_lora_weights_of_an_uninterrupted_run(vanilla_runs: dict, tmp_path) -> None:
    run_dir = tmp_path / "run"
    train(lora_config("sd3", run_dir, "iterations=1"), reward=BrightnessReward())
    train(lora_config("sd3", run_dir), resume=True, reward=BrightnessReward())
    resumed = load_file(str(run_dir / "checkpoints" / "iter-000002" / "model.safetensors"))
    uninterrupted = load_file(str(vanilla_runs["sd3"] / "checkpoints" / "iter-000002" / "model.safetensors"))
    assert resumed.keys() == uninterrupted.keys()
    assert all(torch.equal(resumed[name], uninterrupted[name]) for name in resumed)


def test_stale_explore_runs_a_lora_policy(tmp_path) -> None:
    run_dir = tmp_path / "run"
    summary = train(lora_config("sd3", run_dir, "mode=stale-explore", "explore.monitor_every=1"),
                    reward=BrightnessReward())
    assert [record["iteration"] for record in summary.history] == [0, 1, 2]
    assert all("staleness/kendall_tau" in record and "explore/selected_reward_std" in record
               for record in summary.history[1:])
    assert all(-1.0 <= record["explore/preview_fidelity"] <= 1.0 for record in summary.history[1:])  # brightness varies


def test_spotlight_train_with_the_sd3_config_runs_from_the_command_line(tmp_path) -> None:
    result = CliRunner().invoke(app, ["train", "-c", str(CONFIGS / "sd3-tiny-lora.yaml"), "-s", "iterations=2",
                                      "-s", f"run_dir={tmp_path / 'run'}", "-s", "pin_devices=false",
                                      "-s", "eval.prompts=4"])  # of the 80: validation is not the subject
    assert result.exit_code == 0, result.output
    assert "val strict acc" in result.output
    assert (tmp_path / "run" / "checkpoints" / "iter-000002" / "model.json").is_file()
