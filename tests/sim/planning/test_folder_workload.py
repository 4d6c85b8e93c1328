"""One iteration's work from a folder: the update's passes against the real update loops, memory, config-only folders.

The passes per sample are checked by running Spotlight's own `nft_update` and `grpo_update` on a policy
that counts the rows each model is called with (with or without gradients), not against the formula.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from spotlight.config import load_config
from spotlight.plan_config import PlanConfig
from spotlight.rl.grpo import RolloutBatch, grpo_update
from spotlight.rl.nft import nft_update
from spotlight.sim.planning.device_profiles import profile
from spotlight.sim.planning.folder_workload import DoesNotFitError, derive_workload, update_passes
from spotlight.sim.planning.model_folders import model_folder as model_folder_path

SAMPLES, STEPS = 8, 6


class CountingPolicy(torch.nn.Module):
    """v = w x: counts the rows it is called with, split by whether gradients are on."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(()))
        self.rows = {"with gradients": 0, "without": 0}

    def forward(self, x: torch.Tensor, sigma: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        self.rows["with gradients" if torch.is_grad_enabled() else "without"] += x.shape[0]
        return self.weight * x


def _batch() -> RolloutBatch:
    generator = torch.Generator().manual_seed(0)
    return RolloutBatch(latents=torch.randn(SAMPLES, STEPS + 1, 1, 2, 2, generator=generator),
                        log_probs=torch.zeros(SAMPLES, STEPS), tokens=torch.zeros(SAMPLES, 1, dtype=torch.int64),
                        advantages=torch.linspace(-1, 1, SAMPLES) + 0.01, sigmas=torch.linspace(1, 0, STEPS + 1),
                        noise_level=0.7, stochastic_steps=None)


def _config(*overrides: str) -> PlanConfig:
    return load_config(PlanConfig, None, ["model.pretrained=sd3.5-medium", f"rollout.num_steps={STEPS}",
                                          "rollout.sde_steps=4", *overrides])


@pytest.mark.parametrize("overrides", [(), ("train.nft_kl_beta=0",), ("train.num_epochs=3", "train.nft_timesteps=1")])
def test_nft_passes_per_sample_are_what_nft_update_runs(overrides: tuple[str, ...]) -> None:
    config = _config("train.algorithm=nft", *overrides)
    model, old, reference = CountingPolicy(), CountingPolicy(), CountingPolicy()
    nft_update(model, old, torch.optim.SGD(model.parameters(), lr=0.0), _batch(), config.train,
               torch.Generator().manual_seed(0), reference)
    passes = update_passes(config, guided=False)
    assert passes["forward and backward"] * SAMPLES == model.rows["with gradients"]
    assert passes["sampling-policy forward"] * SAMPLES == old.rows["without"]
    assert passes.get("reference forward", 0) * SAMPLES == reference.rows["without"]


@pytest.mark.parametrize("overrides", [(), ("train.kl_beta=0",), ("train.timestep_fraction=0.5",)])
def test_flow_grpo_passes_per_sample_are_what_grpo_update_runs(overrides: tuple[str, ...]) -> None:
    config = _config("train.algorithm=flow-grpo", *overrides)
    model, reference = CountingPolicy(), CountingPolicy()
    batch = _batch()
    batch = RolloutBatch(**{**batch.__dict__, "stochastic_steps": 4})  # the rollout's 4 SDE steps
    grpo_update(model, reference, torch.optim.SGD(model.parameters(), lr=0.0), batch, config.train,
                torch.Generator().manual_seed(0))
    passes = update_passes(config, guided=False)
    assert passes["forward and backward"] * SAMPLES == model.rows["with gradients"]
    assert passes.get("reference forward", 0) * SAMPLES == reference.rows["without"]
    # a guided step's log-prob runs the conditional and unconditional rows in one batch (PipelinePolicy.forward)
    assert update_passes(config, guided=True)["forward and backward"] == 2 * passes["forward and backward"]


def test_gradient_checkpointing_adds_one_forward_per_backward() -> None:
    passes = update_passes(_config("model.gradient_checkpointing=true"), guided=False)
    assert passes["checkpoint recompute forward"] == passes["forward and backward"]


def test_a_folder_of_configs_alone_counts_what_the_folder_with_weights_counts(tiny_pipeline, tmp_path) -> None:
    with_weights = tiny_pipeline("sd3")
    configs_only = tmp_path / "configs-only"
    shutil.copytree(with_weights, configs_only, ignore=shutil.ignore_patterns("*.safetensors"))
    assert not list(configs_only.rglob("*.safetensors"))
    device = profile("H100-SXM")
    works = [derive_workload(load_config(PlanConfig, None, [f"model.pretrained={folder}", "rollout.resolution=32"]),
                             device) for folder in (with_weights, configs_only)]
    read, built = works
    assert (built.parameters, built.text_encoder_parameters, built.vae_parameters, built.forward_flops) == (
        read.parameters, read.text_encoder_parameters, read.vae_parameters, read.forward_flops)
    assert read.text_encoder_parameters > 0 and read.vae_parameters > 0


def test_a_model_that_fits_no_micro_batch_names_what_would_make_it_fit() -> None:
    config = load_config(PlanConfig, None, ["model.pretrained=qwen-image", "rollout.resolution=1280",
                                            "model.finetune=full"])
    with pytest.raises(DoesNotFitError) as error:
        derive_workload(config, profile("H100-SXM"))
    line = str(error.value)
    assert "\n" not in line
    for fix in ("model.finetune=lora", "FSDP over", "model.gradient_checkpointing=true", "lower rollout.resolution"):
        assert fix in line


def test_the_largest_micro_batch_that_fits_is_chosen() -> None:
    config = _config("rollout.resolution=1024", "rollout.prompts_per_iteration=16", "rollout.group_size=16")
    work = derive_workload(config, profile("H100-SXM"))
    assert work.memory.total <= profile("H100-SXM").memory_bytes
    assert work.micro_batch < work.minibatch_rows  # the whole minibatch of 1024² rows does not fit 80 GB
    bigger = derive_workload(load_config(PlanConfig, None, [
        "model.pretrained=sd3.5-medium", "rollout.resolution=1024", "rollout.prompts_per_iteration=16",
        "rollout.group_size=16", f"train.micro_batch_size={work.micro_batch * 2}", "plan.gpu=H200"]), profile("H200"))
    assert bigger.micro_batch >= work.micro_batch  # 141 GB holds at least as many rows


def test_shipped_transformer_configs_match_the_gpu_benchmarks(tmp_path: Path) -> None:
    """benchmarks/model_configs (gpu_throughput.py's folders) and the plan's shipped folders: one architecture."""
    import json

    from spotlight.sim.planning.model_folders import model_folder

    root = Path(__file__).resolve().parents[3] / "benchmarks" / "model_configs"
    for shipped, benchmark in (("sd3.5-medium", "sd35m"), ("qwen-image", "qwen-image")):
        ours = json.loads((model_folder(shipped) / "transformer" / "config.json").read_text())
        theirs = json.loads((root / benchmark / "transformer.json").read_text())
        assert ours == {key: value for key, value in theirs.items() if not key.startswith("_") or key == "_class_name"}


def test_a_part_with_neither_weights_nor_config_is_one_line(tmp_path) -> None:
    from spotlight.models.pipelines.folder import PipelineFolderError

    folder = tmp_path / "no-t5-config"
    shutil.copytree(model_folder_path("sd3.5-medium"), folder)
    (folder / "text_encoder_3" / "config.json").unlink()
    with pytest.raises(PipelineFolderError, match="text_encoder_3 has neither safetensors nor a config.json") as error:
        derive_workload(load_config(PlanConfig, None, [f"model.pretrained={folder}", "rollout.resolution=512"]),
                        profile("H100-SXM"))
    assert "\n" not in str(error.value)


def test_lora_all_reduces_its_adapters_and_full_fine_tuning_every_weight(tiny_pipeline) -> None:
    folder = tiny_pipeline("qwen-image")
    works = {finetune: derive_workload(load_config(PlanConfig, None, [
        f"model.pretrained={folder}", "rollout.resolution=32", f"model.finetune={finetune}"]), profile("H100-SXM"))
        for finetune in ("lora", "full")}
    lora, full = works["lora"], works["full"]
    assert full.gradient_bytes == 4 * full.parameters  # float32 gradients of every transformer weight
    assert 0 < lora.gradient_bytes == 4 * lora.trainable_parameters < full.gradient_bytes
    assert full.all_reduce_bytes_per_device(8) == pytest.approx(2 * 7 / 8 * full.gradient_bytes)  # a ring
    assert full.all_reduce_bytes_per_device(1) == 0
