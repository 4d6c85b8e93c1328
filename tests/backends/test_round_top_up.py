"""A round drained before training ends gets more candidates, from its own seed stream (issue 43).

The spot device's idle time during training was a fifth of its held time in the default run: the planner
sizes a round below the training time and the device then waited. `RoundTopUp` adds a block of candidates
per prompt once the round drained while training runs, and keeps the queue ahead of the devices from then on
(a device never drains between blocks); none after training ends; and a block the round could not finish is
dropped whole, so every prompt keeps as many candidates as the others.
"""

from __future__ import annotations

import torch

from spotlight.backends.ray_top_up import RoundTopUp, candidate_id, keep_complete_top_ups
from spotlight.diffusion.sampler import SamplingPlan
from spotlight.explore.planner import ExplorePlan
from spotlight.loop.streams import Stream, candidate_seeds, iteration_generator
from spotlight.runtime.queue.request_queue import Request, RequestQueue
from spotlight.runtime.queue.rounds import Round

PROMPTS = ["a red circle", "two blue squares", "a green triangle"]
TARGET, SEED, PLANNED = 5, 7, 2


def planned_round() -> tuple[Round, torch.Generator]:
    stream = iteration_generator(SEED, TARGET, Stream.SEEDS)
    candidates = torch.randint(0, 2**62, (len(PROMPTS), PLANNED), generator=stream)
    ids = [candidate_id(TARGET, p, c) for p in range(len(PROMPTS)) for c in range(PLANNED)]
    return Round(TARGET, 4, ExplorePlan(PLANNED, 3, "sde"), PROMPTS, candidates, ids), stream


def test_a_drained_round_is_topped_up_until_training_ends() -> None:
    round_, stream = planned_round()
    assert torch.equal(round_.candidates, candidate_seeds(SEED, TARGET, len(PROMPTS), PLANNED))  # the planned draw
    submitted: list[list[Request]] = []
    top_up = RoundTopUp.sized(submitted.append, lambda: 0, round_, stream, SamplingPlan(num_steps=3), forward_batch=4,
                              limit=7, held=0)  # nothing held: one block outstanding at a time
    assert top_up.per_block == 2  # one forward batch over 3 prompts: 2 each
    top_up.feed()
    assert not submitted  # the round is still running
    round_.drained = True
    top_up.feed()
    assert len(submitted) == 1 and not round_.drained
    assert round_.candidates.shape == (3, 4) and top_up.extra_candidates == 2
    expected = iteration_generator(SEED, TARGET, Stream.SEEDS)
    torch.randint(0, 2**62, (3, PLANNED), generator=expected)
    assert torch.equal(round_.candidates[:, PLANNED:], torch.randint(0, 2**62, (3, 2), generator=expected))
    assert [r.request_id for r in submitted[0]] == [candidate_id(TARGET, p, c) for p in range(3) for c in (2, 3)]
    assert all(r.weights_version == 4 and r.seed == int(round_.candidates[int(r.request_id.split("-")[1]),
                                                                          int(r.request_id.split("-")[2])])
               for r in submitted[0])
    assert round_.ids == [candidate_id(TARGET, p, c) for p in range(3) for c in range(4)]  # prompt-major
    round_.drained = True
    top_up.feed()
    assert len(submitted) == 2 and round_.candidates.shape == (3, 6)
    round_.drained = True
    top_up.feed()  # 6 of at most 7 candidates: another block of 2 would pass the limit
    assert len(submitted) == 2 and round_.drained
    top_up.limit = 8
    round_.drained, top_up.open = True, False  # training ended
    top_up.feed()
    assert len(submitted) == 2


def test_a_block_cut_short_is_dropped_whole() -> None:
    round_, stream = planned_round()
    top_up = RoundTopUp.sized(lambda requests: None, lambda: 0, round_, stream, SamplingPlan(num_steps=3),
                              forward_batch=3, limit=128, held=0)
    for _ in range(2):  # two blocks of one candidate per prompt
        round_.drained = True
        top_up.feed()
    done = {rid: torch.zeros(1) for rid in round_.ids if not rid.endswith("-3")}
    del done[candidate_id(TARGET, 1, 3 - 1)]  # the first block missed one prompt too: both blocks go
    kept = round_.candidates.clone()
    keep_complete_top_ups(round_, done)
    assert torch.equal(round_.candidates, kept[:, :PLANNED])
    assert round_.ids == [candidate_id(TARGET, p, c) for p in range(3) for c in range(PLANNED)]


def test_the_queue_stays_ahead_of_the_devices_until_the_limit() -> None:
    """A device that leases what it can hold and finishes a block per pass never finds the queue empty (which
    ended its call: a gap of a controller tick and a call) before the round reaches its limit; the seeds are
    the stream's, block after block, and the device leases the blocks in order."""
    round_, stream = planned_round()
    queue, now, version, capacity, limit = RequestQueue(), [0.0], 4, 8, 12
    top_up = RoundTopUp.sized(queue.submit, lambda: queue.remaining(version), round_, stream,
                              SamplingPlan(num_steps=3), forward_batch=3, limit=limit, held=capacity)
    top_up.clock = lambda: now[0]
    assert top_up.per_block == 1 and top_up.ahead == 2 * capacity  # what it holds, and as much waiting
    top_up.feed()
    assert top_up.blocks == 0  # the planned candidates first
    round_.drained = True  # they are done: the device's call ended
    leased: list[str] = []
    in_flight: list[str] = []
    gaps = 0
    while True:
        top_up.feed()  # the controller, every tick
        in_flight += [lease.request.request_id for lease in queue.pull("d", capacity - len(in_flight), version)]
        if not in_flight:
            if round_.candidates.shape[1] >= limit:
                break  # the limit: every block is done
            gaps += 1  # the device drained: its call ends, the round is drained again
            round_.drained = True
            continue
        done, in_flight = in_flight[:3], in_flight[3:]  # one block's worth per pass, oldest first
        leased += done
        for rid in done:
            assert queue.complete("d", rid, torch.zeros(1), version)
        now[0] += 0.06  # a pass: the controller counts the queue every 0.1 s
    assert gaps == 0
    assert round_.candidates.shape == (3, limit) and top_up.extra_candidates == limit - PLANNED
    expected = iteration_generator(SEED, TARGET, Stream.SEEDS)
    torch.randint(0, 2**62, (3, PLANNED), generator=expected)
    blocks = [torch.randint(0, 2**62, (3, 1), generator=expected) for _ in range(limit - PLANNED)]
    assert torch.equal(round_.candidates[:, PLANNED:], torch.cat(blocks, dim=1))  # one (P, 1) draw per block
    assert leased == [candidate_id(TARGET, p, c) for c in range(PLANNED, limit) for p in range(3)]  # block order
    assert round_.ids == [candidate_id(TARGET, p, c) for p in range(3) for c in range(limit)]


def test_no_block_goes_out_after_training_ends() -> None:
    round_, stream = planned_round()
    submitted: list[list[Request]] = []
    top_up = RoundTopUp.sized(submitted.append, lambda: 0, round_, stream, SamplingPlan(num_steps=3),
                              forward_batch=3, limit=128, held=8)
    round_.drained = True
    top_up.feed()
    assert len(submitted) == 1 and len(submitted[0]) == 6 * 3  # whole blocks of 3: the 8 held and 8 waiting
    top_up.open = False  # training ended: the queue is empty now, and stays so
    top_up.next_poll = 0.0
    top_up.feed()
    assert len(submitted) == 1
