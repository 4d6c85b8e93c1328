"""Exploration rounds: how a round's device time is shared out, and results put back in request order."""

from __future__ import annotations

import torch

from spotlight.explore.planner import ExplorePlan
from spotlight.runtime.queue.rounds import Round, results_in_order


def test_a_round_alone_owns_all_its_device_time() -> None:
    round_ = Round(2, 1, ExplorePlan(4, 6, "sde"), ["a"], torch.zeros(1, 4), ids=["x0", "x1", "x2", "x3"])
    assert round_.own_share() == 1.0 and round_.all_ids == ["x0", "x1", "x2", "x3"]


def test_requests_riding_along_take_their_share_of_device_steps() -> None:
    # own: 4 requests x 6 steps = 24 step-requests; riding along: 2 x 3 = 6; own share 24 / 30
    round_ = Round(2, 1, ExplorePlan(4, 6, "sde"), ["a"], torch.zeros(1, 4), ids=["x0", "x1", "x2", "x3"],
                   extra_ids=["m0", "m1"], extra_steps=3)
    assert round_.own_share() == 24 / 30
    assert round_.all_ids == ["x0", "x1", "x2", "x3", "m0", "m1"]


def test_results_come_back_in_request_order_with_zeros_for_the_missing() -> None:
    results = {"b": torch.full((1, 2, 2), 2.0), "a": torch.full((1, 2, 2), 1.0)}
    stacked = results_in_order(results, ["a", "gone", "b"], (1, 2, 2))
    assert stacked.shape == (3, 1, 2, 2)
    assert stacked[:, 0, 0, 0].tolist() == [1.0, 0.0, 2.0]
