"""Object detectors for the GenEval reward: one protocol, transformers' Mask2Former, or a class the user names.

GenEval's own detector is mmdetection's Mask2Former (Swin-S, COCO instance segmentation); its
transformers counterpart, `Mask2FormerForUniversalSegmentation`, decodes queries the same way (every
(query, class) pair scored by class probability x mean mask probability, the top `num_queries`
kept, each with its own mask, so instances may overlap) and is what this module runs. Boxes are the
masks' bounding boxes, as mmdetection computes them for Mask2Former. docs/rewards.md says which
checkpoint comes closest to the official numbers.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import torch

from spotlight.rewards.geneval.rules import Detection
from spotlight.rewards.model_folder import check_model_folder

# COCO names in other spellings (detectron2 / torchvision / Pascal) -> GenEval's object_names.txt
GENEVAL_NAMES = {"mouse": "computer mouse", "remote": "tv remote", "keyboard": "computer keyboard",
                 "motorbike": "motorcycle", "aeroplane": "airplane", "sofa": "couch", "pottedplant": "potted plant",
                 "diningtable": "dining table", "tvmonitor": "tv", "hair dryer": "hair drier"}


class Detector(Protocol):
    """Detects objects in images (B, 3, H, W) in [0, 1]: one list of Detections per image, in pixels of H x W."""

    def detect(self, images: torch.Tensor) -> list[list[Detection]]: ...


def box_of(mask: np.ndarray) -> tuple[float, float, float, float]:
    """The (x0, y0, x1, y1) bounding box of a bool mask's True pixels (x1, y1 inclusive, like mmdetection)."""
    rows, cols = np.nonzero(mask)
    return float(cols.min()), float(rows.min()), float(cols.max()), float(rows.max())


class Mask2FormerDetector:
    """transformers' Mask2Former instance segmentation, loaded from a local folder (model + image processor)."""

    def __init__(self, model: torch.nn.Module, processor: object, device: str = "cpu") -> None:
        self.model = model.to(device).eval()
        self.processor = processor
        self.device = device
        labels = model.config.id2label
        self.labels = [GENEVAL_NAMES.get(labels[i], labels[i]) for i in range(len(labels))]

    @classmethod
    def from_pretrained(cls, folder: str | None, device: str = "cpu") -> Mask2FormerDetector:
        """The detector in `folder`; RewardError in one line if it is missing or not a Mask2Former."""
        path = check_model_folder(folder, "reward.models.detector", ("mask2former",),
                                  "facebook/mask2former-swin-small-coco-instance")  # before transformers: seconds
        from transformers import AutoImageProcessor, Mask2FormerForUniversalSegmentation

        return cls(Mask2FormerForUniversalSegmentation.from_pretrained(path),
                   AutoImageProcessor.from_pretrained(path), device)

    @torch.no_grad()
    def detect(self, images: torch.Tensor) -> list[list[Detection]]:
        height, width = images.shape[2:]
        pixels = [image.permute(1, 2, 0).mul(255).round().byte().cpu().numpy() for image in images]
        inputs = self.processor(images=pixels, return_tensors="pt").to(self.device)
        outputs = self.model(**inputs)
        results = self.processor.post_process_instance_segmentation(
            outputs, threshold=0.0, target_sizes=[(height, width)] * len(pixels), return_binary_maps=True)
        detections = []
        for result in results:
            masks = result["segmentation"]
            found = []
            if masks is not None and result["segments_info"]:
                masks = masks.bool().cpu().numpy()
                for index, segment in enumerate(result["segments_info"]):
                    mask = masks[index]
                    if mask.any():
                        found.append(Detection(self.labels[segment["label_id"]], float(segment["score"]),
                                               box_of(mask), mask))
            detections.append(found)
        return detections


def load_detector(folder: str | None, class_path: str | None, device: str) -> Detector:
    """Mask2Former from `folder`, or `class_path`'s `from_pretrained(folder, device)` (a user's detector class)."""
    if class_path is None:
        return Mask2FormerDetector.from_pretrained(folder, device)
    from spotlight.rewards.function import load_object

    detector_class = load_object(class_path, "reward.models.detector_class")
    return detector_class.from_pretrained(folder, device)


def detections_in(images: torch.Tensor, detector: Detector, batch_size: int) -> list[list[Detection]]:
    """`detector.detect` over `images` in chunks of `batch_size` (the memory of one forward pass)."""
    found: list[list[Detection]] = []
    for start in range(0, images.shape[0], batch_size):
        found += detector.detect(images[start : start + batch_size])
    return found


