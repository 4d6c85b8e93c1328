"""The tasks a run can choose (`task: shapes | ocr` in the configs), each as one record of its parts.

A task is what changes between the compositional and the text-rendering experiments: the prompts and
their split, the tokenizer (and so the model's vocabulary), the renderer of pre-training data with
its image geometry, and the reward. The loop, the sampler and GRPO are the same for both; they reach
the task only through a `Task`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from spotlight.rewards.base import Reward
from spotlight.tasks import TaskName, render, shapes, text, text_render


@dataclass(frozen=True)
class Task:
    """One task's parts.

    image_size: (height, width) of its images, the pre-training default of the model geometry.
    render_batch(prompts, seed, height, width, lattice): images (B, 3, H, W) in [-1, 1].
    pretrain_prompts(generator, count): prompts to pre-train the base model on.
    make_reward(strict_weight): the training / validation reward (strict_weight only for shapes).
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


def _shapes_reward(strict_weight: float) -> Reward:
    from spotlight.rewards.geneval import GenEvalReward

    return GenEvalReward(strict_weight)


def _ocr_reward(strict_weight: float) -> Reward:
    from spotlight.rewards.ocr import OCRReward  # imports onnxruntime: only when the OCR task runs

    del strict_weight  # the OCR reward is already graded (1 - normalised edit distance)
    return OCRReward()


TASKS: dict[TaskName, Task] = {
    "shapes": Task(
        name="shapes", vocab_size=len(shapes.VOCAB), image_size=(32, 32), split=shapes.train_val_split,
        tokenize=shapes.tokenize, kind_of=lambda prompt: shapes.parse_prompt(prompt).kind,
        pretrain_prompts=shapes.sample_prompts,
        render_batch=lambda prompts, seed, height, width, lattice: render.render_batch(prompts, seed, height, lattice),
        make_reward=_shapes_reward,
    ),
    "ocr": Task(
        name="ocr", vocab_size=len(text.VOCAB), image_size=(text_render.HEIGHT, text_render.WIDTH),
        split=text.train_val_split, tokenize=text.tokenize, kind_of=text.kind_of,
        pretrain_prompts=text.random_prompts,
        render_batch=lambda prompts, seed, height, width, lattice: text_render.render_batch(prompts, seed, height,
                                                                                            width),
        make_reward=_ocr_reward,
    ),
}


def get_task(name: str) -> Task:
    """The task called `name`; ValueError naming the known tasks otherwise."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; use one of {list(TASKS)}")
    return TASKS[name]


def task_of(model: torch.nn.Module) -> Task:
    """The task whose tokenizer a model was trained with (TinyDiT records it in its config; default shapes)."""
    return get_task(getattr(getattr(model, "config", None), "task", "shapes"))
