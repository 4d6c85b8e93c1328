import itertools
import math

import pytest
import torch

from spotlight.diffusion.schedule import sigma_schedule
from spotlight.diffusion.steps import ode_step, sde_std, sde_step


def random(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def flow_grpo_std(sigma: float, sigma_next: float, noise_level: float, sigma_cap: float) -> float:
    # Flow-GRPO: std_dev_t = sqrt(sigma / (1 - where(sigma == 1, sigma_max, sigma))) * a,
    # std = std_dev_t * sqrt(-dt)
    denominator = sigma_cap if sigma == 1.0 else sigma
    return math.sqrt(sigma / (1.0 - denominator)) * noise_level * math.sqrt(sigma - sigma_next)


def flow_grpo_mean(x, velocity, sigma, sigma_next, noise_level, sigma_cap):
    # Euler step of the SDE dx = [v + g^2 / (2 sigma) (x + (1 - sigma) v)] dsigma + g dw, with
    # g^2 = std_dev_t^2 and ∇log p = -(x + (1 - sigma) v) / sigma for the linear interpolant.
    denominator = sigma_cap if sigma == 1.0 else sigma
    g2 = sigma / (1.0 - denominator) * noise_level**2
    drift = velocity + g2 / (2.0 * sigma) * (x + (1.0 - sigma) * velocity)
    return x + drift * (sigma_next - sigma)


def test_ode_step_is_the_euler_step() -> None:
    x = torch.tensor([[1.0, -2.0]])
    velocity = torch.tensor([[4.0, 8.0]])
    # x + v * (0.25 - 0.75) = x - v / 2
    assert torch.equal(ode_step(x, velocity, 0.75, 0.25), torch.tensor([[-1.0, -6.0]]))


@pytest.mark.parametrize("num_steps,shift", [(1, 1.0), (3, 1.0), (10, 3.0), (37, 0.7)])
def test_ode_with_exact_velocity_reaches_the_data(num_steps: int, shift: float) -> None:
    x0, noise = random(2, 3, 4, 4, seed=1), random(2, 3, 4, 4, seed=2)
    sigmas = sigma_schedule(num_steps, shift).tolist()
    x = noise  # x at sigma = 1
    for sigma, sigma_next in itertools.pairwise(sigmas):
        x = ode_step(x, noise - x0, sigma, sigma_next)  # the straight path's velocity is constant
        assert torch.allclose(x, (1 - sigma_next) * x0 + sigma_next * noise, atol=1e-12)
    assert torch.allclose(x, x0, atol=1e-12)


def test_sde_step_without_noise_is_the_ode_step() -> None:
    x, velocity, noise = random(3, 2, 5, seed=3), random(3, 2, 5, seed=4), random(3, 2, 5, seed=5)
    result = sde_step(x, velocity, 0.6, 0.4, noise_level=0.0, noise=noise)
    expected = ode_step(x, velocity, 0.6, 0.4)
    assert torch.equal(result.mean, expected)
    assert torch.equal(result.x_next, expected)
    assert torch.equal(result.std, torch.zeros(3, dtype=torch.float64))
    assert torch.equal(result.log_prob, torch.zeros(3, dtype=torch.float64))


@pytest.mark.parametrize(
    "sigma,sigma_next,noise_level,sigma_cap,expected",
    [
        (0.5, 0.25, 0.7, 0.9, 0.35),  # sqrt(0.5 / 0.5) * 0.7 * sqrt(0.25)
        (0.8, 0.6, 1.0, 0.9, math.sqrt(4.0) * math.sqrt(0.2)),  # sqrt(0.8 / 0.2)
        (1.0, 0.75, 0.7, 0.75, 0.7),  # capped: sqrt(1 / (1 - 0.75)) * 0.7 * sqrt(0.25)
        (1.0, 0.75, 0.7, 0.9, math.sqrt(10.0) * 0.7 * 0.5),  # the cap, not sigma_next, is used
    ],
)
def test_sde_std_matches_flow_grpo_by_hand(sigma, sigma_next, noise_level, sigma_cap, expected) -> None:
    assert sde_std(sigma, sigma_next, noise_level, sigma_cap) == pytest.approx(expected, rel=1e-14)
    assert flow_grpo_std(sigma, sigma_next, noise_level, sigma_cap) == pytest.approx(expected, rel=1e-14)
    x = random(2, 3, seed=6)
    result = sde_step(x, x, sigma, sigma_next, noise_level, noise=x, sigma_cap=sigma_cap)
    assert result.std.tolist() == pytest.approx([expected, expected], rel=1e-14)


def test_sde_step_at_pure_noise_caps_with_sigma_next_by_default() -> None:
    x = random(2, 3, seed=7)
    result = sde_step(x, x, 1.0, 0.75, 0.7, noise=x)
    assert result.std.tolist() == pytest.approx([0.7, 0.7], rel=1e-14)
    assert torch.isfinite(result.mean).all()


@pytest.mark.parametrize("sigma,sigma_next,sigma_cap", [(1.0, 0.8, 0.8), (0.7, 0.55, 0.8), (0.2, 0.0, 0.8)])
def test_sde_mean_matches_flow_grpo_drift(sigma: float, sigma_next: float, sigma_cap: float) -> None:
    x, velocity, noise = random(4, 3, 2, seed=8), random(4, 3, 2, seed=9), random(4, 3, 2, seed=10)
    result = sde_step(x, velocity, sigma, sigma_next, 0.7, noise=noise, sigma_cap=sigma_cap)
    expected_mean = flow_grpo_mean(x, velocity, sigma, sigma_next, 0.7, sigma_cap)
    assert torch.allclose(result.mean, expected_mean, atol=1e-13)
    std = flow_grpo_std(sigma, sigma_next, 0.7, sigma_cap)
    assert torch.allclose(result.x_next, expected_mean + std * noise, atol=1e-13)


def test_log_prob_is_the_normal_density_averaged_over_pixels() -> None:
    x, velocity, noise = random(3, 2, 4, 4, seed=11), random(3, 2, 4, 4, seed=12), random(3, 2, 4, 4, seed=13)
    result = sde_step(x, velocity, 0.6, 0.45, 0.7, noise=noise, sigma_cap=0.9)
    mean = flow_grpo_mean(x, velocity, 0.6, 0.45, 0.7, 0.9)
    std = flow_grpo_std(0.6, 0.45, 0.7, 0.9)
    density = torch.distributions.Normal(mean, std).log_prob(result.x_next)
    assert torch.allclose(result.log_prob, density.mean(dim=(1, 2, 3)), atol=1e-12)
    # and scoring an arbitrary x_next (not one this step drew) uses the same density
    other = random(3, 2, 4, 4, seed=14)
    scored = sde_step(x, velocity, 0.6, 0.45, 0.7, x_next=other, sigma_cap=0.9)
    expected = torch.distributions.Normal(mean, std).log_prob(other).mean(dim=(1, 2, 3))
    assert torch.allclose(scored.log_prob, expected, atol=1e-12)


def test_scoring_a_step_gives_the_log_prob_it_was_sampled_with() -> None:
    x, velocity, noise = random(5, 8, seed=15), random(5, 8, seed=16), random(5, 8, seed=17)
    sampled = sde_step(x, velocity, 1.0, 0.9, 0.7, noise=noise, sigma_cap=0.9)
    scored = sde_step(x, velocity, 1.0, 0.9, 0.7, x_next=sampled.x_next, sigma_cap=0.9)
    assert torch.allclose(scored.log_prob, sampled.log_prob, rtol=0, atol=1e-12)
    assert torch.equal(scored.mean, sampled.mean)
    assert torch.equal(scored.x_next, sampled.x_next)


def test_gradients_reach_the_velocity_through_mean_and_log_prob() -> None:
    x, x_next = random(2, 3, seed=18), random(2, 3, seed=19)

    def log_prob(velocity: torch.Tensor) -> torch.Tensor:
        return sde_step(x, velocity, 0.7, 0.5, 0.7, x_next=x_next, sigma_cap=0.9).log_prob

    def mean(velocity: torch.Tensor) -> torch.Tensor:
        return sde_step(x, velocity, 0.7, 0.5, 0.7, x_next=x_next, sigma_cap=0.9).mean

    velocity = random(2, 3, seed=20).requires_grad_(True)
    assert torch.autograd.gradcheck(log_prob, (velocity,))
    assert torch.autograd.gradcheck(mean, (velocity,))
    log_prob(velocity).sum().backward()
    assert velocity.grad is not None and velocity.grad.abs().sum() > 0


def test_sampled_x_next_is_a_constant_of_the_graph() -> None:
    x, noise = random(2, 3, seed=21), random(2, 3, seed=22)
    velocity = random(2, 3, seed=23).requires_grad_(True)
    result = sde_step(x, velocity, 0.7, 0.5, 0.7, noise=noise, sigma_cap=0.9)
    assert not result.x_next.requires_grad
    # with x_next fixed, d log p / d v = (x_next - mean) / std^2 * d mean / d v / D
    result.log_prob.sum().backward()
    g2 = 0.7 / 0.3 * 0.49
    dmean_dv = (1.0 + g2 * 0.3 / (2 * 0.7)) * (0.5 - 0.7)
    std = flow_grpo_std(0.7, 0.5, 0.7, 0.9)
    assert torch.allclose(velocity.grad, noise / std * dmean_dv / 3, atol=1e-12)


def gaussian_marginal_variance(sigma: float, data_var: float) -> float:
    return (1 - sigma) ** 2 * data_var + sigma**2


def propagated_variance_error(num_steps: int, data_var: float = 0.25, noise_level: float = 0.7) -> float:
    """Worst relative gap between Var(x_sigma) and the SDE's variance, for 1-D data x0 ~ N(0, data_var).

    The exact velocity E[noise - x0 | x] is then linear, c(sigma) x, and so is the step's mean,
    A x; the variance after a step is A^2 Var + std^2, propagated in closed form (no sampling).
    Starts below sigma = 1, where the capped first step is not marginal-preserving by design.
    """
    sigmas = torch.linspace(0.9, 0.0, num_steps + 1, dtype=torch.float64).tolist()
    variance, worst = gaussian_marginal_variance(sigmas[0], data_var), 0.0
    for sigma, sigma_next in itertools.pairwise(sigmas):
        c = (sigma - (1 - sigma) * data_var) / gaussian_marginal_variance(sigma, data_var)
        one = torch.ones(1, 1, dtype=torch.float64)
        step = sde_step(one, c * one, sigma, sigma_next, noise_level, noise=torch.zeros_like(one))
        variance = step.mean.item() ** 2 * variance + step.std.item() ** 2
        target = gaussian_marginal_variance(sigma_next, data_var)
        worst = max(worst, abs(variance - target) / target)
    return worst


def test_sde_preserves_the_gaussian_marginal_up_to_discretisation() -> None:
    coarse, fine = propagated_variance_error(100), propagated_variance_error(400)
    assert fine < 5e-3
    assert fine / coarse == pytest.approx(0.25, abs=0.05)  # first-order convergence


def test_sde_step_needs_exactly_one_of_noise_or_x_next() -> None:
    x = random(1, 2, seed=24)
    with pytest.raises(ValueError, match="exactly one"):
        sde_step(x, x, 0.5, 0.25, 0.7)
    with pytest.raises(ValueError, match="exactly one"):
        sde_step(x, x, 0.5, 0.25, 0.7, noise=x, x_next=x)


@pytest.mark.parametrize("sigma,sigma_next", [(0.5, 0.5), (0.25, 0.5)])
def test_sde_step_only_goes_towards_the_data(sigma: float, sigma_next: float) -> None:
    x = random(1, 2, seed=25)
    with pytest.raises(ValueError, match="sigma"):
        sde_step(x, x, sigma, sigma_next, 0.7, noise=x)
