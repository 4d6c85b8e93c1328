import math

import pytest
import torch
from random_models import TINY_SHAPES_CONFIG, randomised_tinydit

from spotlight.config import TrainSection
from spotlight.diffusion.noise import initial_latents
from spotlight.diffusion.sampler import SamplingPlan, sample
from spotlight.models.tinydit import TinyDiT
from spotlight.rl import grpo
from spotlight.rl.grpo import RolloutBatch, choose_train_timesteps, grpo_update
from spotlight.tasks.shapes import tokenize

CONFIG = TINY_SHAPES_CONFIG
PROMPTS = ["a red circle", "two blue squares", "a green circle above a yellow triangle"]
NOISE_LEVEL = 0.7


def randomised_model(seed: int, scale: float = 0.2, dtype: torch.dtype = torch.float32) -> TinyDiT:
    """A TinyDiT whose every weight is random, so that its velocity (and so every log-prob) is non-trivial."""
    return randomised_tinydit(CONFIG, seed, scale, dtype)


def rollout_batch(model: TinyDiT, num_steps: int = 3, group: int = 2, seed: int = 0) -> RolloutBatch:
    """A real SDE rollout of ``model``: every prompt ``group`` times, with random advantages."""
    prompts = [prompt for prompt in PROMPTS for _ in range(group)]
    tokens = tokenize(prompts, CONFIG.max_text_len)
    seeds = list(range(100, 100 + len(prompts)))
    dtype = next(model.parameters()).dtype
    plan = SamplingPlan(num_steps=num_steps, shift=1.0, sampler="sde", noise_level=NOISE_LEVEL)
    trajectory = sample(lambda x, sigma: model(x, sigma, tokens), seeds, plan, CONFIG.latent_shape,
                        start_latents=initial_latents(seeds, CONFIG.latent_shape).to(dtype))
    advantages = torch.randn(len(prompts), generator=torch.Generator().manual_seed(seed), dtype=dtype)
    return RolloutBatch(latents=trajectory.latents, log_probs=trajectory.log_probs, tokens=tokens,
                        advantages=advantages, sigmas=plan.sigmas(), noise_level=NOISE_LEVEL)


def hand_loss(model: TinyDiT, reference: TinyDiT, batch: RolloutBatch, clip_range: float, kl_beta: float):
    """The Flow-GRPO objective written out from the paper's formulas, independent of spotlight.rl/steps.

    Per step: Gaussian transition N(mean, std^2) of the SDE Euler step; log-prob averaged over pixels;
    PPO clipped surrogate; KL of two Gaussians with a shared std; averaged over steps and samples.
    Returns (loss, fraction of clipped ratios).
    """
    sigmas = batch.sigmas.tolist()
    num_steps = batch.log_probs.shape[1]
    total, clipped = 0.0, 0.0
    for k in range(num_steps):
        sigma, sigma_next = sigmas[k], sigmas[k + 1]
        x, x_next = batch.latents[:, k], batch.latents[:, k + 1]
        sigma_batch = torch.full((x.shape[0],), sigma, dtype=x.dtype)
        g2 = sigma / (1.0 - (sigmas[1] if sigma == 1.0 else sigma)) * NOISE_LEVEL**2
        std = math.sqrt(g2 * (sigma - sigma_next))

        def step_mean(velocity: torch.Tensor, x: torch.Tensor = x, sigma: float = sigma, g2: float = g2,
                      dt: float = sigma_next - sigma) -> torch.Tensor:
            return x + (velocity + g2 / (2 * sigma) * (x + (1 - sigma) * velocity)) * dt

        mean = step_mean(model(x, sigma_batch, batch.tokens))
        with torch.no_grad():
            reference_mean = step_mean(reference(x, sigma_batch, batch.tokens))
        log_prob = torch.distributions.Normal(mean, std).log_prob(x_next).mean(dim=(1, 2, 3))
        ratio = torch.exp(log_prob - batch.log_probs[:, k])
        surrogate = torch.maximum(-batch.advantages * ratio,
                                  -batch.advantages * ratio.clamp(1 - clip_range, 1 + clip_range))
        kl = ((mean - reference_mean) ** 2 / (2 * g2)).mean(dim=(1, 2, 3))  # Flow-GRPO: over g², not std²
        total = total + surrogate.mean() + kl_beta * kl.mean()
        clipped += float(((ratio - 1).abs() > clip_range).double().mean())
    return total / num_steps, clipped / num_steps


