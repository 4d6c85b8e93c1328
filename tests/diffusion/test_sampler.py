import math

import pytest
import random_models
import torch

from spotlight.diffusion.noise import initial_latents, seeded_normal
from spotlight.diffusion.sampler import SamplingPlan, sample
from spotlight.models.tinydit import TinyDiT, TinyDiTConfig

SHAPE = (2, 4, 4)
SEEDS = [3, 14, 15]


def nonlinear_velocity(x: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
    return torch.tanh(x) * (1.0 + sigma.view(-1, 1, 1, 1)) - 0.3 * x.roll(1, dims=-1)


def randomised_tinydit(seed: int) -> TinyDiT:
    """A tiny TinyDiT with every weight random (adaLN-Zero would make it output zeros)."""
    config = TinyDiTConfig(image_size=8, in_channels=2, patch_size=4, dim=32, depth=1, num_heads=2, vocab_size=16,
                           max_text_len=4)
    return random_models.randomised_tinydit(config, seed, 0.2)


def test_trajectory_shapes() -> None:
    plan = SamplingPlan(num_steps=5)
    trajectory = sample(nonlinear_velocity, SEEDS, plan, SHAPE)
    assert trajectory.latents.shape == (3, 6, *SHAPE)
    assert trajectory.log_probs.shape == (3, 5)
    assert trajectory.start_step == 0
    assert torch.equal(trajectory.final, trajectory.latents[:, -1])
    assert torch.equal(trajectory.latents[:, 0], initial_latents(SEEDS, SHAPE))
    part = sample(nonlinear_velocity, SEEDS, plan, SHAPE,
                  start_latents=trajectory.latents[:, 2], start_step=2, stop_step=4)
    assert part.latents.shape == (3, 3, *SHAPE)
    assert part.log_probs.shape == (3, 2)
    assert part.start_step == 2


@pytest.mark.parametrize("split", [1, 3, 5])
def test_resuming_from_a_committed_latent_is_bit_identical(split: int) -> None:
    plan = SamplingPlan(num_steps=6, shift=2.0, sampler="sde", noise_level=0.7)
    full = sample(nonlinear_velocity, SEEDS, plan, SHAPE)
    first = sample(nonlinear_velocity, SEEDS, plan, SHAPE, stop_step=split)
    rest = sample(nonlinear_velocity, SEEDS, plan, SHAPE, start_latents=first.final, start_step=split)
    assert torch.equal(rest.final, full.final)
    assert torch.equal(torch.cat([first.latents, rest.latents[:, 1:]], dim=1), full.latents)
    assert torch.equal(torch.cat([first.log_probs, rest.log_probs], dim=1), full.log_probs)


def test_resuming_a_tinydit_sample_is_bit_identical() -> None:
    model = randomised_tinydit(0)
    tokens = torch.tensor([[1, 2, 0, 0], [3, 4, 5, 0]])

    def velocity_fn(x: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        return model(x, sigma, tokens)

    plan = SamplingPlan(num_steps=4)
    full = sample(velocity_fn, [8, 9], plan, model.config.latent_shape)
    first = sample(velocity_fn, [8, 9], plan, model.config.latent_shape, stop_step=2)
    rest = sample(velocity_fn, [8, 9], plan, model.config.latent_shape,
                  start_latents=first.final, start_step=2)
    assert torch.equal(rest.final, full.final)


@pytest.mark.parametrize("sampler", ["sde", "ode"])
def test_unrecorded_sampling_gives_the_same_final_latent(sampler: str) -> None:
    plan = SamplingPlan(num_steps=5, sampler=sampler)
    recorded = sample(nonlinear_velocity, SEEDS, plan, SHAPE)
    cheap = sample(nonlinear_velocity, SEEDS, plan, SHAPE, record=False)
    assert torch.equal(cheap.final, recorded.final)
    assert torch.equal(cheap.latents[:, 0], recorded.latents[:, 0])
    assert cheap.latents.shape == (3, 2, *SHAPE)
    assert torch.equal(cheap.log_probs, recorded.log_probs)


def test_ode_log_probs_are_zero_and_the_ode_is_deterministic_euler() -> None:
    plan = SamplingPlan(num_steps=4, sampler="ode", noise_level=0.7)
    trajectory = sample(nonlinear_velocity, SEEDS, plan, SHAPE)
    assert torch.equal(trajectory.log_probs, torch.zeros(3, 4))
    sigmas = plan.sigmas().tolist()
    x = initial_latents(SEEDS, SHAPE)
    for k in range(4):
        sigma_batch = torch.full((3,), sigmas[k], dtype=x.dtype)
        x = x + nonlinear_velocity(x, sigma_batch) * (sigmas[k + 1] - sigmas[k])
        assert torch.allclose(trajectory.latents[:, k + 1], x, atol=1e-6)


def test_ode_with_exact_velocity_lands_on_the_data() -> None:
    x0 = torch.randn(3, *SHAPE, generator=torch.Generator().manual_seed(1))
    noise = initial_latents(SEEDS, SHAPE)

    def exact_velocity(x: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        return noise - x0

    trajectory = sample(exact_velocity, SEEDS, SamplingPlan(num_steps=7, shift=3.0, sampler="ode"), SHAPE)
    assert torch.allclose(trajectory.final, x0, atol=1e-5)


def test_sde_steps_draw_the_seed_stream_of_their_step() -> None:
    # Each recorded step is mean + std * noise(seed, k), std from Flow-GRPO's formula with the
    # sigma = 1 cap at the schedule's second sigma; log-prob is the Normal density averaged over pixels.
    plan = SamplingPlan(num_steps=3, shift=1.0, noise_level=0.5)
    trajectory = sample(nonlinear_velocity, SEEDS, plan, SHAPE)
    sigmas = plan.sigmas().tolist()
    for k in range(3):
        x, sigma, sigma_next = trajectory.latents[:, k], sigmas[k], sigmas[k + 1]
        denominator = sigmas[1] if sigma == 1.0 else sigma
        g2 = sigma / (1.0 - denominator) * 0.5**2
        v = nonlinear_velocity(x, torch.full((3,), sigma))
        mean = x + (v + g2 / (2 * sigma) * (x + (1 - sigma) * v)) * (sigma_next - sigma)
        std = math.sqrt(g2 * (sigma - sigma_next))
        expected = mean + std * seeded_normal(SEEDS, k, SHAPE)
        assert torch.allclose(trajectory.latents[:, k + 1], expected, atol=1e-5)
        density = torch.distributions.Normal(mean, std).log_prob(trajectory.latents[:, k + 1])
        assert torch.allclose(trajectory.log_probs[:, k], density.mean(dim=(1, 2, 3)), atol=1e-4)


def test_velocity_fn_sees_the_schedule_sigma_per_sample() -> None:
    seen: list[torch.Tensor] = []

    def recording_velocity(x: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        seen.append(sigma.clone())
        return torch.zeros_like(x)

    plan = SamplingPlan(num_steps=3, shift=3.0, sampler="ode")
    sample(recording_velocity, SEEDS, plan, SHAPE)
    assert [s.shape for s in seen] == [(3,)] * 3
    assert [s[0].item() for s in seen] == pytest.approx([1.0, 6.0 / 7.0, 0.6], rel=1e-6)  # 3t/(1+2t)


def test_a_sample_is_a_pure_function_of_weights_and_seed() -> None:
    model = randomised_tinydit(1)
    tokens = torch.tensor([[1, 2, 3, 0]] * 2)

    def velocity_fn(x: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        return model(x, sigma, tokens[: x.shape[0]])

    plan = SamplingPlan(num_steps=3)
    first = sample(velocity_fn, [21, 22], plan, model.config.latent_shape)
    again = sample(velocity_fn, [21, 22], plan, model.config.latent_shape)
    assert torch.equal(first.latents, again.latents)
    assert torch.equal(first.log_probs, again.log_probs)
    other = sample(velocity_fn, [23, 24], plan, model.config.latent_shape)
    assert not torch.allclose(other.final, first.final, atol=1e-2)
    alone = sample(velocity_fn, [22], plan, model.config.latent_shape)  # a row does not see its batch
    assert torch.allclose(alone.final[0], first.final[1], atol=1e-5)
    other_weights = randomised_tinydit(2)
    replayed = sample(lambda x, s: other_weights(x, s, tokens[: x.shape[0]]), [21, 22], plan,
                      model.config.latent_shape)
    assert torch.equal(replayed.latents[:, 0], first.latents[:, 0])  # same seed, same start noise
    assert not torch.allclose(replayed.final, first.final, atol=1e-2)


def test_sampling_runs_without_autograd() -> None:
    weight = torch.tensor(0.5, requires_grad=True)
    trajectory = sample(lambda x, s: weight * x, SEEDS, SamplingPlan(num_steps=2), SHAPE)
    assert not trajectory.latents.requires_grad
    assert not trajectory.log_probs.requires_grad


def test_bad_step_ranges_raise() -> None:
    plan = SamplingPlan(num_steps=4)
    with pytest.raises(ValueError, match="start_latents"):
        sample(nonlinear_velocity, SEEDS, plan, SHAPE, start_step=2)
    with pytest.raises(ValueError, match="start_step"):
        sample(nonlinear_velocity, SEEDS, plan, SHAPE,
               start_latents=initial_latents(SEEDS, SHAPE), start_step=3, stop_step=2)
    with pytest.raises(ValueError, match="num_steps"):
        sample(nonlinear_velocity, SEEDS, plan, SHAPE, stop_step=5)


@pytest.mark.parametrize("window", [1, 3])
def test_an_sde_window_is_sde_steps_then_the_ode_from_the_committed_latent(window: int) -> None:
    windowed = SamplingPlan(num_steps=5, sampler="sde", sde_steps=window)
    trajectory = sample(nonlinear_velocity, SEEDS, windowed, SHAPE)
    sde_part = sample(nonlinear_velocity, SEEDS, SamplingPlan(num_steps=5, sampler="sde"), SHAPE, stop_step=window)
    ode_part = sample(nonlinear_velocity, SEEDS, SamplingPlan(num_steps=5, sampler="ode"), SHAPE,
                      start_latents=sde_part.final, start_step=window)
    assert torch.equal(trajectory.latents[:, : window + 1], sde_part.latents)
    assert torch.equal(trajectory.final, ode_part.final)
    assert (trajectory.log_probs[:, :window] != 0).all()
    assert (trajectory.log_probs[:, window:] == 0).all()
    assert windowed.stochastic_steps == window
    assert SamplingPlan(num_steps=5, sampler="ode", sde_steps=3).stochastic_steps == 0
    assert SamplingPlan(num_steps=5, sampler="sde", sde_steps=9).stochastic_steps == 5


def test_a_prefix_plan_walks_the_full_plans_first_steps_then_jumps_to_the_data() -> None:
    full = SamplingPlan(num_steps=6, shift=3.0, sampler="sde")
    prefix = SamplingPlan(num_steps=4, shift=3.0, sampler="sde", prefix_of=6)
    assert torch.equal(prefix.sigmas()[:4], full.sigmas()[:4])
    assert prefix.sigmas()[4] == 0.0
    assert prefix.stochastic_steps == 3
    full_path = sample(nonlinear_velocity, SEEDS, full, SHAPE)
    prefix_path = sample(nonlinear_velocity, SEEDS, prefix, SHAPE)
    assert torch.equal(prefix_path.latents[:, :4], full_path.latents[:, :4])
    x, sigma = full_path.latents[:, 3], float(full.sigmas()[3])
    jumped = x - sigma * nonlinear_velocity(x, torch.full((len(SEEDS),), sigma))
    assert torch.allclose(prefix_path.final, jumped, atol=1e-6)
    assert (prefix_path.log_probs[:, 3] == 0).all()
    with pytest.raises(ValueError, match="prefix plan takes 1..6 steps"):
        SamplingPlan(num_steps=7, prefix_of=6)
