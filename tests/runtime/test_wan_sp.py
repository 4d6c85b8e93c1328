"""Ulysses token sharding inside Wan2.1's transformer (a tiny random Wan folder) over a real gloo group of 2.

Two spawned ranks load the folder's ``WanTransformer3DModel`` as a pipeline policy and call it inside
`sequence_parallel` over a group of 2 (SP-2): video tokens sharded, self-attention through the Ulysses
all-to-alls with Wan's 3D rotary rows of each rank's tokens, cross-attention to the whole UMT5 text.
They save the velocity and the parameter gradients summed over the group. The golden numbers come
from the test process: the same policy called plainly, through diffusers' own ``WanAttnProcessor`` and
its rotary table (SP-1), a path that shares no code with the hooks and the all-to-alls under test.
"""

from __future__ import annotations

import datetime
import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from gloo_ranks import run_ranks

from spotlight.models.pipelines.family_config import DiffusersPolicyConfig
from spotlight.models.pipelines.inputs import PromptEmbeddings
from spotlight.models.pipelines.policy import PipelinePolicy
from spotlight.models.pipelines.sequence_parallel import sequence_parallel

WORLD = 2
TOLERANCE = 1e-5
BATCH, TEXT_TOKENS = 2, 5  # an odd prompt length: Wan's text is not sharded, so it need not divide
VIDEO = (3, 8, 8)  # latent frames, height, width: 3 x 4 x 4 = 48 video tokens of (1, 2, 2) patches
ODD_VIDEO = (3, 6, 6)  # 3 x 3 x 3 = 27 video tokens: no degree 2 shards them


def make_case(folder: str) -> tuple[PipelinePolicy, dict]:
    """The folder's policy with every weight trainable and its LoRA live, and its inputs; identical in every process."""
    config = DiffusersPolicyConfig(family="wan", pretrained=folder, pipeline=True, resolution=(16, 16), num_frames=5,
                                   dtype="float32", guidance_scale=1.0, lora_rank=4, lora_alpha=8.0)
    policy = PipelinePolicy.from_config(config)
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for parameter in policy.trainable_parameters():  # LoRA A is drawn unseeded, B starts at zero: set both
            parameter.copy_(0.2 * torch.randn(parameter.shape, generator=generator))
    policy.requires_grad_(True)  # base weights too: every parameter's gradient is checked
    width, _ = policy.prompt_dims
    x = torch.randn(BATCH, policy.channels, *VIDEO, generator=generator)
    inputs = {"x": x, "sigma": torch.tensor([0.9, 0.4]),
              "cond": PromptEmbeddings(embeds=torch.randn(BATCH, TEXT_TOKENS, width, generator=generator)),
              "weight": torch.randn(x.shape, generator=generator) / x.numel()}
    return policy, inputs


def forward_backward(policy: PipelinePolicy, inputs: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The velocity and every parameter's gradient of the loss sum(weight * velocity)."""
    velocity = policy(inputs["x"], inputs["sigma"], inputs["cond"])
    (inputs["weight"] * velocity).sum().backward()
    grads = {name: p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)
             for name, p in policy.named_parameters()}
    return velocity.detach(), grads


def _spawned_rank(rank: int, folder: str, store_path: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    store = dist.FileStore(store_path, WORLD)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=WORLD, timeout=datetime.timedelta(seconds=60))
    policy, inputs = make_case(folder)
    default_processors = {name: type(p) for name, p in policy.transformer.attn_processors.items()}
    with sequence_parallel(policy, dist.group.WORLD):
        velocity, grads = forward_backward(policy, inputs)
    for grad in grads.values():
        dist.all_reduce(grad)  # sum over the group: each rank holds its tokens' share
    restored = {name: type(p) for name, p in policy.transformer.attn_processors.items()} == default_processors
    results: dict = {"velocity": velocity, "grads": grads, "processors_restored": restored}
    odd = torch.randn(BATCH, policy.channels, *ODD_VIDEO)
    try:
        with torch.no_grad(), sequence_parallel(policy, dist.group.WORLD):
            policy(odd, inputs["sigma"], inputs["cond"])
        results["odd_video_error"] = None
    except ValueError as error:
        results["odd_video_error"] = str(error)
    dist.barrier()
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def wan_folder(tiny_pipeline) -> Path:
    return tiny_pipeline("wan")


@pytest.fixture(scope="module")
def rank_results(wan_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """Spawn the two gloo ranks once for the module; returns each rank's saved results."""
    out = tmp_path_factory.mktemp("wan_sp")
    run_ranks(_spawned_rank, (str(wan_folder), str(out / "store"), str(out)), WORLD, timeout_s=180,
              preload=("peft", "diffusers.models.transformers", "diffusers.models.autoencoders"))
    return [torch.load(out / f"rank{rank}.pt") for rank in range(WORLD)]


@pytest.fixture(scope="module")
def single_device(wan_folder: Path) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    torch.set_num_threads(1)
    policy, inputs = make_case(str(wan_folder))
    return forward_backward(policy, inputs)


def _max_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return float((actual - expected).abs().max())


def test_sp2_velocity_equals_one_device_on_every_rank(rank_results: list[dict], single_device: tuple) -> None:
    expected, _ = single_device
    assert expected.shape == (BATCH, 4, *VIDEO) and expected.abs().max() > 0.1  # a live model
    for result in rank_results:
        assert _max_error(result["velocity"], expected) <= TOLERANCE


def test_sp2_parameter_gradients_summed_over_the_group_equal_one_device(rank_results: list[dict],
                                                                         single_device: tuple) -> None:
    _, expected = single_device
    nonzero = {name for name, grad in expected.items() if grad.abs().max() > 0}
    assert set(expected) - nonzero == set()  # the loss reaches every weight: attn1, attn2, FFN, rope-free parts
    assert any(".attn1." in name and ".lora_B." in name for name in nonzero)
    assert any(".attn2." in name and ".lora_A." in name for name in nonzero)
    for result in rank_results:
        grads = result["grads"]
        assert set(grads) == set(expected)
        worst = max(expected, key=lambda name: _max_error(grads[name], expected[name]))
        assert _max_error(grads[worst], expected[worst]) <= TOLERANCE, worst


def test_both_ranks_hold_the_same_velocity_and_summed_gradients(rank_results: list[dict]) -> None:
    first, second = rank_results
    assert torch.equal(first["velocity"], second["velocity"])
    assert all(torch.equal(first["grads"][name], second["grads"][name]) for name in first["grads"])


def test_the_attention_processors_are_restored_after_the_block(rank_results: list[dict]) -> None:
    assert all(result["processors_restored"] for result in rank_results)


def test_a_video_the_degree_cannot_shard_is_refused_in_one_line_naming_it(rank_results: list[dict]) -> None:
    for result in rank_results:
        error = result["odd_video_error"]
        assert error is not None and "\n" not in error
        assert "sp_degree 2 does not divide the 27 video tokens of latents (4, 3, 6, 6)" in error