def test_fully_on_policy_ratio_is_exactly_one() -> None:
    torch.set_num_threads(1)
    model = randomised_model(0)
    batch = rollout_batch(model)
    assert batch.log_probs.abs().min() > 0  # a real rollout: non-trivial log-probs
    config = TrainSection(num_minibatches=1, timestep_fraction=1.0, kl_beta=0.0, clip_range=0.2)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    metrics = grpo_update(model, None, optimizer, batch, config, torch.Generator().manual_seed(0))
    assert metrics["train/ratio"] == 1.0
    assert metrics["train/clip_fraction"] == 0.0
    assert metrics["train/kl"] == 0.0
    assert metrics["train/policy_loss"] == pytest.approx(-float(batch.advantages.mean()), rel=1e-5, abs=1e-6)


def test_a_later_minibatch_sees_the_moved_policy() -> None:
    torch.set_num_threads(1)
    model = randomised_model(0)
    batch = rollout_batch(model)
    config = TrainSection(num_minibatches=2, timestep_fraction=1.0, learning_rate=1.0, grad_clip=1e9)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    metrics = grpo_update(model, None, optimizer, batch, config, torch.Generator().manual_seed(0))
    assert metrics["train/ratio"] != 1.0  # the first minibatch's step moved the policy


def test_loss_gradient_matches_central_finite_difference() -> None:
    torch.set_num_threads(1)
    old = randomised_model(1, dtype=torch.float64)
    batch = rollout_batch(old, num_steps=3, seed=1)
    model = randomised_model(1, dtype=torch.float64)
    reference = randomised_model(2, dtype=torch.float64)
    with torch.no_grad():  # move the policy away from the one that sampled, so the ratio is not 1
        generator = torch.Generator().manual_seed(3)
        for parameter in model.parameters():
            parameter.add_(0.02 * torch.randn(parameter.shape, generator=generator, dtype=torch.float64))
    clip_range, kl_beta = 0.05, 0.3
    theta = [p.detach().clone() for p in model.parameters()]
    generator = torch.Generator().manual_seed(4)
    direction = [torch.randn(p.shape, generator=generator, dtype=torch.float64) for p in theta]
    norm = math.sqrt(sum(float(d.pow(2).sum()) for d in direction))
    direction = [d / norm for d in direction]  # unit length, so epsilon is the step's real size

    def loss_at(epsilon: float) -> float:
        with torch.no_grad():
            for parameter, start, d in zip(model.parameters(), theta, direction, strict=True):
                parameter.copy_(start + epsilon * d)
            return float(hand_loss(model, reference, batch, clip_range, kl_beta)[0])

    epsilon = 1e-5
    finite_difference = (loss_at(epsilon) - loss_at(-epsilon)) / (2 * epsilon)
    loss_at(0.0)  # back to theta
    with torch.no_grad():
        loss, clip_fraction = hand_loss(model, reference, batch, clip_range, kl_beta)
    assert 0.0 < clip_fraction < 1.0  # the example exercises both branches of the clipped surrogate

    # grpo_update with plain SGD at lr = 1 and no grad clipping steps theta by exactly -grad
    config = TrainSection(num_minibatches=1, timestep_fraction=1.0, clip_range=clip_range, kl_beta=kl_beta,
                          grad_clip=1e12, learning_rate=1.0)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    metrics = grpo_update(model, reference, optimizer, batch, config, torch.Generator().manual_seed(5))
    gradient = [start - p.detach() for p, start in zip(model.parameters(), theta, strict=True)]
    directional = sum(float((g * d).sum()) for g, d in zip(gradient, direction, strict=True))
    assert directional == pytest.approx(finite_difference, rel=1e-7)
    assert metrics["train/loss"] == pytest.approx(float(loss), rel=1e-10)
    assert metrics["train/clip_fraction"] == pytest.approx(clip_fraction, rel=1e-6)  # float32
    assert metrics["train/kl"] > 0


