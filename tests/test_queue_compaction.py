"""The queue log compacted at each checkpoint (issue 43): bounded by the work in flight, the same state after a
replay, late calls for forgotten requests ignored, and one complete log whenever the process is SIGKILLed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import torch

from spotlight.diffusion.sampler import SamplingPlan
from spotlight.runtime.queue.durable import DurableQueue
from spotlight.runtime.queue.request_queue import Request

PLAN = SamplingPlan(num_steps=4)


def result_of(seed: int) -> torch.Tensor:
    return torch.full((4, 8, 8), float(seed))


def one_round(queue: DurableQueue, version: int, size: int = 8, keep: int = 0) -> list[str]:
    """A round of exploration as the backend runs it: submit, lease, commit, complete, take; ``keep`` left undone."""
    ids = [f"x{version}-{k}" for k in range(size)]
    queue.submit([Request(rid, "a red circle", 1000 * version + k, PLAN, version) for k, rid in enumerate(ids)])
    leases = queue.pull("w", size, version)
    for lease in leases[keep:]:
        queue.commit("w", lease.request.request_id, result_of(lease.request.seed) / 2, 2, version, keep_lease=True)
        queue.complete("w", lease.request.request_id, result_of(lease.request.seed), version)
    queue.results_of(ids)
    queue.forget(ids)
    return ids


def test_a_compacted_log_replays_to_the_same_work_in_flight(tmp_path: Path) -> None:
    log = tmp_path / "queue-log-0.jsonl"
    queue = DurableQueue(log)
    ids = [f"r{k}" for k in range(6)]
    queue.submit([Request(rid, "a red circle", 100 + k, PLAN, 3) for k, rid in enumerate(ids)])
    leases = {lease.request.request_id: lease for lease in queue.pull("w", 3, 3)}
    queue.commit("w", "r0", result_of(7), 2, 3, keep_lease=True)  # in flight, with a committed latent
    queue.complete("w", "r1", result_of(1), 3)
    queue.complete("w", "r2", result_of(2), 3)
    queue.take_results(["r1"])  # r1 handed over: settled; r2's result still waits for the driver
    queue.cancel(["r3"])  # cancelled: settled
    before, after = queue.compact()
    assert after < before
    assert set(leases) == {"r0", "r1", "r2"}

    again = DurableQueue(log)
    assert set(again._entries) == {"r0", "r2", "r4", "r5"}
    assert torch.equal(again._entries["r0"].latent, result_of(7)) and again._entries["r0"].step == 2
    assert torch.equal(again.results_of(["r1", "r2"])["r2"], result_of(2))
    stats = again.stats()
    assert (stats.submitted, stats.done, stats.pending, stats.leased) == (6, 3, 2, 1)
    assert stats.restarts == 1
    # a late completion of a forgotten request is ignored and counted, never stored, after a replay too
    assert again.complete("w", "r1", result_of(99), 3) is False
    assert again.stats().forgotten_calls == 1 and "r1" not in again.results_of(["r1"])
    new = again.submit([Request("r9", "a blue square", 9, PLAN, 4)])
    assert new == 1 and again._entries["r9"].order > max(e.order for rid, e in again._entries.items() if rid != "r9")


def test_the_log_stays_bounded_by_the_work_in_flight_over_200_rounds(tmp_path: Path) -> None:
    compacted, grown = DurableQueue(tmp_path / "compacted.jsonl"), DurableQueue(tmp_path / "grown.jsonl")
    sizes = []
    for version in range(200):
        for queue in (compacted, grown):
            one_round(queue, version)
        compacted.compact()  # at the checkpoint
        sizes.append(compacted.log_path.stat().st_size)
    assert max(sizes) <= sizes[0] + 64  # only the counters survive a settled round (their digits grow)
    assert grown.log_path.stat().st_size > 100 * sizes[-1]
    assert compacted.stats().submitted == grown.stats().submitted == 1600


CHILD = textwrap.dedent("""
    import sys, torch
    sys.path.insert(0, {tests!r})
    from test_queue_compaction import one_round
    from spotlight.runtime.queue.durable import DurableQueue
    queue = DurableQueue({log!r})
    version = queue.stats().submitted // 8
    print("ready", flush=True)
    while True:
        one_round(queue, version, keep=2)  # two of each round stay in flight
        queue.compact()
        version += 1
""")


def test_a_sigkill_at_any_point_leaves_one_complete_log_and_exactly_once(tmp_path: Path) -> None:
    log = tmp_path / "queue-log-0.jsonl"
    code = CHILD.format(tests=str(Path(__file__).parent), log=str(log))
    for kills, delay in enumerate((0.3, 0.7), start=1):
        child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                                 env={**os.environ, "OMP_NUM_THREADS": "1"})
        assert child.stdout.readline().strip() == "ready"
        time.sleep(delay)
        child.send_signal(signal.SIGKILL)
        child.wait()
        queue = DurableQueue(log)  # replays: the old log or the new one, never a mix
        for rid, entry in queue._entries.items():
            if entry.status == "done" and entry.result is not None:
                assert torch.equal(entry.result, result_of(entry.request.seed)), rid
            if entry.status == "leased" and entry.latent is not None:
                assert torch.equal(entry.latent, result_of(entry.request.seed) / 2), rid
        in_flight = [e for e in queue._entries.values() if e.status != "done"]
        rounds = queue.stats().submitted // 8
        assert len(in_flight) <= 2 * rounds + 6 * kills  # two of each round, a killed round's whole eight
        assert queue.stats().submitted % 8 == 0
