"""Elastic SP-2 on a tiny Wan2.1 text-to-video folder: a member killed mid-rollout, the group re-formed, the same video.

The node agent is sent only the LoRA matrices and the policy's description; each device process loads
the folder (its ``WanTransformer3DModel``, and its UMT5 encoder for the prompt), and the group shards the
video tokens (`spotlight.models.video.wan_sp`). Golden numbers come from the plain single-device sampler
in this process (`spotlight.models.generation.generate`), which shares no code with the device
processes, the sharding or the all-to-alls. One agent (two devices and one warm spare) serves the module.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch
from group_steps import denoise_on_group, single_device

from spotlight.diffusion.sampler import SamplingPlan
from spotlight.models.pipelines.family_config import DiffusersPolicyConfig
from spotlight.models.pipelines.policy import PipelinePolicy
from spotlight.models.spec import attention_heads, check_sp_policy, latent_shape_of
from spotlight.runtime.queue.request_queue import Request, RequestQueue
from spotlight.runtime.sp.agent import NodeAgent
from spotlight.runtime.sp.reconfigure import plan_groups

PLAN = SamplingPlan(num_steps=4, shift=3.0, sampler="sde", noise_level=0.7)  # noise from (seed, step) streams
TOLERANCE = 1e-5
VIDEO = (4, 3, 8, 8)  # 5 frames of 16 x 16 pixels: 3 latent frames of 8 x 8, 48 video tokens


def wan_config(folder: Path, **fields) -> DiffusersPolicyConfig:
    return DiffusersPolicyConfig(**{**dict(family="wan", pretrained=str(folder), pipeline=True, resolution=(16, 16),
                                           num_frames=5, dtype="float32", guidance_scale=1.0, max_sequence_length=16,
                                           lora_rank=4, lora_alpha=8.0), **fields})


def trained_policy(folder: Path, seed: int) -> PipelinePolicy:
    """The folder's policy with its LoRA drawn at random: a LoRA at zero would hide a lost or misplaced update."""
    policy = PipelinePolicy.from_config(wan_config(folder))
    generator = torch.Generator().manual_seed(seed)
    policy.load_broadcast_state({name: torch.randn(tensor.shape, generator=generator) * 0.2
                                 for name, tensor in policy.broadcast_state().items()})
    return policy.eval()


@pytest.fixture(scope="module")
def wan_folder(tiny_pipeline) -> Path:
    return tiny_pipeline("wan")


@pytest.fixture(scope="module")
def policy(wan_folder: Path) -> PipelinePolicy:
    torch.set_num_threads(1)
    return trained_policy(wan_folder, 0)


def test_the_spec_reads_a_wan_folders_heads_and_video_latents_from_its_config(wan_folder: Path) -> None:
    config = wan_config(wan_folder)
    assert attention_heads(config) == 2 and latent_shape_of(config) == VIDEO
    check_sp_policy(config, 2)
    with pytest.raises(ValueError, match="does not divide num_heads 2"):
        check_sp_policy(config, 4)
    with pytest.raises(ValueError, match="does not divide the sequence length 27"):  # 3 frames x 3 x 3 patches
        check_sp_policy(wan_config(wan_folder, resolution=(12, 12)), 2)


def test_an_sp2_group_given_only_lora_weights_denoises_the_video_one_device_does(agent: NodeAgent,
                                                                                 policy: PipelinePolicy) -> None:
    lora = policy.broadcast_state()
    assert lora and all(".lora_A." in name or ".lora_B." in name for name in lora)
    agent.load_weights(policy.config, lora)
    diff = plan_groups({"n0": agent.alive_devices()}, {VIDEO[-1]: 2}, attention_heads(policy.config),
                       cross_node=False)
    agent.form_groups(diff.formed)
    (group,) = diff.formed
    assert group.members == ("n0/0", "n0/1")
    request = Request("w0", "a red ball rolls left", 11, PLAN, weights_version=0)
    latent = denoise_on_group(agent, group.name, request, VIDEO)
    expected = single_device(policy, request)
    assert latent.shape == expected.shape == VIDEO and expected.abs().max() > 0.1
    assert (latent - expected).abs().max().item() <= TOLERANCE


def test_a_member_killed_mid_rollout_the_reformed_group_finishes_the_same_video(agent: NodeAgent,
                                                                                policy: PipelinePolicy) -> None:
    (group,) = agent.groups()
    request = Request("w1", "two blue cubes spin", 5, PLAN, weights_version=0)
    uninterrupted = denoise_on_group(agent, group.name, request, VIDEO)
    queue = RequestQueue(lease_timeout_s=60.0)
    queue.submit([request])
    reports = []
    serving = threading.Thread(target=lambda: reports.append(agent.serve(queue, group.name, 0, min_step_s=0.2)))
    serving.start()
    deadline = time.monotonic() + 60
    while queue.stats().checkpoints < 1 and time.monotonic() < deadline:
        time.sleep(0.005)
    agent.kill_device(1)  # SIGKILL: a real process dies between (or inside) the group's collectives
    serving.join(timeout=60)
    assert reports and reports[0].stopped_by == "broken" and reports[0].handed_back == 1

    assert agent.replace_lost_devices() == {1: 2}  # the spare loaded the folder when the weights came
    diff = plan_groups({"n0": agent.alive_devices()}, {VIDEO[-1]: 2}, attention_heads(policy.config),
                       previous=[group], cross_node=False)
    agent.dissolve([g.name for g in diff.dissolved])
    agent.form_groups(diff.formed)
    (reformed,) = diff.formed
    assert reformed.generation == group.generation + 1 and reformed.members == ("n0/0", "n0/2")
    report = agent.serve(queue, reformed.name, 0)
    assert report.stopped_by == "drained" and report.completed == 1
    assert 0 < report.steps < PLAN.num_steps and queue.stats().resumed == 1  # resumed, not started over
    finished = queue.results()["w1"]
    assert (finished - uninterrupted).abs().max().item() <= TOLERANCE
    assert (finished - single_device(policy, request)).abs().max().item() <= TOLERANCE