def run_two_updates(seed: int) -> list[torch.Tensor]:
    model = randomised_model(0)
    reference = randomised_model(0)
    config = TrainSection(num_minibatches=2, timestep_fraction=0.5, kl_beta=0.1, learning_rate=1e-2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate)
    generator = torch.Generator().manual_seed(seed)
    for iteration in range(2):
        batch = rollout_batch(model, num_steps=4, seed=iteration)
        grpo_update(model, reference, optimizer, batch, config, generator)
    return [p.detach().clone() for p in model.parameters()]


def test_same_config_and_seed_give_identical_parameters() -> None:
    torch.set_num_threads(1)
    first, second = run_two_updates(7), run_two_updates(7)
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))
    other = run_two_updates(8)  # other timesteps and minibatches
    assert not all(torch.equal(a, b) for a, b in zip(first, other, strict=True))


@pytest.mark.parametrize("num_steps,fraction,count", [(10, 1.0, 10), (10, 0.5, 5), (10, 0.25, 3), (7, 0.01, 1),
                                                      (1, 0.5, 1), (3, 0.34, 2)])
def test_train_timesteps_count_and_range(num_steps: int, fraction: float, count: int) -> None:
    chosen = choose_train_timesteps(num_steps, fraction, torch.Generator().manual_seed(0))
    assert len(chosen) == count
    assert chosen == sorted(set(chosen))
    assert all(0 <= step < num_steps for step in chosen)


def test_train_timesteps_vary_and_cover_every_step() -> None:
    generator = torch.Generator().manual_seed(0)
    draws = [tuple(choose_train_timesteps(10, 0.3, generator)) for _ in range(30)]
    assert len(set(draws)) > 1
    assert set().union(*draws) == set(range(10))
    assert choose_train_timesteps(6, 1.0, generator) == list(range(6))


def test_early_train_timesteps_are_always_the_first_highest_noise_steps() -> None:
    generator = torch.Generator().manual_seed(0)
    assert [choose_train_timesteps(10, 0.3, generator, "early") for _ in range(5)] == [[0, 1, 2]] * 5


def test_update_trains_only_the_sde_window_of_a_windowed_rollout(monkeypatch) -> None:
    """With SDE steps [0, 2) of 4, a step after the window has no log-prob: replaying it must not be trained."""
    model = randomised_model(5)
    batch = rollout_batch(model, num_steps=4)
    batch.stochastic_steps = 2
    trained: list[int] = []
    original = grpo.step_log_prob_and_mean

    def recording(model_, batch_, rows, step, *rest):
        trained.append(step)
        return original(model_, batch_, rows, step, *rest)

    monkeypatch.setattr(grpo, "step_log_prob_and_mean", recording)
    grpo_update(model, None, torch.optim.SGD(model.parameters(), lr=0.1), batch,
                TrainSection(timestep_fraction=1.0, kl_beta=0.0), torch.Generator().manual_seed(0))
    assert sorted(set(trained)) == [0, 1]


# --- sampling with the LoRA merged (issue 42 item 6) ------------------------------------------------


