"""The reward service end to end: a real server on 127.0.0.1 scoring with the real GenEval reward."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import torch

from spotlight.rewards.geneval.reward import GenEvalReward
from spotlight.rewards.server.client import HTTPReward
from spotlight.rewards.server.server import FaultPlan, RewardServer
from spotlight.tasks.render import render_batch
from spotlight.tasks.shapes import train_val_split


def quantised(images: torch.Tensor) -> torch.Tensor:
    """What the server sees: images travel as uint8."""
    return (images * 255).round() / 255


@pytest.fixture
def start_server() -> Iterator:
    servers: list[RewardServer] = []

    def start(**kwargs) -> RewardServer:
        server = RewardServer(GenEvalReward(), port=0, **kwargs)
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def shapes_batch(count: int) -> tuple[torch.Tensor, list[str]]:
    validation = train_val_split()[1]
    prompts = [validation[i % len(validation)] for i in range(count)]
    return quantised((render_batch(prompts, seed=3) + 1) / 2), prompts


def test_binds_to_localhost_by_default(start_server) -> None:
    assert start_server().server_address[0] == "127.0.0.1"


def test_scores_match_the_reward_in_process(start_server) -> None:
    images, prompts = shapes_batch(40)
    server = start_server()
    out = HTTPReward(server.url, max_request_images=16).score(images, prompts)
    expected = GenEvalReward().score(images, prompts)
    assert out.valid.all()
    torch.testing.assert_close(out.rewards, expected.rewards)
    assert torch.equal(out.strict, expected.strict)


def test_concurrent_requests_are_merged_into_batches(start_server) -> None:
    images, prompts = shapes_batch(64)
    server = start_server(max_wait_s=0.05)
    out = HTTPReward(server.url, max_request_images=1, concurrency=16).score(images, prompts)
    assert out.valid.all()
    assert server.batcher.batches_scored < 64


def test_server_down_marks_every_sample_with_the_fix() -> None:
    images, prompts = shapes_batch(3)
    out = HTTPReward("http://127.0.0.1:9", timeout_s=1.0, retries=1, backoff_s=0.01).score(images, prompts)
    assert not out.valid.any()
    assert len(out.errors) == 3
    assert all("serve-reward" in line for line in out.errors)


def test_thousand_requests_with_failures_and_timeouts_lose_no_sample_silently(start_server) -> None:
    images, prompts = shapes_batch(1000)
    server = start_server(faults=FaultPlan(failure_rate=0.05, delay_rate=0.05, delay_s=0.6, seed=1))
    client = HTTPReward(server.url, timeout_s=0.3, retries=1, backoff_s=0.01, max_request_images=1, concurrency=16)
    out = client.score(images, prompts)  # one request per image: 1,000 requests, plus retries
    expected = GenEvalReward().score(images, prompts)

    assert server.faults_injected["fail"] > 20 and server.faults_injected["delay"] > 20
    assert out.rewards.shape == (1000,)
    scored = out.valid
    torch.testing.assert_close(out.rewards[scored], expected.rewards[scored])
    marked = {int(line.split(" ", 2)[1]) for line in out.errors}
    unscored = set(torch.nonzero(~scored).flatten().tolist())
    assert unscored == marked  # every sample is scored, or explicitly marked with its reason
    assert (out.rewards[~scored] == 0).all()
    assert scored.sum() > 950  # a retry recovers nearly every faulty request
