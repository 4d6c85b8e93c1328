"""The spot worker's loop binds each request's prompts once and reads nothing back per denoising step.

Counted as in tests/models/test_host_syncs.py (no GPU here): every host read of a tensor is wrapped while
`worker_loop` serves a real tiny SD3 pipeline policy from an in-process `RequestQueue`. A request's work
may cost a fixed number of them (tokenizing and binding its prompt, handing its latent back), so a round
of K-step requests must cost the same whatever K. The former loop passed token ids to every forward,
which bound them again (reading the ids on the host) at each step. The one host read per step left is
the sampler's of its own float64 schedule, a CPU tensor it builds itself, which is not counted.
"""

from __future__ import annotations

import collections
import contextlib
import threading
from collections.abc import Iterator

import pytest
import torch

from spotlight.diffusion.sampler import SamplingPlan
from spotlight.models.pipelines.family_config import DiffusersPolicyConfig
from spotlight.models.pipelines.policy import PipelinePolicy
from spotlight.models.rebuild import policy_from_config
from spotlight.runtime.queue.request_queue import Request, RequestQueue
from spotlight.runtime.spot.worker import WorkerSettings, worker_loop

SYNC_POINTS = ("item", "tolist", "cpu", "numpy", "nonzero", "__bool__", "__float__", "__int__", "__index__")
PROMPTS = ("a red circle", "a blue square", "two green triangles")


@contextlib.contextmanager
def counting(monkeypatch: pytest.MonkeyPatch) -> Iterator[collections.Counter]:
    """Count host reads (but the sampler's float64 schedule) and prompt bindings while the block runs."""
    counts: collections.Counter = collections.Counter()

    def counted(name: str, original):
        def call(self, *args, **kwargs):
            if not (name == "tolist" and self.dtype == torch.float64):
                counts[name] += 1
            return original(self, *args, **kwargs)
        return call

    bind = PipelinePolicy.bind_prompts

    def counted_bind(self, tokens):
        counts["bind_prompts"] += 1
        return bind(self, tokens)

    with monkeypatch.context() as patch:
        for name in SYNC_POINTS:
            patch.setattr(torch.Tensor, name, counted(name, getattr(torch.Tensor, name)))
        patch.setattr(PipelinePolicy, "bind_prompts", counted_bind)
        yield counts


@pytest.fixture(scope="module")
def policy(tiny_pipeline) -> PipelinePolicy:
    config = DiffusersPolicyConfig(family="sd3", pretrained=str(tiny_pipeline("sd3")), pipeline=True,
                                   resolution=(32, 32), dtype="float32", guidance_scale=4.5, negative_prompt="blurry",
                                   max_sequence_length=32)
    model = policy_from_config(config)
    assert isinstance(model, PipelinePolicy)
    return model.eval()


def serve_round(policy: PipelinePolicy, steps: int, monkeypatch: pytest.MonkeyPatch) -> collections.Counter:
    queue = RequestQueue()
    plan = SamplingPlan(num_steps=steps, sampler="sde", noise_level=0.7)
    queue.submit([Request(f"r{index}", PROMPTS[index], 300 + index, plan, weights_version=0) for index in range(3)])
    settings = WorkerSettings(capacity=3, forward_batch=2, heartbeat_s=600.0, idle_wait_s=0.01)
    with counting(monkeypatch) as counts, torch.no_grad():
        report = worker_loop(queue, "w", policy, settings, threading.Event(), weights_version=0)
    assert report.completed == 3 and report.steps == 3 * steps
    return counts


def test_a_rounds_host_reads_do_not_grow_with_its_steps(policy: PipelinePolicy, monkeypatch) -> None:
    serve_round(policy, 1, monkeypatch)  # the prompts' first encoding fills the policy's cache: not per round
    short, long = serve_round(policy, 2, monkeypatch), serve_round(policy, 6, monkeypatch)
    assert long == short, f"host reads per round grew with the step count: {dict(short)} at 2 steps, {dict(long)} at 6"
    assert short["bind_prompts"] == 2  # the group's two forward_batch chunks, bound once for the whole round


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_latents_stay_on_the_workers_gpu(policy: PipelinePolicy, monkeypatch) -> None:
    """On a GPU every forward sees latents already on the device: nothing goes to the host between steps."""
    model = policy.to("cuda")
    seen: list[torch.device] = []
    forward = model.forward

    def watched(x, sigma, cond):
        seen.append(x.device)
        return forward(x, sigma, cond)

    monkeypatch.setattr(model, "forward", watched)
    try:
        counts = serve_round(model, 3, monkeypatch)
    finally:
        model.to("cpu")
    assert seen and all(device.type == "cuda" for device in seen)
    assert counts["cpu"] == 3  # the only host copies: each completed latent, handed back once