def merged_bf16_policy(folder):
    """A tiny SD3 pipeline policy in bfloat16 whose rollouts sample with the LoRA folded in (as on CUDA)."""
    from spotlight.models.pipelines.family_config import DiffusersPolicyConfig
    from spotlight.models.rebuild import policy_from_config

    config = DiffusersPolicyConfig(family="sd3", pretrained=str(folder), pipeline=True, resolution=(32, 32),
                                   dtype="bfloat16", guidance_scale=4.5, negative_prompt="blurry",
                                   max_sequence_length=16, merge_lora=True)
    policy = policy_from_config(config)
    with torch.no_grad():  # a trained-looking adapter: B away from zero, so the merge changes the weights
        generator = torch.Generator().manual_seed(3)
        for parameter in policy.trainable_parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.05)
    return policy


def merged_rollout(policy) -> RolloutBatch:
    from spotlight.models.generation import generate

    prompts = ["a red circle", "a red circle", "a blue square", "a blue square"]
    plan = SamplingPlan(num_steps=3, sampler="sde", noise_level=NOISE_LEVEL)
    trajectory = generate(policy, prompts, [0, 1, 2, 3], plan)
    return RolloutBatch(latents=trajectory.latents, log_probs=trajectory.log_probs, tokens=policy.tokenize(prompts),
                        advantages=torch.tensor([1.0, -1.0, 0.5, -0.5]), sigmas=plan.sigmas(),
                        noise_level=NOISE_LEVEL)


def recorded_ratios(monkeypatch) -> list[torch.Tensor]:
    """Every ratio the update's clipped loss sees, in call order."""
    ratios: list[torch.Tensor] = []
    original = grpo.clipped_policy_loss

    def recording(log_probs, old_log_probs, advantages, clip_range):
        ratios.append(torch.exp(log_probs - old_log_probs).detach().clone())
        return original(log_probs, old_log_probs, advantages, clip_range)

    monkeypatch.setattr(grpo, "clipped_policy_loss", recording)
    return ratios


def test_the_first_minibatch_ratio_is_exactly_one_under_merged_bf16_sampling(tiny_pipeline, monkeypatch) -> None:
    """The merge rounds W + sBA to bfloat16 (~1e-3 in the ratio): the recorded log-probs would clip the first
    minibatch at the default clip range of 1e-4. θ_old re-scores them on the training path, so its ratio is 1."""
    from spotlight.models.lora_merge import samples_merged
    from spotlight.models.shadow import frozen_copy

    torch.set_num_threads(1)
    policy = merged_bf16_policy(tiny_pipeline("sd3"))
    batch = merged_rollout(policy)
    previous = frozen_copy(policy)  # θ_old: the weights that drew the rollout, as the loop hands it over
    assert samples_merged(previous)
    config = TrainSection(algorithm="flow-grpo", num_minibatches=2, timestep_fraction=1.0, kl_beta=0.0)
    assert config.clip_range == 1e-4  # the default the rounding must not trip

    ratios = recorded_ratios(monkeypatch)
    frozen = torch.optim.SGD(policy.trainable_parameters(), lr=0.0)
    stale = grpo_update(policy, None, frozen, batch, config, torch.Generator().manual_seed(0))  # recorded old
    assert stale["train/clip_fraction"] > 0, "the merge's rounding alone clips (the bug this pins)"
    assert any(not torch.equal(ratio, torch.ones_like(ratio)) for ratio in ratios)

    ratios.clear()
    optimizer = torch.optim.SGD(policy.trainable_parameters(), lr=1e-2)
    metrics = grpo_update(policy, None, optimizer, batch, config, torch.Generator().manual_seed(0), previous)
    steps = batch.log_probs.shape[1]
    first, later = ratios[:steps], ratios[steps:]
    assert len(first) == steps and len(later) == steps
    assert all(torch.equal(ratio, torch.ones_like(ratio)) for ratio in first), first
    assert any(not torch.equal(ratio, torch.ones_like(ratio)) for ratio in later)  # the policy moved in between
    assert math.isfinite(metrics["train/loss"])
