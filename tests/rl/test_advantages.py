import math

import pytest
import torch

from spotlight.rl.advantages import group_advantages

EPS = 1e-4


def test_group_std_advantages_by_hand() -> None:
    rewards = torch.tensor([[1.0, 2.0, 3.0, 4.0], [0.0, 0.0, 1.0, 1.0]], dtype=torch.float64)
    # group 0: mean 2.5, population std sqrt(1.25); group 1: mean 0.5, std 0.5
    std0 = math.sqrt(1.25)
    expected = torch.tensor(
        [[-1.5 / (std0 + EPS), -0.5 / (std0 + EPS), 0.5 / (std0 + EPS), 1.5 / (std0 + EPS)],
         [-0.5 / (0.5 + EPS), -0.5 / (0.5 + EPS), 0.5 / (0.5 + EPS), 0.5 / (0.5 + EPS)]],
        dtype=torch.float64,
    )
    assert torch.allclose(group_advantages(rewards, eps=EPS), expected, atol=1e-12)


def test_global_std_advantages_by_hand() -> None:
    rewards = torch.tensor([[1.0, 2.0, 3.0, 4.0], [0.0, 0.0, 1.0, 1.0]], dtype=torch.float64)
    # centred by group mean; one std over all 8: sqrt((5 + 1) / 8)
    std = math.sqrt(0.75)
    centred = torch.tensor([[-1.5, -0.5, 0.5, 1.5], [-0.5, -0.5, 0.5, 0.5]], dtype=torch.float64)
    got = group_advantages(rewards, std_mode="global", eps=EPS)
    assert torch.allclose(got, centred / (std + EPS), atol=1e-12)


def test_each_group_has_zero_mean_and_unit_std() -> None:
    rewards = torch.rand(5, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    advantages = group_advantages(rewards, eps=0.0, clip=100.0)
    assert torch.allclose(advantages.mean(1), torch.zeros(5, dtype=torch.float64), atol=1e-12)
    assert torch.allclose(advantages.std(1, unbiased=False), torch.ones(5, dtype=torch.float64), atol=1e-12)


def test_invalid_samples_get_zero_and_stay_out_of_the_statistics() -> None:
    nan, inf = float("nan"), float("inf")
    rewards = torch.tensor([[1.0, nan, 3.0, 100.0], [2.0, 4.0, inf, 6.0]], dtype=torch.float64)
    valid = torch.tensor([[True, True, True, False], [True, True, True, True]])
    got = group_advantages(rewards, valid=valid, eps=EPS)
    # group 0: valid {1, 3}: mean 2, std 1; group 1: valid {2, 4, 6}: mean 4, std sqrt(8/3)
    std1 = math.sqrt(8.0 / 3.0)
    expected = torch.tensor(
        [[-1.0 / (1.0 + EPS), 0.0, 1.0 / (1.0 + EPS), 0.0],
         [-2.0 / (std1 + EPS), 0.0, 0.0, 2.0 / (std1 + EPS)]],
        dtype=torch.float64,
    )
    assert torch.allclose(got, expected, atol=1e-12)
    assert torch.isfinite(got).all()


def test_invalid_samples_stay_out_of_the_global_std() -> None:
    rewards = torch.tensor([[1.0, 3.0, float("nan")], [5.0, 5.0, 1e6]], dtype=torch.float64)
    valid = torch.tensor([[True, True, True], [True, True, False]])
    got = group_advantages(rewards, valid=valid, std_mode="global", eps=EPS)
    # valid centred values: -1, 1, 0, 0 -> global std sqrt(2 / 4)
    std = math.sqrt(0.5)
    expected = torch.tensor([[-1.0 / (std + EPS), 1.0 / (std + EPS), 0.0], [0.0, 0.0, 0.0]],
                            dtype=torch.float64)
    assert torch.allclose(got, expected, atol=1e-12)


def test_uniform_or_single_valid_groups_get_zero_advantage() -> None:
    rewards = torch.tensor([[0.7, 0.7, 0.7], [1.0, float("nan"), float("nan")]])
    assert torch.equal(group_advantages(rewards), torch.zeros(2, 3))


def test_advantages_are_clipped() -> None:
    rewards = torch.tensor([[0.0] * 9 + [1.0]], dtype=torch.float64)
    # mean 0.1, std 0.3: the outlier's advantage is 0.9 / 0.3 = 3, the others -1/3
    unclipped = group_advantages(rewards, eps=0.0, clip=10.0)
    assert unclipped[0, -1].item() == pytest.approx(3.0, rel=1e-12)
    assert unclipped[0, 0].item() == pytest.approx(-1.0 / 3.0, rel=1e-12)
    clipped = group_advantages(rewards, eps=0.0, clip=2.0)
    assert clipped[0, -1].item() == 2.0
    assert clipped[0, 0].item() == pytest.approx(-1.0 / 3.0, rel=1e-12)
    assert group_advantages(-rewards, eps=0.0, clip=2.0)[0, -1].item() == -2.0


def test_bad_inputs_raise() -> None:
    with pytest.raises(ValueError, match="num_prompts, group_size"):
        group_advantages(torch.zeros(6))
    with pytest.raises(ValueError, match="adv_std"):
        group_advantages(torch.zeros(2, 3), std_mode="batch")  # type: ignore[arg-type]
