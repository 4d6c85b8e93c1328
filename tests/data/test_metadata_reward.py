"""A dataset's metadata reaches a metadata reward through the loop; validation reports what the reward defines."""

from __future__ import annotations

import json
import pickle
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from spotlight.config import TrainConfig, parse_config
from spotlight.data import DatasetError, PromptDataset
from spotlight.data.metadata_reward import bind_metadata
from spotlight.rewards.base import RewardOutput, guarded_score
from spotlight.rewards.geneval.reward import GenEvalReward
from spotlight.task_presets import get_task
from spotlight.trainer import Trainer


class BrightnessByRecord:
    """Mean brightness scaled by each prompt's record's ``weight``: a reward that needs the metadata to score."""

    name = "brightness-by-record"
    uses_metadata = True
    requires_metadata = True
    has_strict = False

    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, Any]]] = []

    def score(self, images: torch.Tensor, prompts: Sequence[str],
              metadata: Sequence[Mapping[str, Any]]) -> RewardOutput:
        self.seen += [(prompt, dict(record)) for prompt, record in zip(prompts, metadata, strict=True)]
        weights = torch.tensor([float(record["weight"]) for record in metadata])
        rewards = images.mean(dim=(1, 2, 3)) * weights
        return RewardOutput(rewards, torch.zeros(len(prompts), dtype=torch.bool),
                            torch.ones(len(prompts), dtype=torch.bool))


def metadata_dataset() -> PromptDataset:
    train, test = get_task("shapes").split()
    records = {prompt: {"prompt": prompt, "tag": f"kind{i % 2}", "weight": 1.0 + i}
               for i, prompt in enumerate([*train[:4], *test[:2]])}
    return PromptDataset(name="records", train=list(train[:4]), test=list(test[:2]), metadata=records,
                         kinds={prompt: record["tag"] for prompt, record in records.items()})


def test_a_reward_without_metadata_is_left_as_it_is() -> None:
    reward = GenEvalReward(0.5)
    assert bind_metadata(reward, metadata_dataset()) is reward


def test_a_metadata_reward_gets_each_prompts_record_and_survives_pickling() -> None:
    dataset = metadata_dataset()
    bound = bind_metadata(BrightnessByRecord(), dataset)
    images = torch.full((2, 3, 4, 4), 0.5)
    prompts = [dataset.train[1], dataset.test[0]]
    out = guarded_score(bound, images, prompts)
    assert torch.allclose(out.rewards, torch.tensor([0.5 * 2.0, 0.5 * 5.0]))
    assert bound.has_strict is False  # the reward's own attributes show through
    again = pickle.loads(pickle.dumps(bound))  # what a Ray device receives
    assert torch.equal(guarded_score(again, images, prompts).rewards, out.rewards)


def test_a_reward_that_needs_metadata_refuses_a_dataset_without_it() -> None:
    plain = PromptDataset(name="plain.txt folder", train=["a"], test=["b"])
    with pytest.raises(DatasetError, match="has none: use a dataset folder with train_metadata.jsonl"):
        bind_metadata(BrightnessByRecord(), plain)


def test_the_loop_trains_on_the_datasets_prompts_and_its_reward_reads_their_records(
        tiny_base_model: Path, tmp_path: Path) -> None:
    dataset = metadata_dataset()
    folder = tmp_path / "prompts"
    folder.mkdir()
    for split, prompts in (("train", dataset.train), ("test", dataset.test)):
        (folder / f"{split}_metadata.jsonl").write_text(
            "".join(json.dumps(dataset.metadata[prompt]) + "\n" for prompt in prompts))
    config = parse_config(TrainConfig, {
        "mode": "vanilla", "base_checkpoint": str(tiny_base_model), "run_dir": str(tmp_path / "run"),
        "iterations": 1, "num_threads": 1, "data": {"dataset": str(folder)},
        "rollout": {"prompts_per_iteration": 2, "group_size": 2, "num_steps": 2},
        "train": {"num_minibatches": 1, "num_epochs": 1, "ema_decay": None},
        "eval": {"every": 1, "seeds_per_prompt": 1, "num_steps": 2, "grid_prompts": 2, "raw_model": False},
    })
    reward = BrightnessByRecord()
    summary = Trainer(config, reward=reward).run()
    assert {prompt for prompt, _ in reward.seen} <= set(dataset.train) | set(dataset.test)
    assert all(record == dataset.metadata[prompt] for prompt, record in reward.seen)
    rollout_prompts = {prompt for prompt, _ in reward.seen[len(dataset.test):len(dataset.test) + 4]}
    assert rollout_prompts <= set(dataset.train)  # validation first (test split), then the rollout (train split)
    final = summary.history[-1]
    assert {"val/reward_kind0", "val/reward_kind1"} <= final.keys()  # per kind: the reward's mean (no strict flag)
    assert (tmp_path / "run" / "checkpoints" / "best" / "model.json").is_file()
