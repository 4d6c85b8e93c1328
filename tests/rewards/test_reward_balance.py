"""Balancing several rewards: per-term normalisation of a weighted mix, and short runs against the new rewards.

A term whose values spread widely within a group (HPS's 100 x cosine) decides a joint normalisation of the
weighted sum whatever its weight; `reward.normalize: per_term` normalises each term within its group first.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tiny_models import save_tiny_aesthetic_predictor

from spotlight.config import TrainConfig, parse_config
from spotlight.loop.rollout import _advantages
from spotlight.rewards.base import RewardOutput
from spotlight.rewards.section import RewardSection
from spotlight.rl.advantages import group_advantages, per_term_advantages
from spotlight.trainer import train


def test_per_term_advantages_are_the_weighted_sum_of_each_terms_group_advantages():
    generator = torch.Generator().manual_seed(0)
    wide, narrow = 100 * torch.rand(3, 4, generator=generator), torch.rand(3, 4, generator=generator)
    valid = torch.ones(3, 4, dtype=torch.bool)
    valid[1, 2] = False
    mixed = per_term_advantages({"hps": wide, "ocr": narrow}, {"hps": 0.5, "ocr": 2.0}, valid)
    expected = 0.5 * group_advantages(wide, valid) + 2.0 * group_advantages(narrow, valid)
    torch.testing.assert_close(mixed, expected.clamp(-5, 5))
    assert mixed[1, 2] == 0
    joint = group_advantages(wide * 0.5 + narrow * 2.0, valid)
    # jointly, the wide term ranks the group; per term, the narrow term's weight 4x the wide one's counts
    ranks = (mixed.argsort(dim=1) == narrow.argsort(dim=1)).float().mean()
    assert ranks > (joint.argsort(dim=1) == narrow.argsort(dim=1)).float().mean()
    with pytest.raises(ValueError, match=r"missing \['ocr'\]"):
        per_term_advantages({"hps": wide}, {"hps": 1.0, "ocr": 1.0}, valid)


def test_the_rollout_normalises_per_term_only_when_asked():
    rewards = {"hps": torch.tensor([30.0, 10.0, 20.0, 25.0]), "ocr": torch.tensor([0.0, 1.0, 0.5, 0.2])}
    weights = {"hps": 1.0, "ocr": 1.0}
    total = rewards["hps"] + rewards["ocr"]
    scored = RewardOutput(total, torch.zeros(4, dtype=torch.bool), torch.ones(4, dtype=torch.bool), terms=rewards)
    valid = torch.ones(1, 4, dtype=torch.bool)
    for normalize, expected in (("joint", group_advantages(total.view(1, 4), valid)),
                                ("per_term", per_term_advantages({k: v.view(1, 4) for k, v in rewards.items()},
                                                                 weights, valid))):
        config = parse_config(TrainConfig, {"reward": {"weights": weights, "normalize": normalize}})
        torch.testing.assert_close(_advantages(scored, total.view(1, 4), valid, config), expected)
    with pytest.raises(ValueError, match="reward.normalize per_term normalises each term of reward.weights"):
        RewardSection(name="hps", normalize="per_term")


def _run(run_dir: Path, base: Path, reward: dict) -> list[dict]:
    config = parse_config(TrainConfig, {
        "mode": "vanilla", "task": "shapes", "base_checkpoint": str(base), "run_dir": str(run_dir), "iterations": 2,
        "num_threads": 1, "checkpoint_every": 2, "reward": reward,
        "rollout": {"prompts_per_iteration": 2, "group_size": 3, "num_steps": 2},
        "train": {"num_minibatches": 1, "num_epochs": 1},
        "eval": {"every": 2, "seeds_per_prompt": 1, "num_steps": 2, "grid_prompts": 2, "raw_model": False,
                 "prompts": 2}})
    summary = train(config)
    return [json.loads(line) for line in (summary.run_dir / "metrics.jsonl").read_text().splitlines()]


def test_runs_train_against_hps_and_a_per_term_mix_of_hps_and_aesthetic(tiny_base_model, tiny_hps, tiny_clip,
                                                                         tmp_path):
    checkpoint, tokenizer, _ = tiny_hps
    predictor = save_tiny_aesthetic_predictor(tmp_path / "sac+logos+ava1-l14-linearMSE.pth", 16)
    models = {"hps": str(checkpoint), "hps_processor": str(tokenizer), "clip": str(tiny_clip),
              "aesthetic": str(predictor)}
    alone = _run(tmp_path / "hps", tiny_base_model, {"name": "hps", "models": models})
    trained = [record for record in alone if "rollout/reward_mean" in record]
    assert len(trained) == 2 and all(abs(record["rollout/reward_mean"]) < 100 for record in trained)
    mixed = _run(tmp_path / "mix", tiny_base_model, {"weights": {"hps": 1.0, "aesthetic": 0.5},
                                                     "normalize": "per_term", "models": models})
    trained = [record for record in mixed if "rollout/reward_mean" in record]
    assert len(trained) == 2
    for record in trained:
        expected = record["rollout/reward/hps"] + 0.5 * record["rollout/reward/aesthetic"]
        assert record["rollout/reward_mean"] == pytest.approx(expected, abs=1e-4)


def test_a_run_trains_against_a_per_term_mix_of_imagereward_and_the_vlm_judge(tiny_base_model, tiny_imagereward,
                                                                              tiny_qwen_vl, tmp_path):
    checkpoint, tokenizer, _ = tiny_imagereward
    models = {"imagereward": str(checkpoint), "imagereward_tokenizer": str(tokenizer), "vlm_judge": str(tiny_qwen_vl)}
    records = _run(tmp_path / "judged", tiny_base_model, {
        "weights": {"imagereward": 1.0, "vlm-judge": 2.0}, "normalize": "per_term", "models": models,
        "judge_question": "Does this image show {prompt} ? Answer yes or no ."})
    trained = [record for record in records if "rollout/reward_mean" in record]
    assert len(trained) == 2
    for record in trained:
        assert 0 <= record["rollout/reward/vlm-judge"] <= 1
        expected = record["rollout/reward/imagereward"] + 2.0 * record["rollout/reward/vlm-judge"]
        assert record["rollout/reward_mean"] == pytest.approx(expected, abs=1e-4)
