"""OCR on whole images (`reward.name: ocr`): find the text anywhere in a scene, read it, compare it with the prompt's.

The pipeline is rapidocr's PP-OCRv4 detector (DB, quadrilateral boxes, so rotated text is cut out
straight) and recogniser; both ONNX weight files ship inside the `rapidocr-onnxruntime` wheel. An
image is the unit of work: its detection, then one recogniser call on its crops (as flow_grpo's
PaddleOCR reads one image per call). So an image's text depends on that image alone, never on which
images share a batch or a worker, and the images of a batch are read in parallel by a pool of worker
threads, each with its own ONNX sessions (onnxruntime releases the GIL while it runs a session): on a
CPU the pool is sized from the cores this process may use, so scoring a chunk runs beside the next
chunk's sampling instead of on one thread after it (`SceneReader`).

Scored exactly as flow_grpo's `OcrScorer` scores PaddleOCR's output:

- target: the text between the prompt's first pair of double quotes (`prompt.split('"')[1]`);
- recognised: every detected line whose recognition confidence is >= 0.5 (PaddleOCR's `drop_score`,
  rapidocr's `text_score`), concatenated in reading order (top to bottom, then left to right);
- both normalised by deleting ASCII spaces (`' '` only) and lower-casing (`str.lower`);
- d = 0 if the target is a substring of the recognised text, else Levenshtein(recognised, target),
  capped at len(target); reward = 1 - d / len(target). `strict` is d == 0.

No angle classifier (flow_grpo sets `use_angle_cls=False`). The detector's settings are PaddleOCR
2.x's defaults: an image is scaled down only if its long side exceeds 960 px, box threshold 0.6,
unclip ratio 1.5, no dilation. On `device: cuda` the ONNX sessions use onnxruntime's CUDA
provider when it is installed (`onnxruntime-gpu` in place of `onnxruntime`); without it they run on
the CPU pool, which is what a CUDA trainer's spare host cores are for.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from spotlight.rewards.base import RewardOutput
from spotlight.rewards.ocr.reward import edit_distance

TEXT_SCORE = 0.5  # PaddleOCR's drop_score: lines read with less confidence are ignored
REC_BATCH = 64  # crops per recogniser call


def pool_size(workers: int | None = None) -> int:
    """Worker threads of a `SceneReader`: ``workers``, or every core this process may run on but one (the
    sampler's: a CUDA trainer's host thread launches the next chunk's kernels meanwhile), at least one."""
    if workers is not None:
        if workers < 1:
            raise ValueError(f"OCR workers must be >= 1 (got {workers})")
        return workers
    return max(1, len(os.sched_getaffinity(0)) - 1)


def cuda_provider_available() -> bool:
    """Whether onnxruntime can run a session on CUDA (`onnxruntime-gpu` installed and a GPU visible)."""
    try:
        import onnxruntime
    except ImportError:
        return False
    return "CUDAExecutionProvider" in onnxruntime.get_available_providers()


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
    cuda = device.startswith("cuda") and cuda_provider_available()
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
    """Reads every text line of whole images, one image per task, on a pool of ``workers`` threads (`pool_size`).

    Each worker thread builds its own engine on first use (ONNX sessions with ``num_threads`` intra-op
    threads each), so no session is shared between threads and an image's text is the same whichever
    worker reads it, alone or in a batch (tests/rewards/test_ocr_scene.py).
    """

    def __init__(self, device: str = "cpu", num_threads: int = 1, workers: int | None = None) -> None:
        self.device, self.num_threads, self.workers = device, num_threads, pool_size(workers)
        self.engine = load_engine(device, num_threads)  # the calling thread's; fails here if rapidocr is missing
        self._local = threading.local()
        self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="ocr") if self.workers > 1 else None

    def _engine(self) -> Any:
        """This thread's engine (built on its first image)."""
        if threading.current_thread() is threading.main_thread() or self._pool is None:
            return self.engine
        engine = getattr(self._local, "engine", None)
        if engine is None:
            engine = self._local.engine = load_engine(self.device, self.num_threads)
        return engine

    def crops(self, image: np.ndarray, engine: Any | None = None) -> list[np.ndarray]:
        """The text lines rapidocr's detector finds in one RGB uint8 image, cut out straight, in reading order."""
        engine = engine or self.engine
        prepared, _, _ = engine.preprocess(image)
        prepared, _ = engine.maybe_add_letterbox(prepared, {})
        boxes, _ = engine.auto_text_det(prepared)
        return [] if boxes is None else engine.get_crop_img_list(prepared, boxes)

    def read_one(self, image: np.ndarray) -> str:
        """The confident lines of one RGB uint8 image (H, W, 3), concatenated in reading order."""
        engine = self._engine()
        crops = self.crops(np.ascontiguousarray(image), engine)
        results, _ = engine.text_rec(crops) if crops else ([], 0.0)
        return "".join(text for text, confidence, *_ in results if float(confidence) >= TEXT_SCORE)

    def read(self, images: torch.Tensor) -> list[str]:
        """The confident lines of each image (B, 3, H, W) in [0, 1], concatenated in reading order."""
        pixels = to_uint8_hwc(images)
        if self._pool is None or len(pixels) == 1:
            return [self.read_one(image) for image in pixels]
        return list(self._pool.map(self.read_one, pixels))

    def close(self) -> None:
        """Stop the worker threads (the reward is not used after)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)


class SceneOCRReward:
    """flow_grpo's OCR reward on whole images (module docstring); `strict` is an exact (or contained) match."""

    name = "ocr"

    def __init__(self, device: str = "cpu", num_threads: int = 1, workers: int | None = None) -> None:
        self.reader = SceneReader(device, num_threads, workers)

    def score(self, images: torch.Tensor, prompts: Sequence[str]) -> RewardOutput:
        targets = [quoted_text(prompt) for prompt in prompts]
        recognised = self.reader.read(images)
        pairs = zip(recognised, targets, strict=True)
        rewards = torch.tensor([scene_ocr_score(text, target) for text, target in pairs], dtype=torch.float32)
        return RewardOutput(rewards, rewards == 1.0, torch.ones(len(prompts), dtype=torch.bool))
