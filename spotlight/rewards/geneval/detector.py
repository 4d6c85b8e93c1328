"""`reward.name: geneval`: GenEval's rules over a real detector and CLIP colours, driven by prompt metadata.

Each image is judged against its prompt's GenEval record (`geneval_rules`): the detector finds
objects, `kept_objects` applies GenEval's thresholds, CLIP names colours where a clause asks for one,
and `judge` returns GenEval's correct flag (`strict`) and the share of clauses met. The reward mixes
them like the shapes reward: strict_weight x correct + (1 - strict_weight) x share.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from PIL import Image

from spotlight.rewards.base import Metadata, RewardOutput
from spotlight.rewards.geneval.colour import CLIPColourClassifier
from spotlight.rewards.geneval.detection import Detector, detections_in, load_detector
from spotlight.rewards.geneval.rules import check_metadata, judge, kept_objects
from spotlight.rewards.section import RewardModelsSection


class GenEvalDetectorReward:
    """GenEval over `detector` and `colours`; `score` needs one GenEval metadata record per prompt."""

    name = "geneval"
    uses_metadata = True

    def __init__(self, detector: Detector, colours: CLIPColourClassifier, strict_weight: float = 0.5,
                 batch_size: int = 8) -> None:
        self.detector = detector
        self.colours = colours
        self.strict_weight = strict_weight
        self.batch_size = batch_size

    def score(self, images: torch.Tensor, prompts: Sequence[str], metadata: Sequence[Metadata]) -> RewardOutput:
        for record in metadata:
            check_metadata(record)
        detections = detections_in(images, self.detector, self.batch_size)
        pixels = (images.detach().float().clamp(0, 1) * 255).round().byte().permute(0, 2, 3, 1).cpu().numpy()
        rewards, strict = [], []
        for image, found, record in zip(pixels, detections, metadata, strict=True):
            pil = Image.fromarray(image)
            verdict = judge(record, kept_objects(found, record["tag"]),
                            lambda name, objects, pil=pil: self.colours.colours(pil, name, objects))
            rewards.append(self.strict_weight * verdict.correct + (1 - self.strict_weight) * verdict.partial)
            strict.append(verdict.correct)
        return RewardOutput(torch.tensor(rewards, dtype=torch.float32), torch.tensor(strict, dtype=torch.bool),
                            torch.ones(len(prompts), dtype=torch.bool))


def load_geneval_reward(models: RewardModelsSection, device: str, batch_size: int,
                        strict_weight: float = 0.5) -> GenEvalDetectorReward:
    """The detector (reward.models.detector / detector_class) and colour CLIP (reward.models.colour_clip)."""
    from spotlight.rewards.clip_embed import load_clip

    detector = load_detector(models.detector, models.detector_class, device)
    clip = load_clip(models.colour_clip, "reward.models.colour_clip", "openai/clip-vit-large-patch14", device)
    return GenEvalDetectorReward(detector, CLIPColourClassifier(clip), strict_weight, batch_size)
