import copy

import pytest
import torch
from random_models import TINY_SHAPES_CONFIG, randomised_tinydit

from spotlight.config import TrainSection
from spotlight.rl.grpo import RolloutBatch
from spotlight.rl.nft import nft_loss, nft_update, optimality
from spotlight.tasks.shapes import tokenize

PROMPTS = ["a red circle", "two blue squares", "a green circle above a yellow triangle", "a yellow square"]


def test_optimality_maps_advantages_into_the_unit_interval():
    advantages = torch.tensor([-4.0, -2.0, -1.0, 0.0, 1.0, 2.0, 4.0])
    assert optimality(advantages, scale=2.0).tolist() == [0.0, 0.0, 0.25, 0.5, 0.75, 1.0, 1.0]


@pytest.mark.parametrize("r", [0.0, 0.3, 1.0])
@pytest.mark.parametrize("beta", [0.5, 1.0])
def test_gradient_at_the_sampling_policy_is_advantage_weighted_flow_matching(r, beta):
    # d/dv [r |v+ - t|² + (1-r) |v- - t|²] at v = v_old is 2β(2r-1)(v_old - t) / n (closed form).
    generator = torch.Generator().manual_seed(0)
    old, target = torch.randn(1, 3, 4, 4, generator=generator), torch.randn(1, 3, 4, 4, generator=generator)
    velocity = old.clone().requires_grad_(True)
    nft_loss(velocity, old, target, torch.tensor([r]), beta).sum().backward()
    expected = 2 * beta * (2 * r - 1) * (old - target) / old.numel()
    torch.testing.assert_close(velocity.grad, expected)


