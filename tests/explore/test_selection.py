import itertools
import math

import pytest
import torch

from spotlight.explore.selection import select_max_variance, select_seeds


def population_variance(values: list[float]) -> float:
    mean = sum(values) / len(values)
    return sum((v - mean) ** 2 for v in values) / len(values)


def brute_force_best_variance(rewards: list[float], group_size: int) -> float:
    return max(population_variance(list(c)) for c in itertools.combinations(rewards, group_size))


@pytest.mark.parametrize(
    "num_candidates,group_size", [(5, 1), (6, 2), (7, 3), (8, 4), (9, 5), (10, 8), (10, 10)]
)
def test_scan_matches_enumeration_on_random_rewards(num_candidates: int, group_size: int) -> None:
    generator = torch.Generator().manual_seed(num_candidates * 100 + group_size)
    for _ in range(20):
        rewards = torch.randn(num_candidates, generator=generator, dtype=torch.float64) ** 3  # skewed
        chosen = select_max_variance(rewards, group_size)
        got = population_variance(rewards[chosen].tolist())
        assert got == pytest.approx(brute_force_best_variance(rewards.tolist(), group_size), abs=1e-12)


def test_scan_matches_enumeration_with_many_ties() -> None:
    generator = torch.Generator().manual_seed(3)
    for _ in range(30):
        rewards = torch.randint(0, 3, (9,), generator=generator).to(torch.float64)  # binary-ish rewards
        chosen = select_max_variance(rewards, 4)
        got = population_variance(rewards[chosen].tolist())
        assert got == pytest.approx(brute_force_best_variance(rewards.tolist(), 4), abs=1e-12)


def test_evenly_spaced_rewards_keep_both_ends() -> None:
    rewards = torch.tensor([3.0, 0.0, 5.0, 1.0, 4.0, 2.0])
    # the two smallest (0, 1 at positions 1, 3) and two largest (4, 5 at positions 4, 2)
    assert select_max_variance(rewards, 4).tolist() == [1, 2, 3, 4]
    assert select_max_variance(rewards, 2).tolist() == [1, 2]


def test_lopsided_rewards_take_more_from_one_side() -> None:
    # One outlier at 10 and a cluster at 0..0.3: by hand, {0, 0.1, 10} has variance 22.0 and
    # {0, 0.3, 10} only 21.6, so the best triple is the i=2 split (two smallest, one largest).
    rewards = torch.tensor([0.0, 0.1, 0.2, 0.3, 10.0])
    assert select_max_variance(rewards, 3).tolist() == [0, 1, 4]


def test_no_single_swap_improves_a_large_selection() -> None:
    # N too large to enumerate: check the necessary optimality condition directly.
    generator = torch.Generator().manual_seed(11)
    rewards = torch.rand(200, generator=generator, dtype=torch.float64) ** 2
    chosen = set(select_max_variance(rewards, 16).tolist())
    best = population_variance(rewards[sorted(chosen)].tolist())
    values = rewards.tolist()
    for out in chosen:
        rest = [values[i] for i in chosen if i != out]
        for inside in range(0, 200, 7):
            if inside not in chosen:
                assert population_variance(rest + [values[inside]]) <= best + 1e-12


def test_far_from_zero_rewards_do_not_cancel() -> None:
    rewards = torch.tensor([0.9, 0.9 + 1e-6, 0.9 + 2e-6, 0.9 + 3e-6], dtype=torch.float64)
    assert select_max_variance(rewards, 2).tolist() == [0, 3]


def test_selection_is_group_size_distinct_sorted_indices() -> None:
    rewards = torch.randn(32, generator=torch.Generator().manual_seed(0))
    chosen = select_max_variance(rewards, 8).tolist()
    assert len(chosen) == 8 and len(set(chosen)) == 8 and chosen == sorted(chosen)


def test_group_larger_than_candidates_is_rejected() -> None:
    with pytest.raises(ValueError, match="group_size must be <= the number of candidates"):
        select_max_variance(torch.zeros(4), 8)


def test_non_finite_rewards_are_rejected_by_the_single_prompt_scan() -> None:
    with pytest.raises(ValueError, match="finite"):
        select_max_variance(torch.tensor([0.0, float("nan"), 1.0]), 2)


