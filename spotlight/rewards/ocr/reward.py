"""The OCR reward of the text-rendering task: read the image with PP-OCRv4, compare with the prompt's text.

Scored as Flow-GRPO does: 1 - min(d, n) / n, where d is the Levenshtein distance between the
recognised and the asked-for text and n the asked-for length, both with spaces removed and case
folded. The recogniser is PP-OCRv4 from `rapidocr-onnxruntime`, whose wheel carries the ONNX weights,
so scoring works offline. Only the recogniser runs: every image of the task is already one text line,
and the detector is unreliable on 32-px-high images (it finds nothing or splits the line), so it
would add failures without adding information.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import Any

import numpy as np
import torch

from spotlight.rewards.base import RewardOutput
from spotlight.tasks.text import target_text

REC_BATCH = 64  # lines per ONNX call: all lines of the task have one width, so padding wastes nothing
MIN_LINE_HEIGHT = 48  # the recogniser's input height; smaller lines are upscaled to it first


def normalise(text: str) -> str:
    """Case-folded text without whitespace: what the comparison sees."""
    return "".join(text.split()).casefold()


def edit_distance(a: str, b: str) -> int:
    """Levenshtein distance (insertions, deletions, substitutions each cost 1)."""
    previous = list(range(len(b) + 1))
    for i, char_a in enumerate(a, start=1):
        current = [i]
        for j, char_b in enumerate(b, start=1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (char_a != char_b)))
        previous = current
    return previous[-1]


def ocr_score(recognised: str, target: str) -> float:
    """1 - min(d, n) / n for the normalised texts (n = len(target)); 1 is an exact match, 0 nothing shared."""
    recognised, target = normalise(recognised), normalise(target)
    if not target:
        raise ValueError("the asked-for text is empty; OCR prompts ask for 3-8 characters")
    distance = min(edit_distance(recognised, target), len(target))
    return 1.0 - distance / len(target)


@cache
def _recogniser(num_threads: int) -> Any:
    """PP-OCRv4's text-line recogniser, loaded once per process (~11 MB of ONNX weights)."""
    try:
        from rapidocr_onnxruntime import RapidOCR
    except ImportError as error:
        raise ImportError(
            f"the OCR reward needs rapidocr-onnxruntime ({error}); install it with `pip install rapidocr-onnxruntime`"
        ) from None
    engine = RapidOCR(intra_op_num_threads=num_threads, inter_op_num_threads=1, rec_batch_num=REC_BATCH)
    return engine.text_rec


def _as_lines(images: torch.Tensor) -> list[np.ndarray]:
    """Images (B, 3, H, W) in [0, 1] as uint8 HWC lines, upscaled to at least MIN_LINE_HEIGHT px high."""
    import cv2

    if images.dim() != 4 or images.shape[1] != 3:
        raise ValueError(f"expected images (B, 3, H, W) (got shape {tuple(images.shape)})")
    if not torch.isfinite(images).all():
        raise ValueError("got an image with NaN or infinite pixels; check the generator's output")
    pixels = (images.detach().float().clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy()
    height, width = pixels.shape[1:3]
    if height >= MIN_LINE_HEIGHT:
        return list(pixels)
    scale = MIN_LINE_HEIGHT / height
    size = (round(width * scale), MIN_LINE_HEIGHT)
    return [cv2.resize(line, size, interpolation=cv2.INTER_CUBIC) for line in pixels]


def recognise(images: torch.Tensor, num_threads: int = 1) -> list[str]:
    """The text PP-OCRv4 reads in each image (B, 3, H, W) in [0, 1], one line per image."""
    results, _ = _recogniser(num_threads)(_as_lines(images))
    return [text for text, _confidence in results]


class OCRReward:
    """Flow-GRPO's OCR reward; `strict` is an exact match of the normalised texts."""

    name = "ocr"

    def __init__(self, num_threads: int = 1) -> None:
        self.num_threads = num_threads

    def score(self, images: torch.Tensor, prompts: Sequence[str]) -> RewardOutput:
        targets = [target_text(prompt) for prompt in prompts]
        recognised = recognise(images, self.num_threads)
        rewards = torch.tensor([ocr_score(text, target) for text, target in zip(recognised, targets, strict=True)],
                               dtype=torch.float32)
        strict = torch.tensor([normalise(text) == normalise(target)
                               for text, target in zip(recognised, targets, strict=True)], dtype=torch.bool)
        return RewardOutput(rewards, strict, torch.ones(len(prompts), dtype=torch.bool))
