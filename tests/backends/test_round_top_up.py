"""A round drained before training ends gets more candidates, from its own seed stream (issue 43).

The spot device's idle time during training was a fifth of its held time in the default run: the planner
sizes a round below the training time and the device then waited. `RoundTopUp` adds a block of candidates
per prompt each time the round drains while training runs; none after training ends; and a block the
round could not finish is dropped whole, so every prompt keeps as many candidates as the others.
"""

from __future__ import annotations

import torch

from spotlight.backends.ray_top_up import RoundTopUp, candidate_id, keep_complete_top_ups
from spotlight.diffusion.sampler import SamplingPlan
from spotlight.explore.planner import ExplorePlan
from spotlight.loop.streams import Stream, candidate_seeds, iteration_generator
from spotlight.runtime.queue.request_queue import Request
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
    top_up = RoundTopUp.sized(submitted.append, round_, stream, SamplingPlan(num_steps=3), forward_batch=4, limit=7)
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
    top_up = RoundTopUp.sized(lambda requests: None, round_, stream, SamplingPlan(num_steps=3), forward_batch=3,
                              limit=128)
    for _ in range(2):  # two blocks of one candidate per prompt
        round_.drained = True
        top_up.feed()
    done = {rid: torch.zeros(1) for rid in round_.ids if not rid.endswith("-3")}
    del done[candidate_id(TARGET, 1, 3 - 1)]  # the first block missed one prompt too: both blocks go
    kept = round_.candidates.clone()
    keep_complete_top_ups(round_, done)
    assert torch.equal(round_.candidates, kept[:, :PLANNED])
    assert round_.ids == [candidate_id(TARGET, p, c) for p in range(3) for c in range(PLANNED)]