def test_select_seeds_returns_seed_values_of_the_max_variance_subset() -> None:
    rewards = torch.tensor([[0.5, 0.0, 1.0, 0.4], [0.2, 0.3, 0.1, 0.9]])
    seeds = [[101, 102, 103, 104], [201, 202, 203, 204]]
    result = select_seeds(rewards, seeds, 2, torch.Generator().manual_seed(0))
    assert result.seeds.tolist() == [[102, 103], [203, 204]]
    assert result.indices.tolist() == [[1, 2], [2, 3]]
    assert result.variance.tolist() == pytest.approx([0.25, 0.16])
    assert result.degenerate.tolist() == [False, False]


def test_nan_rewards_are_never_selected_when_enough_are_finite() -> None:
    nan = float("nan")
    rewards = torch.tensor([[nan, 0.1, 0.2, nan, 0.3, 0.4, nan, 0.5]])
    result = select_seeds(rewards, torch.arange(8).unsqueeze(0), 4, torch.Generator().manual_seed(0))
    assert result.indices.tolist() == [[1, 2, 5, 7]]
    assert result.variance.item() == pytest.approx(brute_force_best_variance([0.1, 0.2, 0.3, 0.4, 0.5], 4))
    assert not result.degenerate.item()


def test_too_few_finite_rewards_keep_all_finite_and_fill_randomly() -> None:
    nan = float("nan")
    rewards = torch.tensor([[nan, 0.2, nan, nan, 0.8, nan]])
    result = select_seeds(rewards, torch.arange(6).unsqueeze(0), 4, torch.Generator().manual_seed(0))
    kept = result.indices[0].tolist()
    assert len(set(kept)) == 4 and {1, 4} <= set(kept)
    assert result.variance.item() == pytest.approx(0.09)  # over the finite kept rewards only
    assert result.degenerate.item()


def test_equal_rewards_pick_random_seeds_deterministically() -> None:
    rewards = torch.full((3, 16), 0.7)
    seeds = torch.arange(48).reshape(3, 16)
    first = select_seeds(rewards, seeds, 4, torch.Generator().manual_seed(5))
    again = select_seeds(rewards, seeds, 4, torch.Generator().manual_seed(5))
    assert torch.equal(first.seeds, again.seeds)
    assert first.degenerate.all()
    assert first.variance.tolist() == [0.0, 0.0, 0.0]
    picks = {
        tuple(select_seeds(rewards, seeds, 4, torch.Generator().manual_seed(s)).indices[0].tolist())
        for s in range(10)
    }
    assert len(picks) > 1  # the choice really is random, not "the first G"


def test_equal_rewards_among_finite_ones_stay_away_from_nan() -> None:
    nan = float("nan")
    rewards = torch.tensor([[nan, 1.0, 1.0, nan, 1.0, 1.0, 1.0]])
    for s in range(5):
        result = select_seeds(rewards, torch.arange(7).unsqueeze(0), 3, torch.Generator().manual_seed(s))
        assert set(result.indices[0].tolist()) <= {1, 2, 4, 5, 6}
        assert result.degenerate.item()


def test_select_seeds_validates_shapes() -> None:
    generator = torch.Generator().manual_seed(0)
    with pytest.raises(ValueError, match="seeds must have the shape of rewards"):
        select_seeds(torch.zeros(2, 4), torch.zeros(2, 5, dtype=torch.int64), 2, generator)
    with pytest.raises(ValueError, match="group_size must be <= the number of candidates"):
        select_seeds(torch.zeros(2, 4), torch.zeros(2, 4, dtype=torch.int64), 5, generator)
    with pytest.raises(ValueError, match="2-D"):
        select_seeds(torch.zeros(4), torch.zeros(4, dtype=torch.int64), 2, generator)


def test_selected_variance_is_never_below_a_random_subset() -> None:
    generator = torch.Generator().manual_seed(9)
    rewards = torch.rand(8, 24, generator=generator)
    result = select_seeds(rewards, torch.arange(8 * 24).reshape(8, 24), 6, generator)
    for prompt in range(8):
        random_pick = torch.randperm(24, generator=generator)[:6]
        assert result.variance[prompt] >= rewards[prompt, random_pick].double().var(unbiased=False) - 1e-12
        assert math.isclose(
            result.variance[prompt].item(),
            population_variance(rewards[prompt, result.indices[prompt]].double().tolist()),
            abs_tol=1e-12,
        )
