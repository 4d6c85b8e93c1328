import math

import pytest
import torch

from spotlight.rl.loss import clipped_policy_loss, gaussian_step_kl


def test_on_policy_ratio_is_exactly_one_and_loss_is_minus_mean_advantage() -> None:
    log_probs = torch.tensor([-1.3, 0.2, 4.0, -7.5], dtype=torch.float64, requires_grad=True)
    advantages = torch.tensor([1.0, -2.0, 0.5, 3.0], dtype=torch.float64)
    result = clipped_policy_loss(log_probs, log_probs.detach().clone(), advantages, clip_range=0.2)
    assert result.ratio_mean.item() == 1.0
    assert result.clip_fraction.item() == 0.0
    assert result.loss.item() == pytest.approx(-advantages.mean().item(), rel=1e-15)
    result.loss.backward()
    assert torch.allclose(log_probs.grad, -advantages / 4, atol=1e-15)  # the plain policy gradient


def test_clipping_by_hand() -> None:
    # ratio 1.5 and 0.5 with A = +1 and -1, plus one in-range ratio 1.1 with A = 2; clip range 0.2.
    ratios = torch.tensor([1.5, 1.5, 0.5, 0.5, 1.1], dtype=torch.float64)
    advantages = torch.tensor([1.0, -1.0, 1.0, -1.0, 2.0], dtype=torch.float64)
    old = torch.tensor([0.3, -0.2, 1.0, 0.0, -4.0], dtype=torch.float64)
    log_probs = (old + ratios.log()).requires_grad_(True)
    result = clipped_policy_loss(log_probs, old, advantages, clip_range=0.2)
    # terms max(-A r, -A clip(r)): -1.2 (clipped), 1.5, -0.5, 0.8 (clipped), -2.2
    assert result.loss.item() == pytest.approx((-1.2 + 1.5 - 0.5 + 0.8 - 2.2) / 5, rel=1e-12)
    assert result.clip_fraction.item() == pytest.approx(4 / 5)
    assert result.ratio_mean.item() == pytest.approx(5.1 / 5, rel=1e-12)
    result.loss.backward()
    # d(-A r)/d log p = -A r where the unclipped term wins; zero where the clipped one does
    expected_grad = torch.tensor([0.0, 1.5, -0.5, 0.0, -2.2], dtype=torch.float64) / 5
    assert torch.allclose(log_probs.grad, expected_grad, atol=1e-12)


def test_clip_fraction_counts_ratios_outside_the_range() -> None:
    old = torch.zeros(4)
    log_probs = torch.tensor([math.log(1.1), math.log(0.85), math.log(1.3), math.log(0.7)])
    result = clipped_policy_loss(log_probs, old, torch.ones(4), clip_range=0.2)
    assert result.clip_fraction.item() == 0.5


def test_diagnostics_are_detached() -> None:
    log_probs = torch.zeros(3, requires_grad=True)
    result = clipped_policy_loss(log_probs, torch.zeros(3), torch.ones(3), 0.2)
    assert result.loss.requires_grad
    assert not result.clip_fraction.requires_grad
    assert not result.ratio_mean.requires_grad


def test_gaussian_step_kl_matches_torch_normal_kl() -> None:
    generator = torch.Generator().manual_seed(0)
    mean = torch.randn(3, 2, 4, 4, generator=generator, dtype=torch.float64)
    reference = mean + 0.3 * torch.randn(3, 2, 4, 4, generator=generator, dtype=torch.float64)
    std = torch.tensor([0.1, 0.5, 2.0], dtype=torch.float64)
    broadcast_std = std.view(3, 1, 1, 1).expand_as(mean)
    expected = torch.distributions.kl_divergence(
        torch.distributions.Normal(mean, broadcast_std), torch.distributions.Normal(reference, broadcast_std)
    ).mean(dim=(1, 2, 3))
    got = gaussian_step_kl(mean, reference, std)
    assert got.shape == (3,)
    assert torch.allclose(got, expected, rtol=1e-12)


def test_gaussian_step_kl_is_zero_for_equal_means_and_carries_gradient() -> None:
    mean = torch.randn(2, 5, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    assert torch.equal(gaussian_step_kl(mean, mean.clone(), torch.ones(2, dtype=torch.float64)),
                       torch.zeros(2, dtype=torch.float64))
    moving = mean.clone().requires_grad_(True)
    reference = torch.zeros_like(mean)
    std = torch.tensor([0.5, 2.0], dtype=torch.float64)
    gaussian_step_kl(moving, reference, std).sum().backward()
    # d/dm mean_d (m - r)^2 / (2 s^2) = (m - r) / (D s^2)
    assert torch.allclose(moving.grad, mean / (5 * std.view(2, 1) ** 2), atol=1e-14)
