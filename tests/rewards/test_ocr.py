"""The OCR reward with the real PP-OCRv4 recogniser (the model ships in the rapidocr wheel)."""

import pytest
import torch

from spotlight.rewards.base import guarded_score
from spotlight.rewards.ocr.reward import OCRReward, edit_distance, ocr_score
from spotlight.tasks.text_render import HEIGHT, WIDTH, render_batch

PROMPTS = ['the word "garden"', 'the number "48213"', 'the word "sky"', 'the word "airplane"',
           'the number "90817263"']


def unit(images: torch.Tensor) -> torch.Tensor:
    return (images + 1) / 2


@pytest.fixture(scope="module")
def reward() -> OCRReward:
    return OCRReward()


@pytest.mark.parametrize(("a", "b", "distance"), [("kitten", "sitting", 3), ("", "abc", 3), ("abc", "abc", 0),
                                                  ("flaw", "lawn", 2), ("ab", "ba", 2)])
def test_edit_distance_matches_hand_counts(a: str, b: str, distance: int) -> None:
    assert edit_distance(a, b) == distance == edit_distance(b, a)


def test_score_is_one_minus_normalised_distance_with_spaces_and_case_ignored() -> None:
    assert ocr_score("G ar DEN", "garden") == 1.0
    assert ocr_score("gardn", "garden") == pytest.approx(1 - 1 / 6)
    assert ocr_score("completely different", "sky") == 0.0  # distance clipped at the target length
    assert ocr_score("", "sky") == 0.0


def test_rendered_text_scores_near_one(reward: OCRReward) -> None:
    out = reward.score(unit(render_batch(PROMPTS)), PROMPTS)
    assert out.valid.all()
    assert out.rewards.mean() >= 0.95
    assert out.strict.float().mean() >= 0.8


def test_noise_and_blank_images_score_near_zero(reward: OCRReward) -> None:
    generator = torch.Generator().manual_seed(0)
    noise = torch.rand((len(PROMPTS), 3, HEIGHT, WIDTH), generator=generator)
    assert reward.score(noise, PROMPTS).rewards.mean() < 0.1
    assert reward.score(torch.ones_like(noise), PROMPTS).rewards.mean() < 0.1


def test_an_image_of_other_text_scores_low(reward: OCRReward) -> None:
    images = unit(render_batch(PROMPTS))
    shuffled = PROMPTS[1:] + PROMPTS[:1]
    assert reward.score(images, shuffled).rewards.mean() < 0.3


def test_a_nan_image_marks_only_itself(reward: OCRReward) -> None:
    images = unit(render_batch(PROMPTS[:2]))
    images[1, :, 0, 0] = float("nan")
    out = guarded_score(reward, images, PROMPTS[:2])
    assert out.valid.tolist() == [True, False]
    assert out.rewards[0] > 0.9