@pytest.mark.parametrize("r", [0.0, 0.75, 1.0])
def test_the_loss_is_minimised_a_bounded_step_from_the_sampling_policy(r):
    # Each term is quadratic in v with curvature β² r + β² (1-r): the minimiser is
    # v_old + (2r - 1) / β (t - v_old), so no update can push a velocity further than that.
    beta = 0.5
    generator = torch.Generator().manual_seed(1)
    old, target = torch.randn(2, 3, 4, 4, generator=generator), torch.randn(2, 3, 4, 4, generator=generator)
    velocity = old.clone().requires_grad_(True)
    optimizer = torch.optim.LBFGS([velocity], max_iter=100, line_search_fn="strong_wolfe")

    def closure():
        optimizer.zero_grad()
        loss = nft_loss(velocity, old, target, torch.full((2,), r), beta).sum()
        loss.backward()
        return loss

    optimizer.step(closure)
    torch.testing.assert_close(velocity.detach(), old + (2 * r - 1) / beta * (target - old), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("r", [0.0, 1.0])
def test_adaptive_weighting_keeps_a_terms_gradient_the_same_size_however_large_its_error(r):
    # Uniform weighting: the gradient grows with the error (a term pushing away from its target pushes
    # harder the further it has gone). Adaptive: the x0 error over its own size has a gradient whose
    # size does not depend on how large the error is, and it still points the way uniform's does.
    generator = torch.Generator().manual_seed(3)
    target, direction = torch.randn(2, 3, 4, 4, generator=generator), torch.randn(2, 3, 4, 4, generator=generator)
    sigma = torch.tensor([0.3, 0.8])
    gradients = {}
    for weighting in ("uniform", "adaptive"):
        for size in (0.1, 10.0):
            old = target + size * direction
            velocity = old.clone().requires_grad_(True)
            nft_loss(velocity, old, target, torch.full((2,), r), 1.0, sigma, weighting).sum().backward()
            gradients[weighting, size] = velocity.grad
    uniform_growth = gradients["uniform", 10.0].norm() / gradients["uniform", 0.1].norm()
    torch.testing.assert_close(uniform_growth, torch.tensor(100.0))
    torch.testing.assert_close(gradients["adaptive", 10.0], gradients["adaptive", 0.1])
    cosine = torch.nn.functional.cosine_similarity(gradients["adaptive", 0.1].flatten(),
                                                   gradients["uniform", 0.1].flatten(), dim=0)
    assert cosine > 0.9


def test_adaptive_weighting_needs_the_noise_levels():
    velocity = torch.zeros(1, 3, 4, 4)
    with pytest.raises(ValueError, match="needs the samples' noise levels"):
        nft_loss(velocity, velocity, velocity, torch.ones(1), 1.0, weighting="adaptive")


def clean_batch(advantages: list[float]) -> RolloutBatch:
    """Four fixed clean 8x8 samples (the update reads only the final latents) with given advantages."""
    generator = torch.Generator().manual_seed(2)
    clean = torch.rand(len(PROMPTS), 3, 8, 8, generator=generator) * 2 - 1
    latents = torch.stack([torch.randn(clean.shape, generator=generator), clean], dim=1)
    return RolloutBatch(latents=latents, log_probs=torch.zeros(len(PROMPTS), 1),
                        tokens=tokenize(PROMPTS, TINY_SHAPES_CONFIG.max_text_len),
                        advantages=torch.tensor(advantages), sigmas=torch.tensor([1.0, 0.0], dtype=torch.float64),
                        noise_level=0.0, stochastic_steps=0)


def flow_matching_error(model, batch: RolloutBatch, row: int) -> float:
    """Mean flow-matching error of one sample over a fixed grid of noise levels and noises."""
    generator = torch.Generator().manual_seed(3)
    x0 = batch.latents[row, -1].expand(64, -1, -1, -1)
    sigma = torch.linspace(0.02, 0.98, 64)
    noise = torch.randn(x0.shape, generator=generator)
    noisy = (1 - sigma.view(-1, 1, 1, 1)) * x0 + sigma.view(-1, 1, 1, 1) * noise
    with torch.no_grad():
        return float((model(noisy, sigma, batch.tokens[row].expand(64, -1)) - (noise - x0)).pow(2).mean())


def test_update_pulls_the_model_towards_positive_samples_and_away_from_negative():
    model = randomised_tinydit(TINY_SHAPES_CONFIG, seed=4, std=0.2)
    old = randomised_tinydit(TINY_SHAPES_CONFIG, seed=4, std=0.2).requires_grad_(False)
    batch = clean_batch([2.0, -2.0, 2.0, -2.0])
    before = [flow_matching_error(model, batch, row) for row in range(4)]
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    config = TrainSection(algorithm="nft", nft_timesteps=8, num_minibatches=1, nft_kl_beta=0.0)
    for step in range(10):
        metrics = nft_update(model, old, optimizer, batch, config, torch.Generator().manual_seed(step))
    after = [flow_matching_error(model, batch, row) for row in range(4)]
    assert metrics["train/trained_samples"] == 4
    assert after[0] < before[0] and after[2] < before[2]  # positives: fitted better
    assert after[1] > before[1] and after[3] > before[3]  # negatives: fitted worse


def test_groups_without_signal_leave_the_weights_untouched():
    model = randomised_tinydit(TINY_SHAPES_CONFIG, seed=5, std=0.2)
    old = randomised_tinydit(TINY_SHAPES_CONFIG, seed=5, std=0.2).requires_grad_(False)
    before = {name: value.clone() for name, value in model.state_dict().items()}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    metrics = nft_update(model, old, optimizer, clean_batch([0.0] * 4), TrainSection(num_minibatches=2),
                         torch.Generator().manual_seed(0))
    assert metrics["train/trained_samples"] == 0
    for name, value in model.state_dict().items():
        torch.testing.assert_close(value, before[name])


def velocity_distance(model, reference, batch: RolloutBatch) -> float:
    """Mean squared velocity difference of two models over the batch's samples at fixed noise levels."""
    generator = torch.Generator().manual_seed(7)
    x0 = batch.latents[:, -1].repeat(8, 1, 1, 1)
    sigma = torch.rand(x0.shape[0], generator=generator)
    noisy = (1 - sigma.view(-1, 1, 1, 1)) * x0 + sigma.view(-1, 1, 1, 1) * torch.randn(x0.shape, generator=generator)
    tokens = batch.tokens.repeat(8, 1)
    with torch.no_grad():
        return float((model(noisy, sigma, tokens) - reference(noisy, sigma, tokens)).pow(2).mean())


def test_the_kl_term_holds_the_walk_near_the_reference():
    """Many updates from the same old policy drift the model; nft_kl_beta pulls it back towards the base."""
    batch = clean_batch([2.0, -2.0, 2.0, -2.0])
    reference = randomised_tinydit(TINY_SHAPES_CONFIG, seed=6, std=0.2).requires_grad_(False)
    distances = {}
    for kl_beta in (0.0, 5.0):
        model = randomised_tinydit(TINY_SHAPES_CONFIG, seed=6, std=0.2)
        optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
        config = TrainSection(algorithm="nft", nft_timesteps=4, num_minibatches=1, nft_kl_beta=kl_beta)
        for step in range(15):
            old = copy.deepcopy(model).requires_grad_(False)  # θ_old = θ_i: the walk compounds
            metrics = nft_update(model, old, optimizer, batch, config, torch.Generator().manual_seed(step),
                                 reference=reference)
        distances[kl_beta] = velocity_distance(model, reference, batch)
    assert "train/kl" in metrics
    assert distances[5.0] < 0.5 * distances[0.0]


def test_a_kl_term_without_a_reference_is_refused_in_one_line():
    model = randomised_tinydit(TINY_SHAPES_CONFIG, seed=4, std=0.2)
    with pytest.raises(ValueError, match="needs the frozen base"):
        nft_update(model, model, torch.optim.Adam(model.parameters()), clean_batch([1.0, -1.0]),
                   TrainSection(num_minibatches=1, nft_kl_beta=0.1), torch.Generator().manual_seed(0))
