"""Ulysses token sharding inside Wan2.2's two experts (a tiny two-expert Wan folder) over a real gloo group of 2.

Two spawned ranks build the folder's two-expert policy and call it inside `sequence_parallel` on a batch that
straddles the boundary (sigma 0.9: the high-noise expert; 0.4: the low-noise one), so each expert runs its
rows with its own video-token hooks. The velocity and the parameter gradients summed over the group must equal
the test process's plain call (diffusers' own attention, no hooks).
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
from spotlight.models.pipelines.sequence_parallel import sequence_parallel
from spotlight.models.rebuild import policy_from_config
from spotlight.models.spec import check_sp_policy
from spotlight.models.video.two_experts_policy import TwoExpertsPolicy

WORLD = 2
TOLERANCE = 1e-5


def config_of(folder: str) -> DiffusersPolicyConfig:
    return DiffusersPolicyConfig(family="wan", pretrained=folder, pipeline=True, resolution=(16, 16), num_frames=5,
                                 dtype="float32", guidance_scale=1.0, lora_rank=4, lora_alpha=8.0)


def make_case(folder: str) -> tuple[TwoExpertsPolicy, dict]:
    """The folder's policy with live LoRA on both experts, and its inputs; identical in every process."""
    policy = policy_from_config(config_of(folder))
    assert isinstance(policy, TwoExpertsPolicy)
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for parameter in policy.trainable_parameters():
            parameter.copy_(0.2 * torch.randn(parameter.shape, generator=generator))
    width, _ = policy.prompt_dims
    x = torch.randn(2, policy.channels, 3, 8, 8, generator=generator)  # 48 video tokens
    inputs = {"x": x, "sigma": torch.tensor([0.9, 0.4]),
              "cond": PromptEmbeddings(embeds=torch.randn(2, 5, width, generator=generator)),
              "weight": torch.randn(x.shape, generator=generator) / x.numel()}
    return policy, inputs


def forward_backward(policy: TwoExpertsPolicy, inputs: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    velocity = policy(inputs["x"], inputs["sigma"], inputs["cond"])
    (inputs["weight"] * velocity).sum().backward()
    return velocity.detach(), {name: p.grad.detach().clone() for name, p in policy.named_parameters()
                               if p.grad is not None}


def _spawned_rank(rank: int, folder: str, store_path: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    store = dist.FileStore(store_path, WORLD)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=WORLD, timeout=datetime.timedelta(seconds=60))
    policy, inputs = make_case(folder)
    with sequence_parallel(policy, dist.group.WORLD):
        velocity, grads = forward_backward(policy, inputs)
    for name in sorted(grads):
        dist.all_reduce(grads[name])  # sum over the group: each rank holds its tokens' share
    torch.save({"velocity": velocity, "grads": grads}, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


def test_sp2_over_two_experts_equals_one_device(tiny_pipeline, tmp_path: Path) -> None:
    folder = str(tiny_pipeline("wan22"))
    check_sp_policy(config_of(folder), 2)  # the folder's heads and 3 x 8 x 8 video tokens take degree 2
    run_ranks(_spawned_rank, (folder, str(tmp_path / "store"), str(tmp_path)), WORLD, timeout_s=180,
              preload=("peft", "diffusers.models.transformers", "diffusers.models.autoencoders"))
    torch.set_num_threads(1)
    expected, expected_grads = forward_backward(*make_case(folder))
    assert {name.split(".")[2] for name in expected_grads} == {"0", "1"}  # both experts' LoRA got a gradient
    for rank in range(WORLD):
        result = torch.load(tmp_path / f"rank{rank}.pt")
        assert (result["velocity"] - expected).abs().max() <= TOLERANCE
        assert result["grads"].keys() == expected_grads.keys()
        for name, grad in expected_grads.items():
            torch.testing.assert_close(result["grads"][name], grad, rtol=1e-4, atol=TOLERANCE)


def test_a_video_no_degree_shards_is_refused(tiny_pipeline) -> None:
    config = config_of(str(tiny_pipeline("wan22"))).model_copy(update={"resolution": (12, 12)})  # 27 video tokens
    with pytest.raises(ValueError, match="sp_degree 2"):
        check_sp_policy(config, 2)
