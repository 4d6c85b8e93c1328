import math

import pytest
import torch

from spotlight.explore.staleness import (
    StalenessMonitor,
    kendall_tau,
    mean_kendall_tau,
    selection_overlap,
)


def brute_force_tau_b(a: list[float], b: list[float]) -> float:
    concordant = discordant = ties_a = ties_b = pairs = 0
    for i in range(len(a)):
        for j in range(i + 1, len(a)):
            pairs += 1
            if a[i] == a[j]:
                ties_a += 1
            if b[i] == b[j]:
                ties_b += 1
            if a[i] != a[j] and b[i] != b[j]:
                if (a[i] < a[j]) == (b[i] < b[j]):
                    concordant += 1
                else:
                    discordant += 1
    return (concordant - discordant) / math.sqrt((pairs - ties_a) * (pairs - ties_b))


def test_tau_matches_a_brute_force_pair_count_with_ties() -> None:
    generator = torch.Generator().manual_seed(0)
    for _ in range(25):
        a = torch.randint(0, 4, (12,), generator=generator).double()
        b = a + torch.randint(-2, 3, (12,), generator=generator).double()
        assert kendall_tau(a, b) == pytest.approx(brute_force_tau_b(a.tolist(), b.tolist()), abs=1e-12)


def test_identical_rankings_give_one_and_reversed_give_minus_one() -> None:
    a = torch.tensor([0.3, 0.1, 0.9, 0.5])
    assert kendall_tau(a, a) == pytest.approx(1.0)
    assert kendall_tau(a, -a) == pytest.approx(-1.0)
    assert kendall_tau(a, a**3 + 7.0) == pytest.approx(1.0)  # only the order matters


def test_known_small_values() -> None:
    # pairs of [1,2,3] vs [1,3,2]: two concordant, one discordant -> (2 - 1) / 3
    assert kendall_tau(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([1.0, 3.0, 2.0])) == pytest.approx(1 / 3)
    # a has one tied pair: 2 concordant over sqrt((3 - 1) * 3)
    assert kendall_tau(torch.tensor([1.0, 1.0, 2.0]), torch.tensor([1.0, 2.0, 3.0])) == pytest.approx(
        2 / math.sqrt(6)
    )


def test_identical_tied_rankings_agree_perfectly() -> None:
    a = torch.tensor([0.0, 0.0, 1.0, 1.0, 1.0])  # pass/fail rewards
    assert kendall_tau(a, a.clone()) == pytest.approx(1.0)


def test_failed_samples_are_dropped_and_constant_scores_are_undefined() -> None:
    nan = float("nan")
    assert kendall_tau(torch.tensor([1.0, nan, 2.0, 3.0]), torch.tensor([1.0, 9.0, 2.0, 3.0])) == 1.0
    assert math.isnan(kendall_tau(torch.tensor([0.5, 0.5, 0.5]), torch.tensor([1.0, 2.0, 3.0])))
    assert math.isnan(kendall_tau(torch.tensor([1.0, nan]), torch.tensor([1.0, 2.0])))


def test_mean_tau_skips_prompts_without_a_ranking() -> None:
    stale = torch.tensor([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0], [4.0, 4.0, 4.0]])
    fresh = torch.tensor([[1.0, 2.0, 3.0], [3.0, 2.0, 1.0], [1.0, 2.0, 3.0]])
    assert mean_kendall_tau(stale, fresh) == pytest.approx(0.0)  # (1 + -1) / 2, third skipped


def test_tau_rejects_mismatched_shapes() -> None:
    with pytest.raises(ValueError, match="same length"):
        kendall_tau(torch.zeros(3), torch.zeros(4))


def test_overlap_is_the_fraction_of_shared_seeds() -> None:
    assert selection_overlap([1, 2, 3, 4], [3, 4, 5, 6]) == 0.5
    assert selection_overlap(torch.tensor([7, 8]), torch.tensor([8, 7])) == 1.0
    assert selection_overlap([1, 2], [3, 4]) == 0.0
    batched = selection_overlap(torch.tensor([[1, 2], [3, 4]]), torch.tensor([[1, 5], [3, 4]]))
    assert batched == pytest.approx(0.75)  # mean of 1/2 and 2/2


def test_overlap_rejects_mismatched_batches() -> None:
    with pytest.raises(ValueError, match="same P"):
        selection_overlap(torch.zeros(2, 3), torch.zeros(3, 3))


def permuted(order: list[int]) -> torch.Tensor:
    return torch.tensor([float(x) for x in order]).unsqueeze(0)


def test_monitor_falls_back_below_the_floor_and_recovers() -> None:
    monitor = StalenessMonitor(floor=0.5)
    identity = permuted([0, 1, 2, 3, 4])
    assert not monitor.should_fallback and monitor.warning is None  # nothing measured yet
    monitor.record(0, identity, identity)
    assert not monitor.should_fallback
    monitor.record(1, identity, permuted([4, 3, 2, 1, 0]))
    assert monitor.should_fallback
    assert "-1.000 < floor 0.500" in monitor.warning and "iteration 1" in monitor.warning
    monitor.record(2, identity, permuted([1, 0, 2, 3, 4]))  # one adjacent swap: tau = 0.8
    assert not monitor.should_fallback


def test_monitor_summary_reports_median_and_tenth_percentile() -> None:
    monitor = StalenessMonitor(floor=0.7)
    identity = permuted([0, 1, 2, 3, 4])
    # taus by hand (10 pairs): identity 1, one adjacent swap 0.8, two swaps 0.6, reversed -1
    fresh = [[0, 1, 2, 3, 4], [1, 0, 2, 3, 4], [1, 0, 3, 2, 4], [4, 3, 2, 1, 0]]
    for iteration, order in enumerate(fresh):
        monitor.record(
            iteration, identity, permuted(order), torch.tensor([[0, 1]]), torch.tensor([[0, order[0]]])
        )
    summary = monitor.summary()
    assert summary["iterations"] == 4
    assert summary["tau_median"] == pytest.approx(0.7)
    assert summary["tau_p10"] == pytest.approx(-1 + 0.3 * 1.6)  # linear interpolation at rank 0.3
    assert summary["below_floor"] == 2
    assert summary["overlap_median"] == pytest.approx(0.75)  # overlaps 0.5 ({0,0} is one seed), 1, 1, 0.5


def test_monitor_state_round_trips() -> None:
    monitor = StalenessMonitor(floor=0.2)
    monitor.record(3, permuted([0, 1, 2]), permuted([2, 1, 0]))
    restored = StalenessMonitor(floor=0.9)
    restored.load_state_dict(monitor.state_dict())
    assert restored.records == monitor.records and restored.floor == 0.2
    assert restored.should_fallback


def test_monitor_validates_floor_and_iteration_order() -> None:
    with pytest.raises(ValueError, match="floor"):
        StalenessMonitor(floor=1.5)
    monitor = StalenessMonitor(floor=0.0)
    monitor.record(2, permuted([0, 1]), permuted([0, 1]))
    with pytest.raises(ValueError, match="must increase"):
        monitor.record(2, permuted([0, 1]), permuted([0, 1]))
