"""Data-parallel rollouts (`spotlight.ranks.rollout`): K = 2 ranks sample the samples one process would, and train
to the same weights within all-reduce rounding, on the toy model and on a tiny SD3 pipeline folder.

The reference for the samples is a second path: the driver's own sampling policy generating every
(prompt, seed) pair in this process (`generate`): the same initial noise bit for bit, the same samples
within the rounding of a forward batched over fewer rows; for the update it is the same run with K = 1.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch
from brightness_reward import Brightness

from spotlight.config import TrainConfig, parse_config
from spotlight.loop.rollout import group_requests, rollout_plan
from spotlight.loop.streams import iteration_prompts
from spotlight.models.generation import generate
from spotlight.ranks.placement import placement_error, process_group_backend
from spotlight.ranks.rollout import concat_outputs, prompt_shares
from spotlight.rewards.base import RewardOutput
from spotlight.trainer import Trainer


def test_prompt_shares_cover_every_prompt_once_in_order_and_never_split_a_group() -> None:
    for prompts in (1, 2, 5, 16):
        for world_size in (1, 2, 3, 8):
            shares = prompt_shares(prompts, world_size)
            assert len(shares) == world_size
            assert [p for share in shares for p in range(prompts)[share]] == list(range(prompts))


def test_reward_outputs_concatenate_in_rank_order_with_their_terms() -> None:
    def output(values: list[float], term: str | None) -> RewardOutput:
        rewards = torch.tensor(values)
        return RewardOutput(rewards, rewards > 0.5, torch.ones(len(values), dtype=torch.bool), [f"e{values[0]}"],
                            {} if term is None else {term: rewards * 2})

    whole = concat_outputs([output([0.1, 0.9], "a"), output([0.7], None)])
    assert whole.rewards.tolist() == pytest.approx([0.1, 0.9, 0.7])
    assert whole.strict.tolist() == [False, True, True] and whole.errors == ["e0.1", "e0.7"]
    assert whole.terms["a"].tolist() == pytest.approx([0.2, 1.8, 0.0])


def test_nccl_on_gpus_gloo_on_the_cpu_and_a_rank_without_a_gpu_is_one_line() -> None:
    assert process_group_backend("cpu") == "gloo"
    assert process_group_backend("cuda") == process_group_backend("cuda:1") == "nccl"

    def node(gpus: int, on_demand: bool, alive: bool = True) -> dict:
        kind = {"on_demand": 1.0} if on_demand else {"spot": 1.0}
        return {"Alive": alive, "Resources": {"GPU": float(gpus), **kind}}

    assert placement_error("cpu", 8, []) is None and placement_error("cuda", 4, [node(4, True)]) is None
    # spot nodes' GPUs and a dead node's do not count, nor the driver's own
    line = placement_error("cuda", 4, [node(2, True), node(8, False), node(8, True, alive=False)])
    assert line is not None and "\n" not in line
    assert line.startswith("trainer rank 2 of 4 has no GPU") and "trainer.devices" in line and "on_demand" in line
    # a cluster the run started offers ranks every GPU but the driver's (`GpuLayout`): every GPU it lists is free
    assert placement_error("cuda", 3, [node(2, True)], counts_driver_gpu=False) is None
    assert placement_error("cuda", 4, [node(2, True)], counts_driver_gpu=False).startswith("trainer rank 3 of 4")


# -- end to end: a Ray rank actor per trainer ------------------------------------------------------------------------

two_cores = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="two trainer ranks pin two cores")


@pytest.fixture(scope="module")
def ray_cluster():
    from spotlight.runtime.spot.pools import LocalCluster

    cluster = LocalCluster(node_timeout_s=600)
    yield cluster
    cluster.shutdown()


def trainer(settings: dict, run_dir: Path, devices: int) -> Trainer:
    shutil.rmtree(run_dir, ignore_errors=True)
    config = parse_config(TrainConfig, {**settings, "run_dir": str(run_dir), "trainer": {"devices": devices},
                                        "runtime": {"node_timeout_s": 600}})
    return Trainer(config, reward=Brightness())


def close(run: Trainer) -> None:
    if run.ranks is not None:
        run.ranks.close()
    run.backend.close()
    run._lock.release()


def one_iteration(run: Trainer, iteration: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The iteration as the loop runs it (seeds, rollout, update, EMA): the rollout's latents, its advantages, and
    every sample drawn in this process by the driver's sampling policy with the same seeds (the second path)."""
    config = run.config
    prompts = iteration_prompts(run.train_prompts, config.seed, iteration, config.rollout.prompts_per_iteration)
    seeds = run.backend.choose_seeds(iteration, prompts, run.budget_s).seeds  # random, or explored
    expanded, flat_seeds = group_requests(prompts, seeds)
    expected = generate(run.sampler, expanded, flat_seeds, rollout_plan(config)).latents
    scored = run.rollout(iteration, prompts, seeds)
    run.update(iteration, scored)
    run.update_ema(iteration)
    return scored.batch.latents, scored.batch.advantages, expected


