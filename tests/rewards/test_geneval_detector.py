"""The GenEval reward end to end on a tiny random Mask2Former and CLIP saved locally: plumbing only.

Random weights detect nothing meaningful; these tests pin that folders load, detections come back in
GenEval's class names and image pixels, colours are CLIP's ten, and metadata is required. The rules
themselves are tested on known detections in test_geneval_rules.py.
"""

import pytest
import torch
from PIL import Image

from spotlight.rewards.base import RewardContractError, RewardError, guarded_score
from spotlight.rewards.geneval.colour import CLIPColourClassifier
from spotlight.rewards.geneval.rules import COLORS, Detection
from spotlight.rewards.registry import build_reward
from spotlight.rewards.section import RewardSection

META = [{"tag": "single_object", "include": [{"class": "bench", "count": 1}]},
        {"tag": "colors", "include": [{"class": "clock", "count": 1, "color": "green"}]}]


def section(detector, clip) -> RewardSection:
    return RewardSection(name="geneval", models={"detector": str(detector), "colour_clip": str(clip)}, batch_size=2)


def test_the_full_path_scores_any_image_size_with_metadata(tiny_detector, tiny_clip):
    reward = build_reward(section(tiny_detector, tiny_clip))
    for size in (96, 160):
        images = torch.rand(2, 3, size, size, generator=torch.Generator().manual_seed(size))
        detections = reward.detector.detect(images)
        assert len(detections) == 2
        for found in detections:
            for detection in found:
                x0, y0, x1, y1 = detection.box
                assert 0 <= x0 <= x1 < size and 0 <= y0 <= y1 < size and detection.mask.shape == (size, size)
                assert detection.label in {"person", "bench", "pizza", "clock", "computer mouse", "couch", "bird",
                                           "sink"}
        out = guarded_score(reward, images, ["a photo of a bench", "a photo of a green clock"], META)
        assert out.valid.all() and ((out.rewards >= 0) & (out.rewards <= 1)).all()


def test_colours_come_from_clip_as_one_of_ten_names(tiny_clip, tiny_detector):
    reward = build_reward(section(tiny_detector, tiny_clip))
    assert isinstance(reward.colours, CLIPColourClassifier)
    image = Image.new("RGB", (64, 64), (200, 20, 20))
    objects = [Detection("clock", 0.9, (0, 0, 31, 31)), Detection("clock", 0.8, (10, 10, 60, 40))]
    colours = reward.colours.colours(image, "clock", objects)
    assert len(colours) == 2 and set(colours) <= set(COLORS)


def test_a_dataset_without_metadata_fails_in_one_line(tiny_detector, tiny_clip):
    reward = build_reward(section(tiny_detector, tiny_clip))
    with pytest.raises(RewardContractError, match="judges prompts by their metadata but none came") as error:
        guarded_score(reward, torch.rand(2, 3, 64, 64), ["a photo of a bench", "a photo of a clock"])
    assert "\n" not in str(error.value)


def test_detector_folders_that_are_missing_or_of_the_wrong_kind_fail_at_build(tmp_path, tiny_clip):
    with pytest.raises(RewardError, match="reward.models.detector .* does not exist"):
        build_reward(section(tmp_path / "missing", tiny_clip))
    with pytest.raises(RewardError, match="holds a 'clip' model, not 'mask2former'"):
        build_reward(section(tiny_clip, tiny_clip))
