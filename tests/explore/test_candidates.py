import torch
from random_models import TINY_SHAPES_CONFIG, randomised_tinydit

from spotlight.diffusion.sampler import SamplingPlan
from spotlight.explore.candidates import exploration_sampling
from spotlight.explore.planner import ExplorePlan
from spotlight.models.generation import generate

ROLLOUT = SamplingPlan(num_steps=6, shift=3.0, sampler="sde", noise_level=0.7, sde_steps=4)
CONFIG = TINY_SHAPES_CONFIG


def test_a_full_length_sde_arm_is_the_rollout_itself() -> None:
    assert exploration_sampling(ExplorePlan(16, 6), ROLLOUT) == ROLLOUT
    assert exploration_sampling(ExplorePlan(16, 9), ROLLOUT) == ROLLOUT


def test_a_shorter_sde_arm_walks_the_rollouts_first_steps() -> None:
    sampling = exploration_sampling(ExplorePlan(16, 3), ROLLOUT)
    assert sampling.prefix_of == 6 and sampling.num_steps == 3
    assert (sampling.shift, sampling.noise_level, sampling.sde_steps) == (3.0, 0.7, 4)
    model = randomised_tinydit(CONFIG, 0, 0.2)
    prompts, seeds = ["a red circle"] * 3, [4, 5, 6]
    rollout = generate(model, prompts, seeds, ROLLOUT)
    explored = generate(model, prompts, seeds, sampling)
    assert torch.equal(explored.latents[:, :3], rollout.latents[:, :3])
    assert not torch.equal(explored.final, rollout.final)


def test_an_ode_arm_samples_its_own_ode_schedule() -> None:
    sampling = exploration_sampling(ExplorePlan(16, 4, "ode"), ROLLOUT)
    assert sampling == SamplingPlan(num_steps=4, shift=3.0, sampler="ode")
