"""OCR on whole images (`reward.name: ocr`): find the text anywhere in a scene, read it, compare it with the prompt's.

The pipeline is rapidocr's PP-OCRv4 detector (DB, quadrilateral boxes, so rotated text is cut out
straight) and recogniser; both ONNX weight files ship inside the `rapidocr-onnxruntime` wheel. The
detector runs once per image (its input size follows the image); the recogniser runs once per batch
on the crops of every image together, which is where batching pays.

Scored exactly as flow_grpo's `OcrScorer` scores PaddleOCR's output:

- target: the text between the prompt's first pair of double quotes (`prompt.split('"')[1]`);
- recognised: every detected line whose recognition confidence is >= 0.5 (PaddleOCR's `drop_score`,
  rapidocr's `text_score`), concatenated in reading order (top to bottom, then left to right);
- both normalised by deleting ASCII spaces (`' '` only) and lower-casing (`str.lower`);
- d = 0 if the target is a substring of the recognised text, else Levenshtein(recognised, target),
  capped at len(target); reward = 1 - d / len(target). `strict` is d == 0.

No angle classifier (flow_grpo sets `use_angle_cls=False`). The detector's settings are PaddleOCR
2.x's defaults: an image is scaled down only if its long side exceeds 960 px, box threshold 0.6,
unclip ratio 1.5, no dilation. On `device: cuda`, the ONNX sessions ask
for onnxruntime's CUDA provider, which needs `onnxruntime-gpu` in place of `onnxruntime`; without
it rapidocr warns once and runs on the CPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from spotlight.rewards.base import RewardOutput
from spotlight.rewards.ocr.reward import edit_distance

TEXT_SCORE = 0.5  # PaddleOCR's drop_score: lines read with less confidence are ignored
REC_BATCH = 64  # crops per recogniser call


def quoted_text(prompt: str) -> str:
    """The text between the prompt's first pair of double quotes; ValueError if it has none."""
    parts = prompt.split('"')
    if len(parts) < 3 or not parts[1].strip():
        raise ValueError(f"prompt {prompt[:60]!r} quotes no text; OCR prompts put the text in double quotes")
    return parts[1]


def flow_grpo_normalise(text: str) -> str:
    """flow_grpo's normalisation: ASCII spaces deleted, then `str.lower`."""
    return text.replace(" ", "").lower()


def scene_ocr_score(recognised: str, target: str) -> float:
    """1 - d / len(target), d = 0 when the target occurs in the recognised text, else the capped edit distance."""
    recognised, target = flow_grpo_normalise(recognised), flow_grpo_normalise(target)
    if not target:
        raise ValueError("the quoted text is empty after removing spaces")
    distance = 0 if target in recognised else min(edit_distance(recognised, target), len(target))
    return 1.0 - distance / len(target)


def load_engine(device: str, num_threads: int) -> Any:
    """rapidocr's engine (detector, recogniser); one-line ImportError if the package is missing."""
    try:
        from rapidocr_onnxruntime import RapidOCR
    except ImportError as error:
        raise ImportError(f"the ocr reward needs rapidocr-onnxruntime ({error}); `pip install "
                          "rapidocr-onnxruntime`") from None
    cuda = device.startswith("cuda")
    # detector settings as PaddleOCR 2.x's defaults (what flow_grpo runs), not rapidocr's: rapidocr scales
    # every image up to a 736-px short side, which costs 2x on 512-px images and 30x on 32x128 lines
    return RapidOCR(intra_op_num_threads=num_threads, inter_op_num_threads=1, rec_batch_num=REC_BATCH,
                    use_cls=False, det_use_cuda=cuda, rec_use_cuda=cuda, det_limit_side_len=960,
                    det_limit_type="max", det_box_thresh=0.6, det_unclip_ratio=1.5, det_use_dilation=False)


def to_uint8_hwc(images: torch.Tensor) -> np.ndarray:
    """Images (B, 3, H, W) in [0, 1] as uint8 (B, H, W, 3) RGB; ValueError for a wrong shape or NaN."""
    if images.dim() != 4 or images.shape[1] != 3:
        raise ValueError(f"expected images (B, 3, H, W) (got shape {tuple(images.shape)})")
    if not torch.isfinite(images).all():
        raise ValueError("got an image with NaN or infinite pixels; check the generator's output")
    return (images.detach().float().clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy()


class SceneReader:
    """Reads every text line of whole images: detection per image, recognition batched over all crops."""

    def __init__(self, device: str = "cpu", num_threads: int = 1) -> None:
        self.engine = load_engine(device, num_threads)

    def crops(self, image: np.ndarray) -> list[np.ndarray]:
        """The text lines rapidocr's detector finds in one RGB uint8 image, cut out straight, in reading order."""
        prepared, _, _ = self.engine.preprocess(image)
        prepared, _ = self.engine.maybe_add_letterbox(prepared, {})
        boxes, _ = self.engine.auto_text_det(prepared)
        return [] if boxes is None else self.engine.get_crop_img_list(prepared, boxes)

    def read(self, images: torch.Tensor) -> list[str]:
        """The confident lines of each image (B, 3, H, W) in [0, 1], concatenated in reading order."""
        pixels = to_uint8_hwc(images)
        crops_per_image = [self.crops(np.ascontiguousarray(image)) for image in pixels]
        flat = [crop for crops in crops_per_image for crop in crops]
        results, _ = self.engine.text_rec(flat) if flat else ([], 0.0)
        texts, start = [], 0
        for crops in crops_per_image:
            lines = results[start : start + len(crops)]
            start += len(crops)
            texts.append("".join(text for text, confidence, *_ in lines if float(confidence) >= TEXT_SCORE))
        return texts


class SceneOCRReward:
    """flow_grpo's OCR reward on whole images (module docstring); `strict` is an exact (or contained) match."""

    name = "ocr"

    def __init__(self, device: str = "cpu", num_threads: int = 1) -> None:
        self.reader = SceneReader(device, num_threads)

    def score(self, images: torch.Tensor, prompts: Sequence[str]) -> RewardOutput:
        targets = [quoted_text(prompt) for prompt in prompts]
        recognised = self.reader.read(images)
        pairs = zip(recognised, targets, strict=True)
        rewards = torch.tensor([scene_ocr_score(text, target) for text, target in pairs], dtype=torch.float32)
        return RewardOutput(rewards, rewards == 1.0, torch.ones(len(prompts), dtype=torch.bool))
