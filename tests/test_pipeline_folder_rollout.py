"""A pipeline folder's rollout as the loop scores it: Flow-GRPO's log-prob of each guided SDE step, recomputed
by the update from the batch, is the one the sampler recorded (the importance ratio starts at 1 under CFG);
NFT's batch asks for the CFG-free velocity."""

from __future__ import annotations

import pytest
import torch
from brightness_reward import Brightness

from spotlight.config import TrainConfig, parse_config
from spotlight.loop.base_policy import build_policy
from spotlight.loop.rollout import rollout
from spotlight.rl.grpo import step_log_prob_and_mean

PROMPTS = ["a red circle", "two blue squares"]


def config_for(folder, algorithm: str) -> TrainConfig:
    return parse_config(TrainConfig, {
        "mode": "vanilla", "model": {"pretrained": str(folder)}, "train": {"algorithm": algorithm},
        "rollout": {"resolution": 32, "guidance_scale": 3.0, "negative_prompt": "blurry", "num_steps": 3,
                    "sde_steps": None, "group_size": 2, "prompts_per_iteration": 2}})


@pytest.mark.parametrize("family", ["sd3", "qwen-image"])
def test_flow_grpo_recomputes_the_guided_steps_log_probs_the_sampler_recorded(family: str, tiny_pipeline) -> None:
    config = config_for(tiny_pipeline(family), "flow-grpo")
    policy = build_policy(config).eval()
    scored = rollout(policy, PROMPTS, torch.tensor([[0, 1], [2, 3]]), config, Brightness())
    batch = scored.batch
    assert batch.latents.shape[2:] == (4, 16, 16)  # latents, not pixels
    assert bool((batch.tokens[:, 1] == 1).all())  # the guided velocity: the step that was sampled
    rows = torch.arange(batch.latents.shape[0])
    with torch.no_grad():
        for step in range(batch.log_probs.shape[1]):
            log_prob, _, _ = step_log_prob_and_mean(policy, batch, rows, step)
            torch.testing.assert_close(log_prob, batch.log_probs[:, step], rtol=0, atol=1e-4)
        unguided = batch.tokens.clone()
        unguided[:, 1] = 0
        _, guided_mean, _ = step_log_prob_and_mean(policy, batch, rows, 1)
        _, free_mean, _ = step_log_prob_and_mean(policy, type(batch)(**{**batch.__dict__, "tokens": unguided}), rows, 1)
    assert (guided_mean - free_mean).abs().max() > 1e-3  # the CFG-free velocity would be another policy


def test_nft_trains_the_conditional_velocity(tiny_pipeline) -> None:
    config = config_for(tiny_pipeline("sd3"), "nft")
    policy = build_policy(config).eval()
    scored = rollout(policy, PROMPTS, torch.tensor([[0, 1], [2, 3]]), config, Brightness())
    assert bool((scored.batch.tokens[:, 1] == 0).all())
    assert scored.metrics["rollout/invalid_samples"] == 0
