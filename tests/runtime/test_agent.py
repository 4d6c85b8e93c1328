"""The node agent with real device processes and real gloo groups: form, break, re-form, resume.

One agent (two devices and one warm spare) serves the module. Golden numbers come from the plain
single-device sampler in this process (`spotlight.models.generation.generate`), a path that shares no code with
the device processes, the sharding or the all-to-alls.
"""

from __future__ import annotations

import dataclasses
import threading
import time

import pytest
import torch
from group_steps import denoise_on_group, single_device
from random_models import randomised_tinydit

from spotlight.diffusion.sampler import SamplingPlan
from spotlight.models.tinydit import TinyDiT, TinyDiTConfig
from spotlight.runtime.queue.request_queue import Request, RequestQueue
from spotlight.runtime.sp.agent import AgentError, GroupBroken, NodeAgent
from spotlight.runtime.sp.reconfigure import plan_groups
from spotlight.tasks import text

CONFIG = TinyDiTConfig(image_size=16, patch_size=4, dim=64, depth=2, num_heads=4)  # 16 + 12 tokens
PLAN = SamplingPlan(num_steps=6)
SP = {16: 2}


def random_model(seed: int) -> TinyDiT:
    """A TinyDiT whose blocks are not the identity (adaLN-Zero would hide attention errors)."""
    return randomised_tinydit(CONFIG, seed, 0.05)


def test_sp2_group_matches_one_device_and_sees_weights_replaced_in_place(agent: NodeAgent) -> None:
    model = random_model(0)
    agent.load_weights(CONFIG, model.state_dict())
    diff = plan_groups({"n0": agent.alive_devices()}, SP, CONFIG.num_heads, cross_node=False)
    agent.form_groups(diff.formed)
    group = diff.formed[0]
    assert (group.generation, group.members) == (0, ("n0/0", "n0/1"))
    request = Request("r0", "a red circle", 11, PLAN, weights_version=0)
    latent = denoise_on_group(agent, group.name, request, CONFIG.latent_shape)
    assert (latent - single_device(model, request)).abs().max().item() <= 1e-5

    other = random_model(1)
    agent.load_weights(CONFIG, other.state_dict())  # same shapes: copied in place, no re-attach
    latent = denoise_on_group(agent, group.name, request, CONFIG.latent_shape)
    assert (latent - single_device(other, request)).abs().max().item() <= 1e-5
    agent.load_weights(CONFIG, model.state_dict())


def test_killed_member_breaks_the_group_and_the_request_resumes_bit_identical(agent: NodeAgent) -> None:
    (group,) = agent.groups()
    request = Request("r1", "two blue squares", 5, PLAN, weights_version=0)
    uninterrupted = denoise_on_group(agent, group.name, request, CONFIG.latent_shape)

    queue = RequestQueue(lease_timeout_s=60.0)
    queue.submit([request])
    reports = []
    serving = threading.Thread(target=lambda: reports.append(agent.serve(queue, group.name, 0)))
    serving.start()
    deadline = time.monotonic() + 60
    while queue.stats().checkpoints < 2 and time.monotonic() < deadline:
        time.sleep(0.005)
    agent.kill_device(1)
    serving.join(timeout=60)
    assert reports and reports[0].stopped_by == "broken" and reports[0].lost_devices == (1,)
    assert reports[0].handed_back == 1 and queue.stats().pending == 1
    assert agent.alive_devices() == [0] and agent.lost_devices() == [1]
    with pytest.raises(GroupBroken, match="lost devices \\[1\\]"):
        agent.run_step(group.name, request, uninterrupted, 0)

    assert agent.replace_lost_devices() == {1: 2}
    diff = plan_groups({"n0": agent.alive_devices()}, SP, CONFIG.num_heads, previous=[group], cross_node=False)
    assert diff.dissolved == (group,) and diff.kept == ()
    agent.dissolve([g.name for g in diff.dissolved])
    agent.form_groups(diff.formed)
    (reformed,) = diff.formed
    assert reformed.generation == group.generation + 1 and reformed.members == ("n0/0", "n0/2")

    report = agent.serve(queue, reformed.name, 0)
    assert report.stopped_by == "drained" and report.completed == 1
    assert 0 < report.steps < PLAN.num_steps  # resumed from a committed step, not from scratch
    assert queue.stats().resumed == 1
    assert torch.equal(queue.results()["r1"], uninterrupted)


def test_groups_need_live_attached_devices_on_this_node(agent: NodeAgent) -> None:
    diff = plan_groups({"n0": [0, 9]}, SP, CONFIG.num_heads, next_generation=50)
    with pytest.raises(AgentError, match="dead, spares or without weights"):
        agent.form_groups(diff.formed)
    elsewhere = plan_groups({"n1": [0, 1]}, SP, CONFIG.num_heads, next_generation=60)
    with pytest.raises(AgentError, match="outside node n0"):
        agent.form_groups(elsewhere.formed)


def test_prompts_go_through_the_tokenizer_of_the_task_the_weights_were_trained_for(agent: NodeAgent) -> None:
    config = dataclasses.replace(CONFIG, task="ocr", vocab_size=len(text.VOCAB))  # the shapes tokenizer refuses OCR
    model = randomised_tinydit(config, 2, 0.05)
    agent.load_weights(config, model.state_dict())  # new shapes: every device process re-attaches
    (group,) = agent.groups()
    request = Request("r2", text.random_prompts(torch.Generator().manual_seed(0), 1)[0], 3, PLAN, weights_version=0)
    latent = denoise_on_group(agent, group.name, request, config.latent_shape)
    assert (latent - single_device(model, request)).abs().max().item() <= 1e-5