def check_two_ranks_match_one(settings: dict, tmp_path: Path, iterations: int) -> None:
    """K = 2: each iteration's gathered samples are the driver's in-process samples (with the seeds the loop chose),
    its advantages K = 1's, and after ``iterations`` the weights are K = 1's within rounding."""
    runs = {}
    for devices in (1, 2):
        run = trainer(settings, tmp_path / f"k{devices}", devices)
        try:
            runs[devices] = [one_iteration(run, iteration) for iteration in range(iterations)]
            runs[devices].append({k: v.clone() for k, v in run.model.state_dict().items()})
        finally:
            close(run)
    for (latents, advantages, expected), (_, one_advantages, _) in zip(runs[2][:-1], runs[1][:-1], strict=True):
        # the ranks' shares, gathered: one process's samples within the rounding of a forward batched over 3 or 6
        # rows instead of 9 (~2e-7; a wrong seed or prompt is off by ~1), the seeds' noise bit for bit
        torch.testing.assert_close(latents[:, -1], expected[:, -1], rtol=0, atol=1e-5)
        if settings.get("train", {}).get("algorithm", "nft") == "nft":  # NFT's batch carries the clean samples alone
            assert latents.shape[1] == 1
        else:
            assert torch.equal(latents[:, 0], expected[:, 0])
            torch.testing.assert_close(latents, expected, rtol=0, atol=1e-5)
        assert advantages.abs().sum() > 0
        torch.testing.assert_close(advantages, one_advantages, rtol=1e-4, atol=1e-4)  # iteration 2: rounded weights
    torch.testing.assert_close(runs[2][0][0][:, -1], runs[1][0][0][:, -1], rtol=0, atol=1e-5)  # iteration 1
    for name, value in runs[1][-1].items():
        torch.testing.assert_close(runs[2][-1][name], value, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
@two_cores
def test_two_ranks_sample_the_toy_models_groups_as_one_with_explored_seeds(ray_cluster, tiny_base_model,
                                                                            tmp_path) -> None:
    """Mode sync-explore: the seeds are chosen by exploration before the rollout, and travel with their prompts."""
    check_two_ranks_match_one({
        "mode": "sync-explore", "base_checkpoint": str(tiny_base_model), "iterations": 2,
        "rollout": {"prompts_per_iteration": 3, "group_size": 3, "num_steps": 3},  # 2 + 1 prompts: uneven shares
        "explore": {"num_candidates": 4, "num_steps": 2},
        "train": {"num_minibatches": 2, "ema_decay": 0.5, "learning_rate": 3e-3},  # θ_old trails θ: sent to rank 1
        "eval": {"every": 10, "seeds_per_prompt": 1, "num_steps": 2, "grid_prompts": 2}}, tmp_path, iterations=2)


@pytest.mark.slow
@two_cores
def test_two_ranks_sample_a_pipeline_folders_groups_as_one(ray_cluster, tiny_pipeline, tmp_path) -> None:
    """A tiny SD3 folder with LoRA and Flow-GRPO (whose batch carries every step): each rank decodes its share with
    the folder's VAE and scores it."""
    check_two_ranks_match_one({
        "mode": "vanilla", "model": {"pretrained": str(tiny_pipeline("sd3")), "lora_rank": 2}, "iterations": 2,
        "rollout": {"prompts_per_iteration": 2, "group_size": 2, "num_steps": 2, "resolution": 32, "sde_steps": None,
                    "guidance_scale": 2.0},
        "train": {"algorithm": "flow-grpo", "num_minibatches": 1, "learning_rate": 1e-3},
        "eval": {"seeds_per_prompt": 1, "num_steps": 2, "grid_prompts": 2, "prompts": 4, "raw_model": False}},
        tmp_path, iterations=1)  # the toy's test covers a trailing θ_old sent to the rank at iteration 2


@pytest.mark.parametrize(("settings", "start", "knob"), [
    ({"mode": "disaggregated"}, "trainer.devices=2: mode disaggregated trains on one rank", "set trainer.devices 1"),
    ({"trainer": {"devices": 2, "sharding": "fsdp"}, "model": {"family": "sd3"}},
     "trainer.sharding fsdp with model.finetune lora", "set trainer.sharding ddp"),
    ({"trainer": {"devices": 2, "sharding": "fsdp"}, "mode": "stale-explore"},
     "trainer.devices=2 with trainer.sharding fsdp: mode stale-explore explores with a whole", "mode spotlight"),
])
def test_what_k_ranks_cannot_run_is_refused_in_one_line_naming_the_knob(settings: dict, start: str, knob: str) -> None:
    from spotlight.config import ConfigError

    with pytest.raises(ConfigError) as caught:
        parse_config(TrainConfig, {"trainer": {"devices": 2}, "pin_devices": False, **settings})
    line = str(caught.value)
    assert "\n" not in line and start in line and knob in line


@pytest.mark.slow
@two_cores
def test_a_rank_that_dies_before_its_share_is_sampled_stops_the_rollout_in_one_line(ray_cluster, tiny_base_model,
                                                                                    tmp_path) -> None:
    import json
    import signal

    from spotlight.run_error import RunError

    run = trainer({"mode": "vanilla", "base_checkpoint": str(tiny_base_model), "iterations": 1,
                   "rollout": {"prompts_per_iteration": 2, "group_size": 2, "num_steps": 2}}, tmp_path / "run", 2)
    try:
        os.kill(json.loads((tmp_path / "run" / "trainer-ranks.json").read_text())["1"], signal.SIGKILL)
        prompts = iteration_prompts(run.train_prompts, 0, 0, 2)
        with pytest.raises(RunError) as caught:
            run.rollout(0, prompts, run.backend.choose_seeds(0, prompts, 0.0).seeds)
    finally:
        close(run)
    line = str(caught.value)
    assert "\n" not in line and line.startswith("trainer rank 1 of 2 died while sampling iteration 1's rollout")
    assert "--resume" in line and "trainer.devices" in line


@pytest.mark.slow
def test_a_reward_object_the_ranks_cannot_receive_is_one_line_naming_the_fix(ray_cluster) -> None:
    import threading

    from spotlight.ranks.group import shipped_reward
    from spotlight.run_error import RunError

    class Locked(Brightness):  # a reward holding a lock (a pool, a connection) cannot be pickled
        def __init__(self) -> None:
            self.lock = threading.Lock()

    with pytest.raises(RunError) as caught:
        shipped_reward(Locked(), 2)
    line = str(caught.value)
    assert "\n" not in line and line.startswith("trainer ranks 1..1 cannot receive the reward object")
    assert "reward.name" in line and "trainer.devices 1" in line
    assert shipped_reward(Brightness(), 2) is not None  # a plain reward goes, its module pickled by value


def test_an_nft_update_on_the_clean_samples_alone_is_the_update_on_the_whole_trajectory(tiny_base_model) -> None:
    """What the ranks exchange for NFT (`what_the_update_reads`) must be all `nft_update` reads: the same seeds,
    the same weights after the update, bit for bit."""
    from spotlight.components.checkpoint import load_model
    from spotlight.config import TrainSection
    from spotlight.diffusion.sampler import Trajectory
    from spotlight.ranks.rollout import what_the_update_reads
    from spotlight.rl.grpo import RolloutBatch
    from spotlight.rl.nft import nft_update
    from spotlight.rl.rollout_update import build_optimizer

    generator = torch.Generator().manual_seed(0)
    latents, log_probs = torch.randn(6, 4, 3, 32, 32, generator=generator), torch.randn(6, 3, generator=generator)
    trajectory = Trajectory(latents, log_probs, 0)
    section = TrainSection(num_minibatches=2, learning_rate=1e-2)
    weights = []
    for kept in (trajectory, what_the_update_reads(trajectory, "nft")):
        model, old = load_model(tiny_base_model), load_model(tiny_base_model).requires_grad_(False)
        tokens = torch.randint(1, model.config.vocab_size, (6, model.config.max_text_len), generator=torch.Generator())
        batch = RolloutBatch(latents=kept.latents, log_probs=kept.log_probs, tokens=tokens,
                             advantages=torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, 0.0]), sigmas=torch.linspace(1, 0, 4),
                             noise_level=0.0, stochastic_steps=0)
        nft_update(model, old, build_optimizer(model, section), batch, section, torch.Generator().manual_seed(1), old)
        weights.append(model.state_dict())
    assert what_the_update_reads(trajectory, "nft").latents.shape == (6, 1, 3, 32, 32)
    assert what_the_update_reads(trajectory, "flow-grpo") is trajectory
    assert all(torch.equal(weights[0][name], weights[1][name]) for name in weights[0])
    assert any(not torch.equal(weights[0][name], load_model(tiny_base_model).state_dict()[name]) for name in weights[0])
