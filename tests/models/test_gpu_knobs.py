"""What a CUDA trainer does differently, checked on the CPU: no one-core pin, per-block compile, and an
out-of-memory error turned into one line that names the estimate and the knobs that lower it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from spotlight.config import TrainConfig, load_config
from spotlight.models.pipelines.family_config import DiffusersPolicyConfig
from spotlight.models.pipelines.policy import PipelinePolicy
from spotlight.models.rebuild import policy_from_config
from spotlight.run_error import RunError
from spotlight.trainer import train

SMALL = ["rollout.resolution=32", "rollout.prompts_per_iteration=2", "rollout.group_size=2", "rollout.num_steps=2",
         "rollout.sde_steps=null", "train.num_minibatches=1", "train.num_epochs=1", "eval.seeds_per_prompt=1",
         "eval.num_steps=2", "eval.grid_prompts=2", "eval.raw_model=false", "eval.prompts=4", "model.lora_rank=2",
         "mode=vanilla", "iterations=1", "num_threads=1"]


def test_a_cuda_trainer_is_not_pinned_to_one_core() -> None:
    cpu = load_config(TrainConfig, None, ["device_cores=[0]"])
    cuda = load_config(TrainConfig, None, ["device_cores=[0]", "device=cuda"])
    assert cpu.device_core(0) == 0 and cpu.rank_core(0) == 0  # one device = one core on a CPU
    assert cuda.device_core(0) is None and cuda.rank_core(0) is None  # the GPU is the device


@pytest.mark.slow  # inductor compiles C++ kernels for each block: a minute on a busy 2-core machine
def test_model_compile_builds_and_runs_a_forward(tiny_pipeline) -> None:
    config = DiffusersPolicyConfig(family="sd3", pretrained=str(tiny_pipeline("sd3")), pipeline=True,
                                   resolution=(32, 32), dtype="float32", guidance_scale=1.0, compile=True,
                                   max_sequence_length=16)
    policy = policy_from_config(config)
    assert isinstance(policy, PipelinePolicy)
    eager = policy_from_config(config.model_copy(update={"compile": False}))
    assert all(hasattr(block, "_compiled_call_impl") and block._compiled_call_impl is not None
               for block in policy.transformer.transformer_blocks)
    tokens = policy.tokenize(["a red circle"])
    eager.tokenize(["a red circle"])  # each policy has its own prompt cache
    x, sigma = torch.randn(1, *policy.latent_shape), torch.full((1,), 0.5)
    with torch.no_grad():
        torch.testing.assert_close(policy(x, sigma, tokens), eager(x, sigma, tokens), rtol=1e-4, atol=1e-5)


def test_a_cuda_out_of_memory_in_a_run_is_one_line_naming_the_estimate_and_knobs(tiny_pipeline, tmp_path: Path,
                                                                                 monkeypatch) -> None:
    config = load_config(TrainConfig, None, [f"model.pretrained={tiny_pipeline('sd3')}", f"run_dir={tmp_path}",
                                             *SMALL])
    calls = []
    original = PipelinePolicy.forward

    def forward(self, *args, **kwargs):
        calls.append(1)
        if len(calls) > 3:  # a few forwards in: out of memory mid-run, as a GPU would be
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.1 GiB total)")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(PipelinePolicy, "forward", forward)
    with pytest.raises(RunError) as raised:
        train(config)
    message = str(raised.value)
    assert "\n" not in message
    assert "CUDA out of memory. Tried to allocate 2.00 GiB" in message
    assert "the start-up estimate was" in message
    for knob in ("train.micro_batch_size", "model.gradient_checkpointing", "rollout.resolution", "rollout.group_size"):
        assert knob in message
    assert isinstance(raised.value.__cause__, torch.cuda.OutOfMemoryError)
