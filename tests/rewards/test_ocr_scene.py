"""The whole-image OCR reward: flow_grpo's scoring rule, and real PP-OCRv4 on rendered 512x512 scenes."""

import os

import pytest
import torch

from spotlight.rewards.base import guarded_score
from spotlight.rewards.ocr.scene import SceneOCRReward, pool_size, quoted_text, scene_ocr_score, to_uint8_hwc
from spotlight.rewards.ocr.scenes import SIZE, render_scene


def test_the_target_is_the_text_between_the_first_pair_of_double_quotes():
    assert quoted_text('a sign that says "Hello World" and "other"') == "Hello World"
    with pytest.raises(ValueError, match="quotes no text"):
        quoted_text("a sign with no quoted text")


def test_score_ignores_spaces_and_case_and_is_one_minus_distance_over_length():
    assert scene_ocr_score("HELLO world", "hello world") == 1.0
    assert scene_ocr_score("helo", "hello") == pytest.approx(1 - 1 / 5)  # one deletion
    assert scene_ocr_score("hxllo", "hello") == pytest.approx(1 - 1 / 5)  # one substitution


def test_a_target_contained_in_more_text_scores_one_as_in_flow_grpo():
    assert scene_ocr_score("EXIT  hello  OPEN 24H", "hello") == 1.0


def test_the_distance_is_capped_at_the_target_length():
    assert scene_ocr_score("a" * 40, "cat") == 0.0  # distance 39, capped at 3
    assert scene_ocr_score("", "cat") == 0.0


@pytest.fixture(scope="module")
def reward():
    return SceneOCRReward(num_threads=1)


def test_real_ocr_reads_right_scenes_and_rejects_wrong_ones_in_one_batch(reward):
    scenes = [render_scene(seed, correct=seed % 2 == 0) for seed in range(4)]
    images = torch.stack([scene.image for scene in scenes])
    assert images.shape == (4, 3, SIZE, SIZE)
    out = guarded_score(reward, images, [scene.prompt for scene in scenes])
    assert out.valid.all()
    right, wrong = out.rewards[0::2], out.rewards[1::2]
    assert right.min() >= 0.9, (right, [s.painted for s in scenes])
    assert wrong.max() < 0.5, (wrong, [s.painted for s in scenes])
    assert out.strict.tolist() == [True, False, True, False]
    alone = [reward.reader.read(images[i : i + 1])[0] for i in range(4)]
    assert reward.reader.read(images) == alone  # batching the recogniser over images changes nothing


def test_a_prompt_without_quotes_marks_only_its_sample_invalid(reward):
    scene = render_scene(0)
    out = guarded_score(reward, torch.stack([scene.image, scene.image]), [scene.prompt, "no quotes here"])
    assert out.valid.tolist() == [True, False]
    assert "quotes no text" in out.errors[0]


def test_a_pool_of_ocr_threads_scores_exactly_as_one_thread_in_sequence(reward):
    scenes = [render_scene(seed, correct=seed % 3 != 0) for seed in range(6)]
    images = torch.stack([scene.image for scene in scenes])
    prompts = [scene.prompt for scene in scenes]
    pooled = SceneOCRReward(num_threads=1, workers=3)
    try:
        assert pooled.reader.workers == 3 and reward.reader.workers >= 1
        sequential = [reward.reader.read_one(image) for image in to_uint8_hwc(images)]
        assert pooled.reader.read(images) == sequential
        one_thread = guarded_score(reward, images, prompts)
        assert torch.equal(guarded_score(pooled, images, prompts).rewards, one_thread.rewards)
    finally:
        pooled.reader.close()


def test_the_pool_is_sized_from_this_process_cores_less_the_samplers():
    assert pool_size(4) == 4
    assert pool_size() == max(1, len(os.sched_getaffinity(0)) - 1)
    with pytest.raises(ValueError, match="workers must be >= 1"):
        pool_size(0)
