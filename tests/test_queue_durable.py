"""The durable queue without Ray: what a new queue replayed from the log holds, torn tails, retried calls."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from spotlight.diffusion.sampler import SamplingPlan
from spotlight.runtime.queue.durable import DurableQueue
from spotlight.runtime.queue.log import QueueLogError, decode_tensor, encode_tensor
from spotlight.runtime.queue.request_queue import QueueError, Request

PLAN = SamplingPlan(num_steps=4)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def requests(count: int) -> list[Request]:
    return [Request(f"r{k}", "a red circle", 100 + k, PLAN, weights_version=3) for k in range(count)]


def latent(value: float) -> torch.Tensor:
    return torch.full((3, 4, 4), value) + torch.arange(48.0).reshape(3, 4, 4) / 7


def test_tensors_come_back_bit_for_bit() -> None:
    for tensor in (torch.randn(3, 4, 4), torch.randn(2, 5).to(torch.bfloat16), torch.zeros(0, 3),
                   torch.tensor([float("nan"), -0.0, float("inf")])):
        back = decode_tensor(encode_tensor(tensor))
        assert back.dtype == tensor.dtype and back.shape == tensor.shape
        assert torch.equal(back.view(-1).view(torch.uint8) if back.numel() else back,
                           tensor.reshape(-1).view(torch.uint8) if tensor.numel() else tensor)


def test_a_restarted_queue_holds_what_the_lost_one_had_told_its_callers(tmp_path: Path) -> None:
    log, clock = tmp_path / "queue.jsonl", Clock()
    queue = DurableQueue(log, lease_timeout_s=5.0, clock=clock)
    assert queue.submit(requests(5)) == 5
    leases = queue.pull("w1", 3, weights_version=3)
    assert [lease.request.request_id for lease in leases] == ["r0", "r1", "r2"]
    assert queue.commit("w1", "r0", latent(1.0), 2, 3)  # a notice: back to pending at step 2
    assert queue.commit("w1", "r1", latent(2.0), 1, 3, keep_lease=True)  # a checkpoint: still w1's
    assert queue.complete("w1", "r2", latent(3.0), 3)
    queue.take_results(["r2"])
    assert queue.complete_many("w1", [], 3) == []
    queue.cancel(["r4"])
    before = queue.stats()

    clock.now = 100.0  # the new actor's clock: leases last one timeout from its start
    again = DurableQueue(log, lease_timeout_s=5.0, clock=clock)
    stats = again.stats()
    assert stats.restarts == 1
    assert (stats.submitted, stats.pending, stats.leased, stats.done) == (5, 2, 1, 2)
    assert (stats.commits, stats.checkpoints, stats.cancelled) == (before.commits, before.checkpoints, 1)
    assert again.heartbeat("w1") == ["r1"]  # the live worker keeps its lease
    assert again.complete("w1", "r2", latent(3.0), 3) is False  # done before: a duplicate, not stored
    assert again.results_of(["r2"]) == {}  # handed over before the loss
    lease = again.pull("w2", 5, weights_version=3)
    assert [x.request.request_id for x in lease] == ["r0", "r3"]  # resumed work first
    assert lease[0].step == 2 and torch.equal(lease[0].latent, latent(1.0))
    clock.now = 103.0
    again.heartbeat("w2")
    clock.now = 106.0
    resumed = again.pull("w3", 5, 3)  # w1's lease lapsed: resumed at its checkpoint
    assert [x.request.request_id for x in resumed] == ["r1"] and torch.equal(resumed[0].latent, latent(2.0))
    assert again.stats().resumed == 2


def test_a_late_completion_from_a_worker_of_the_lost_queue_is_kept_once(tmp_path: Path) -> None:
    log = tmp_path / "queue.jsonl"
    queue = DurableQueue(log)
    queue.submit(requests(1))
    queue.pull("w1", 1, 3)
    again = DurableQueue(log)
    again.release("w1")  # its node died
    assert again.complete("w1", "r0", latent(5.0), 3)  # a holder before the restart: recognised, kept
    third = DurableQueue(log)
    assert torch.equal(third.results_of(["r0"])["r0"], latent(5.0)) and third.stats().restarts == 2


def test_retried_calls_change_nothing_twice(tmp_path: Path) -> None:
    queue = DurableQueue(tmp_path / "queue.jsonl")
    assert queue.submit(requests(3)) == 3
    assert queue.submit(requests(3)) == 0  # a submit retried after a restart
    with pytest.raises(QueueError, match="another request"):
        queue.submit([Request("r0", "a blue square", 1, PLAN, weights_version=3)])
    queue.pull("w", 3, 3)
    assert queue.complete_many("w", [("r0", latent(1.0))], 3) == [True]
    assert queue.complete_many("w", [("r0", latent(1.0))], 3) == [False]  # retried: a counted duplicate
    results = queue.results_of(["r0", "r1"])
    assert list(results) == ["r0"] and queue.results_of(["r0"]).keys() == results.keys()  # reading twice is safe
    assert queue.forget(["r0"]) == 1 and queue.forget(["r0"]) == 0


def test_a_torn_last_line_is_dropped_and_cut_off_but_damage_before_it_is_refused(tmp_path: Path) -> None:
    log = tmp_path / "queue.jsonl"
    queue = DurableQueue(log)
    queue.submit(requests(2))
    queue.pull("w", 1, 3)
    intact = log.read_bytes()
    with open(log, "ab") as file:
        file.write(b'{"id":"r0","status":"do')  # the process died mid-append
    again = DurableQueue(log)
    assert again.stats().leased == 1 and log.read_bytes() == intact  # the torn tail is gone
    again.complete("w", "r0", latent(1.0), 3)
    assert torch.equal(DurableQueue(log).results_of(["r0"])["r0"], latent(1.0))  # appends after the cut replay

    lines = log.read_bytes().split(b"\n")
    lines[1] = b"not json"
    log.write_bytes(b"\n".join(lines))
    with pytest.raises(QueueLogError, match="line 2 is damaged"):
        DurableQueue(log)
