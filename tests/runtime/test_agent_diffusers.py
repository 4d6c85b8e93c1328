"""The node agent serving a diffusers LoRA policy (configs/qwen-image-tiny-lora.yaml) with SP-2 groups.

The agent is sent only the LoRA matrices; each device process rebuilds the frozen Qwen-Image base and
its text encoder from the config's ``init_seed``, and the group shards the image and text tokens
(`spotlight.models.pipelines.sequence_parallel`). Golden numbers come from the plain single-device sampler in this
process (`spotlight.models.generation.generate`), which shares no code with the device processes, the
sharding or the all-to-alls. One agent (two devices and one warm spare) serves the module.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch
from group_steps import denoise_on_group, single_device

from spotlight.config import TrainConfig, load_config
from spotlight.diffusion.sampler import SamplingPlan
from spotlight.loop.base_policy import build_policy
from spotlight.models.pipelines.adapter import DiffusersPolicy
from spotlight.models.spec import attention_heads, check_sp_policy
from spotlight.runtime.queue.request_queue import Request, RequestQueue
from spotlight.runtime.sp.agent import NodeAgent
from spotlight.runtime.sp.reconfigure import plan_groups

CONFIG_FILE = Path(__file__).resolve().parents[2] / "configs" / "qwen-image-tiny-lora.yaml"
PLAN = SamplingPlan(num_steps=4, shift=3.0, sampler="sde", noise_level=0.7)
TOLERANCE = 1e-5


def trained_policy(seed: int) -> DiffusersPolicy:
    """The config's policy with LoRA B drawn at random: a LoRA at zero would hide a lost or misplaced update."""
    policy = build_policy(load_config(TrainConfig, CONFIG_FILE, []))
    generator = torch.Generator().manual_seed(seed)
    state = {name: torch.randn(tensor.shape, generator=generator) * 0.2 if ".lora_B." in name else tensor
             for name, tensor in policy.broadcast_state().items()}
    policy.load_broadcast_state(state)
    return policy.eval()


def sp_degrees(policy: DiffusersPolicy) -> dict[int, int]:
    return {policy.latent_shape[-1]: 2}


def test_an_sp2_group_given_only_lora_weights_matches_one_device(agent: NodeAgent) -> None:
    policy = trained_policy(0)
    lora = policy.broadcast_state()
    assert lora and all(".lora_A." in name or ".lora_B." in name for name in lora)
    agent.load_weights(policy.config, lora)
    heads = attention_heads(policy.config)
    assert heads == int(policy.transformer.config.num_attention_heads) == 2
    diff = plan_groups({"n0": agent.alive_devices()}, sp_degrees(policy), heads, cross_node=False)
    agent.form_groups(diff.formed)
    (group,) = diff.formed
    assert group.members == ("n0/0", "n0/1")
    request = Request("r0", "a red circle", 11, PLAN, weights_version=0)
    latent = denoise_on_group(agent, group.name, request, policy.latent_shape)
    expected = single_device(policy, request)
    assert (latent - expected).abs().max().item() <= TOLERANCE

    other = trained_policy(1)  # same shapes: the LoRA is replaced in place, the processes see it
    agent.load_weights(other.config, other.broadcast_state())
    latent = denoise_on_group(agent, group.name, request, other.latent_shape)
    moved = single_device(other, request)
    assert (moved - expected).abs().max().item() > 1e-3  # the LoRA matters to the sample
    assert (latent - moved).abs().max().item() <= TOLERANCE
    agent.load_weights(policy.config, lora)


def test_after_a_member_dies_the_reformed_group_resumes_the_request_and_matches_one_device(agent: NodeAgent) -> None:
    policy = trained_policy(0)
    (group,) = agent.groups()
    request = Request("r1", "two blue squares", 5, PLAN, weights_version=0)
    queue = RequestQueue(lease_timeout_s=60.0)
    queue.submit([request])
    reports = []
    serving = threading.Thread(target=lambda: reports.append(agent.serve(queue, group.name, 0, min_step_s=0.2)))
    serving.start()
    deadline = time.monotonic() + 60
    while queue.stats().checkpoints < 1 and time.monotonic() < deadline:
        time.sleep(0.005)
    agent.kill_device(1)
    serving.join(timeout=60)
    assert reports and reports[0].stopped_by == "broken" and reports[0].handed_back == 1

    assert agent.replace_lost_devices() == {1: 2}  # the spare built the base when the weights came
    heads = attention_heads(policy.config)
    diff = plan_groups({"n0": agent.alive_devices()}, sp_degrees(policy), heads, previous=[group], cross_node=False)
    agent.dissolve([g.name for g in diff.dissolved])
    agent.form_groups(diff.formed)
    (reformed,) = diff.formed
    assert reformed.generation == group.generation + 1 and reformed.members == ("n0/0", "n0/2")
    report = agent.serve(queue, reformed.name, 0)
    assert report.stopped_by == "drained" and report.completed == 1
    assert 0 < report.steps < PLAN.num_steps and queue.stats().resumed == 1
    assert (queue.results()["r1"] - single_device(policy, request)).abs().max().item() <= TOLERANCE


def test_sp_degrees_that_cannot_shard_a_diffusers_policy_are_refused_in_one_line() -> None:
    config = load_config(TrainConfig, CONFIG_FILE, []).model
    qwen = config.diffusers_config("shapes", 64, (32, 32))
    check_sp_policy(qwen, 2)
    with pytest.raises(ValueError, match="does not divide num_heads 2"):
        check_sp_policy(qwen, 4)
    odd_prompt = config.model_copy(update={"max_text_len": 11}).diffusers_config("shapes", 64, (32, 32))
    with pytest.raises(ValueError, match="sequence length 11"):
        check_sp_policy(odd_prompt, 2)
    sd3 = config.model_copy(update={"family": "sd3"}).diffusers_config("shapes", 64, (32, 32))
    with pytest.raises(ValueError, match="not sd3"):
        check_sp_policy(sd3, 2)
    check_sp_policy(sd3, 1)
