"""End-to-end behaviour of the training loop on a tiny model: modes, determinism, resume, faults."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from spotlight.config import TrainConfig, parse_config
from spotlight.loop.streams import iteration_prompts
from spotlight.rewards.base import RewardError, RewardOutput
from spotlight.rewards.geneval.reward import GenEvalReward
from spotlight.trainer import RunError, Trainer, train


def tiny_config(base: Path, run_dir: Path, **changes) -> TrainConfig:
    data = {
        "mode": "vanilla", "base_checkpoint": str(base), "run_dir": str(run_dir), "iterations": 2, "num_threads": 1,
        "checkpoint_every": 1,
        "rollout": {"prompts_per_iteration": 2, "group_size": 3, "num_steps": 3},
        "train": {"kl_beta": 0.01, "num_minibatches": 2, "ema_decay": 0.5},
        "explore": {"num_candidates": 4, "num_steps": 2, "monitor_prompts": 1},
        "eval": {"every": 1, "seeds_per_prompt": 1, "num_steps": 2, "grid_prompts": 2},
    }
    for key, value in changes.items():
        section, _, field = key.partition("__")
        if field:
            data[section][field] = value
        else:
            data[key] = value
    return parse_config(TrainConfig, data)


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("mode", ["vanilla", "sync-explore", "stale-explore"])
def test_each_mode_writes_config_metrics_grids_and_checkpoints(tiny_base_model, tmp_path, mode):
    run_dir = tmp_path / mode
    summary = train(tiny_config(tiny_base_model, run_dir, mode=mode))
    records = read_metrics(run_dir)
    assert [r["iteration"] for r in records] == [0, 1, 2]
    assert all("val/strict_accuracy" in r for r in records)
    assert (run_dir / "config.yaml").is_file()
    assert (run_dir / "samples" / "iter-00002.png").is_file()
    assert (run_dir / "checkpoints" / "latest").read_text() == "iter-000002"
    assert summary.validation[-1]["iteration"] == 2
    if mode == "stale-explore":
        assert "staleness/kendall_tau" in records[1]
    if mode != "vanilla":
        assert "explore/selected_reward_std" in records[1]
        assert "explore/preview_fidelity" in records[1]  # the preview checked against the rollout (NaN: none varied)


class BrightnessReward:
    """Mean pixel brightness: a reward every sample of a random model earns differently, so updates act."""

    name = "brightness"

    def score(self, images: torch.Tensor, prompts) -> RewardOutput:
        rewards = images.mean(dim=(1, 2, 3))
        return RewardOutput(rewards, rewards > 0.5, torch.ones(len(prompts), dtype=torch.bool))


@pytest.fixture(scope="module")
def uninterrupted(tiny_base_model, tmp_path_factory):
    """``uninterrupted(algorithm)``: the history of one straight 2-iteration run of the tiny config, run once per
    algorithm and shared by the determinism and the resume tests (each compares a second run against it)."""
    histories: dict[str, list[dict]] = {}

    def history(algorithm: str) -> list[dict]:
        if algorithm not in histories:
            config = tiny_config(tiny_base_model, tmp_path_factory.mktemp(algorithm), train__algorithm=algorithm)
            histories[algorithm] = train(config, reward=BrightnessReward()).history
        return histories[algorithm]

    return history


@pytest.mark.parametrize("algorithm", ["nft", "flow-grpo"])
def test_same_config_and_seed_give_the_same_numbers(tiny_base_model, tmp_path, algorithm, uninterrupted):
    first = uninterrupted(algorithm)
    second = train(tiny_config(tiny_base_model, tmp_path / "b", train__algorithm=algorithm),
                   reward=BrightnessReward()).history
    keys = ["rollout/reward_mean", "train/loss", "train/grad_norm", "val/reward", "val_raw/reward"]
    assert first[-1]["train/grad_norm"] > 0  # the update acted
    for one, two in zip(first[1:], second[1:], strict=True):
        assert [one.get(k) for k in keys] == [two.get(k) for k in keys]


@pytest.mark.parametrize("algorithm", ["nft", "flow-grpo"])
def test_resume_continues_with_the_numbers_of_an_uninterrupted_run(tiny_base_model, tmp_path, algorithm,
                                                                   uninterrupted):
    def run(name: str, iterations: int, resume: bool = False) -> list[dict]:
        config = tiny_config(tiny_base_model, tmp_path / name, iterations=iterations, train__algorithm=algorithm)
        return train(config, resume=resume, reward=BrightnessReward()).history

    straight = uninterrupted(algorithm)  # 2 iterations; the resumed run stops after 1 and resumes to 2
    run("resumed", 1)
    resumed = run("resumed", 2, resume=True)
    assert [r["iteration"] for r in resumed] == [0, 1, 2]
    assert resumed[-1]["train/loss"] == straight[-1]["train/loss"]
    assert resumed[-1]["val/reward"] == straight[-1]["val/reward"]


def test_nft_raises_the_reward_it_is_trained_on(tiny_base_model, tmp_path):
    # The loop as a whole learns: the brightness of validation samples (fixed seeds) rises.
    config = tiny_config(tiny_base_model, tmp_path / "learn", iterations=12, train__learning_rate=3e-3,
                         train__num_epochs=4, train__ema_decay=None, rollout__prompts_per_iteration=4,
                         rollout__group_size=4, eval__every=12)
    history = train(config, reward=BrightnessReward()).history
    assert history[-1]["val/reward"] > history[0]["val/reward"] + 0.02


def test_the_best_validated_model_is_kept(tiny_base_model, tmp_path):
    run_dir = tmp_path / "best"
    history = train(tiny_config(tiny_base_model, run_dir, iterations=3), reward=BrightnessReward()).history
    best = max(history, key=lambda r: r["val/strict_accuracy"])  # first of equals: saved on improvement only
    metadata = json.loads((run_dir / "checkpoints" / "best" / "model.json").read_text())["metadata"]
    assert metadata == {"iteration": best["iteration"], "val/strict_accuracy": best["val/strict_accuracy"]}


def test_eval_prompts_validates_on_that_many_prompts_spread_over_every_kind(tiny_base_model, tmp_path):
    from spotlight.loop.evaluation import validation_subset
    from spotlight.task_presets import get_task

    dataset = get_task("shapes").dataset()
    subset = validation_subset(dataset.test, 8)
    assert len(subset) == 8 and len(set(subset)) == 8 and set(subset) <= set(dataset.test)
    kinds = {dataset.kind_of(prompt) for prompt in dataset.test}
    assert {dataset.kind_of(prompt) for prompt in subset} == kinds  # evenly spread: no kind left out
    assert validation_subset(dataset.test, None) == validation_subset(dataset.test, 1000) == dataset.test

    trainer = Trainer(tiny_config(tiny_base_model, tmp_path / "quick", iterations=1, eval__prompts=8))
    assert trainer.val_prompts == subset
    history = trainer.run().history
    accuracy, se = history[-1]["val/strict_accuracy"], history[-1]["val/strict_accuracy_se"]
    assert se == pytest.approx((accuracy * (1 - accuracy) / 8) ** 0.5)  # 8 prompts x 1 seed were scored


def test_starting_over_an_existing_run_asks_for_resume(tiny_base_model, tmp_path):
    config = tiny_config(tiny_base_model, tmp_path / "run", iterations=1)
    train(config)
    with pytest.raises(RunError, match="--resume"):
        Trainer(config)


def test_missing_base_checkpoint_names_the_path(tmp_path):
    from spotlight.components.checkpoint import CheckpointError

    with pytest.raises(CheckpointError, match="nowhere"):
        Trainer(tiny_config(tmp_path / "nowhere", tmp_path / "run"))


class FlakyReward:
    """The real GenEval reward, except that it raises on one prompt and returns NaN for another."""

    name = "flaky"

    def __init__(self, bad_prompt: str, nan_prompt: str) -> None:
        self.inner = GenEvalReward()
        self.bad_prompt, self.nan_prompt = bad_prompt, nan_prompt

    def score(self, images: torch.Tensor, prompts) -> RewardOutput:
        if self.bad_prompt in prompts:
            raise ValueError(f"cannot score {self.bad_prompt!r}")
        out = self.inner.score(images, prompts)
        nan = torch.tensor([p == self.nan_prompt for p in prompts])
        return RewardOutput(torch.where(nan, torch.nan, out.rewards), out.strict, out.valid)


def test_a_reward_failing_on_some_samples_marks_them_and_the_run_goes_on(tiny_base_model, tmp_path):
    config = tiny_config(tiny_base_model, tmp_path / "run", iterations=1)
    config = config.model_copy(update={"rollout": config.rollout.model_copy(update={"prompts_per_iteration": 3})})
    from spotlight.tasks.shapes import train_val_split

    prompts = iteration_prompts(train_val_split()[0], config.seed, 0, 3)
    summary = train(config, reward=FlakyReward(prompts[0], prompts[1]))
    record = summary.history[1]
    assert record["rollout/invalid_samples"] == 6  # two groups of 3 are marked, the third trains
    assert record["iteration"] == 1 and "train/loss" in record


class BrokenReward:
    name = "broken"

    def score(self, images, prompts):
        raise RuntimeError("detector weights not found")


def test_a_reward_that_always_raises_stops_with_one_line_and_keeps_the_run_dir(tiny_base_model, tmp_path):
    run_dir = tmp_path / "run"
    with pytest.raises(RewardError) as error:
        train(tiny_config(tiny_base_model, run_dir), reward=BrokenReward())
    message = str(error.value)
    assert "\n" not in message and "broken" in message and "detector weights not found" in message
    assert (run_dir / "config.yaml").is_file()


def test_the_planner_picks_plans_within_the_training_budget_and_survives_resume(tiny_base_model, tmp_path):
    config = tiny_config(tiny_base_model, tmp_path / "run", mode="stale-explore", iterations=3)
    data = config.model_dump()
    data["explore"]["planner"] = {"num_candidates": [3, 4, 6], "num_steps": [1, 2],
                                  "prior_cost_per_candidate_step_s": 0.001}
    config = TrainConfig.model_validate(data)
    train(config.model_copy(update={"iterations": 2}))
    history = train(config, resume=True).history
    planned = [r for r in history[1:] if "planner/budget_s" in r]
    assert len(planned) == 3
    for record in planned:
        if "planner/num_candidates" in record:
            assert record["planner/num_candidates"] in (3, 4, 6) and record["planner/num_steps"] in (1, 2)
            assert record["planner/predicted_s"] <= record["planner/budget_s"]
    assert planned[1]["planner/budget_s"] == history[1]["time/train_s"]  # budget = last training time


def test_planner_grid_smaller_than_the_group_is_refused(tiny_base_model, tmp_path):
    from spotlight.config import ConfigError

    data = tiny_config(tiny_base_model, tmp_path / "run", mode="sync-explore").model_dump()
    data["explore"]["planner"] = {"num_candidates": [2, 8]}
    with pytest.raises(ConfigError, match="explore.planner.num_candidates"):
        parse_config(TrainConfig, data)


def test_max_wall_s_ends_the_run_after_the_iteration_that_passes_it_validated_and_checkpointed(tiny_base_model,
                                                                                                 tmp_path):
    run_dir = tmp_path / "run"
    trainer = Trainer(tiny_config(tiny_base_model, run_dir, iterations=5, checkpoint_every=10))
    summary = trainer.run(max_wall_s=1e-9)
    assert [r["iteration"] for r in summary.history] == [0, 1]
    assert "val/strict_accuracy" in summary.history[-1]
    assert (run_dir / "checkpoints" / "latest").read_text() == "iter-000001"


def test_a_rollout_sampled_in_parts_scores_like_one_sampled_whole(tiny_base_model, tmp_path):
    """What the runtime does with spot helpers: sample prompt groups on several devices, score them together."""
    from spotlight.diffusion.sampler import Trajectory
    from spotlight.loop.rollout import group_requests, rollout, rollout_plan, score_rollout
    from spotlight.loop.streams import candidate_seeds
    from spotlight.models.generation import generate

    config = tiny_config(tiny_base_model, tmp_path / "run")
    trainer = Trainer(config)
    prompts = iteration_prompts(trainer.train_prompts, 0, 0, 2)
    seeds = candidate_seeds(0, 0, 2, 3)
    whole = rollout(trainer.model, prompts, seeds, config, trainer.reward)
    parts = [generate(trainer.model, *group_requests([prompts[p]], seeds[p:p + 1]), rollout_plan(config))
             for p in range(2)]
    joined = Trajectory(torch.cat([t.latents for t in parts]), torch.cat([t.log_probs for t in parts]), 0)
    split = score_rollout(trainer.model, prompts, seeds, joined, config, trainer.reward)
    torch.testing.assert_close(split.batch.latents, whole.batch.latents, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(split.batch.advantages, whole.batch.advantages, rtol=1e-3, atol=1e-4)
    assert split.metrics.keys() == whole.metrics.keys()


def test_train_optimizer_picks_sgd_with_momentum_or_adamw() -> None:
    from spotlight.config import TrainSection
    from spotlight.trainer import build_optimizer

    model = torch.nn.Linear(3, 2)
    sgd = build_optimizer(model, TrainSection(optimizer="sgd", learning_rate=0.5, momentum=0.8))
    assert isinstance(sgd, torch.optim.SGD) and sgd.param_groups[0]["momentum"] == 0.8
    before = model.weight.detach().clone()
    model(torch.ones(1, 3)).sum().backward()
    gradient = model.weight.grad.clone()
    sgd.step()  # the first SGD step is exactly -lr * gradient (the momentum buffer starts at the gradient)
    assert torch.allclose(model.weight.detach(), before - 0.5 * gradient)
    assert isinstance(build_optimizer(model, TrainSection()), torch.optim.AdamW)


def test_a_run_ends_at_the_first_validation_that_reaches_the_target(tiny_base_model, tmp_path):
    # Brightness above 0.5 counts as "strict": the base model's samples reach a target of 0 at once.
    config = tiny_config(tiny_base_model, tmp_path / "target", iterations=5, eval__target_accuracy=0.0)
    history = train(config, reward=BrightnessReward()).history
    assert [r["iteration"] for r in history] == [0, 1]
    assert (tmp_path / "target" / "checkpoints" / "latest").read_text() == "iter-000001"
