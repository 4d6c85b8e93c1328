"""The toy tasks (`task: shapes | ocr` in the configs): presets of a prompt dataset, a reward and a policy.

A run names three separate parts: a prompt dataset (``data.dataset``), a reward (``reward.name``) and a
policy (``model`` / ``base_checkpoint``). A task is the preset of all three for one of the toy
experiments, the one a run falls back to for any part it does not name: its prompts and fixed split
(`Task.dataset`), its reward (`Task.make_reward`) and its base model (`Task.base_model`, made by
``spotlight pretrain``). It also keeps what only the toy TinyDiT needs: its word tokenizer (and so the
model's vocabulary) and the renderer of pre-training data with its image geometry. The loop, the
sampler and the updates are the same for a preset and for a real pipeline with a user's dataset.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from spotlight.data.prompt_dataset import PromptDataset
from spotlight.rewards.base import Reward
from spotlight.tasks import TaskName, render, shapes, text, text_render


@dataclass(frozen=True)
class Task:
    """One task's parts.

    image_size: (height, width) of its images, the pre-training default of the model geometry.
    render_batch(prompts, seed, height, width, lattice): images (B, 3, H, W) in [-1, 1].
    pretrain_prompts(generator, count): prompts to pre-train the base model on.
    make_reward(strict_weight): the training / validation reward (strict_weight only for shapes).
    base_model: the shipped base model (``spotlight/assets``) a TinyDiT run of this task starts from.
    """

    name: str
    vocab_size: int
    image_size: tuple[int, int]
    split: Callable[[], tuple[list[str], list[str]]]
    tokenize: Callable[[Sequence[str], int], torch.Tensor]
    kind_of: Callable[[str], str]
    pretrain_prompts: Callable[[torch.Generator, int], list[str]]
    render_batch: Callable[[Sequence[str], int, int, int, int | None], torch.Tensor]
    make_reward: Callable[[float], Reward]
    base_model: str

    def dataset(self) -> PromptDataset:
        """The task's prompts as a dataset: train / validation split, each prompt's kind (no metadata)."""
        train, test = self.split()
        return PromptDataset(name=f"task {self.name}", train=list(train), test=list(test),
                             kinds={prompt: self.kind_of(prompt) for prompt in {*train, *test}})


def _shapes_reward(strict_weight: float) -> Reward:
    from spotlight.rewards.geneval.reward import GenEvalReward

    return GenEvalReward(strict_weight)


def _ocr_reward(strict_weight: float) -> Reward:
    from spotlight.rewards.ocr.reward import OCRReward  # imports onnxruntime: only when the OCR task runs

    del strict_weight  # the OCR reward is already graded (1 - normalised edit distance)
    return OCRReward()


TASKS: dict[TaskName, Task] = {
    "shapes": Task(
        name="shapes", vocab_size=len(shapes.VOCAB), image_size=(32, 32), split=shapes.train_val_split,
        tokenize=shapes.tokenize, kind_of=lambda prompt: shapes.parse_prompt(prompt).kind,
        pretrain_prompts=shapes.sample_prompts,
        render_batch=lambda prompts, seed, height, width, lattice: render.render_batch(prompts, seed, height, lattice),
        make_reward=_shapes_reward, base_model="shapes-base",
    ),
    "ocr": Task(
        name="ocr", vocab_size=len(text.VOCAB), image_size=(text_render.HEIGHT, text_render.WIDTH),
        split=text.train_val_split, tokenize=text.tokenize, kind_of=text.kind_of,
        pretrain_prompts=text.random_prompts,
        render_batch=lambda prompts, seed, height, width, lattice: text_render.render_batch(prompts, seed, height,
                                                                                            width),
        make_reward=_ocr_reward, base_model="ocr-base",
    ),
}


def get_task(name: str) -> Task:
    """The task called `name`; ValueError naming the known tasks otherwise."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; use one of {list(TASKS)}")
    return TASKS[name]


def task_of(model: torch.nn.Module) -> Task:
    """The task whose tokenizer a policy was trained with: every policy's config names it (``config.task``)."""
    return get_task(model.config.task)
