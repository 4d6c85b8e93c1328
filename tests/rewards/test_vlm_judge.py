"""The VLM judge on a tiny random Qwen2.5-VL saved locally: P("yes") from one batched forward.

The expected probability is computed here directly with transformers: each image alone through the Qwen2-VL
image processor (PIL backend), the prompt's question through the chat template, the model's forward, and the
softmax over the yes/no tokens at the last position. The reward scores the batch at once, right-padded, with
its own on-device patches, so padding, batching or patch order going wrong fails the comparison.
"""

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer, Qwen2_5_VLForConditionalGeneration
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from spotlight.rewards.base import RewardError, guarded_score
from spotlight.rewards.models.cache import forget_all
from spotlight.rewards.models.vlm_judge import MAX_PIXELS, MIN_PIXELS, VLMJudgeReward, qwen_patches
from spotlight.rewards.registry import build_reward
from spotlight.rewards.section import RewardSection

QUESTION = "Does this image show {prompt} ? Answer yes or no ."


def processor() -> Qwen2VLImageProcessorPil:
    return Qwen2VLImageProcessorPil(min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS)


def quantised_images(count: int, height: int, width: int, seed: int) -> torch.Tensor:
    """Images of whole uint8 levels, so the PIL processor (uint8 in) and the reward (floats) see the same pixels."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (count, 3, height, width), generator=generator).float() / 255


@torch.no_grad()
def p_yes_directly(folder, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    yes = [tokenizer.convert_tokens_to_ids(word) for word in ("yes", "Yes")]
    no = [tokenizer.convert_tokens_to_ids(word) for word in ("no", "No")]
    out = []
    for image, prompt in zip(images, prompts, strict=True):
        pixels = (image * 255).round().byte().permute(1, 2, 0).numpy()
        inputs = processor()(images=[pixels], return_tensors="pt")
        count = int(inputs["image_grid_thw"][0].prod()) // 4
        message = [{"role": "user", "content": [{"type": "image"}, {"type": "text",
                                                                   "text": QUESTION.format(prompt=prompt)}]}]
        text = tokenizer.apply_chat_template(message, tokenize=False, add_generation_prompt=True)
        ids = tokenizer(text.replace("<|image_pad|>", "<|image_pad|>" * count), return_tensors="pt")["input_ids"]
        logits = model(input_ids=ids, pixel_values=inputs["pixel_values"],
                       image_grid_thw=inputs["image_grid_thw"]).logits
        out.append(logits[0, -1, yes + no].softmax(-1)[:2].sum())
    return torch.stack(out)


def test_patches_on_the_device_match_the_qwen2_vl_image_processor():
    images = quantised_images(2, 56, 84, seed=0)
    pixels, grid = qwen_patches(images)
    reference = processor()(images=[(i * 255).round().byte().permute(1, 2, 0).numpy() for i in images],
                            return_tensors="pt")
    torch.testing.assert_close(grid, reference["image_grid_thw"])
    torch.testing.assert_close(pixels, reference["pixel_values"], atol=1e-5, rtol=1e-5)


def test_vlm_judge_is_the_yes_probability_of_one_batched_forward(tiny_qwen_vl):
    forget_all()
    reward = build_reward(RewardSection(name="vlm-judge", judge_question=QUESTION, batch_size=4,
                                        models={"vlm_judge": str(tiny_qwen_vl)}))
    images = quantised_images(3, 56, 56, seed=1)
    prompts = ["a red clock", "a photo of the green cat on a bench", "dog"]  # three lengths: right padding
    out = guarded_score(reward, images, prompts)
    expected = p_yes_directly(tiny_qwen_vl, images, prompts)
    assert out.valid.all() and expected.std() > 0.01
    torch.testing.assert_close(out.rewards, expected, atol=1e-4, rtol=1e-4)
    assert torch.equal(out.strict, out.rewards > 0.5)


def test_a_wrong_vlm_judge_folder_or_question_fails_in_one_line(tiny_clip, tmp_path):
    with pytest.raises(RewardError, match=r"reward.models.vlm_judge .*holds a 'clip' model, not 'qwen2_5_vl'"):
        VLMJudgeReward.from_folder(str(tiny_clip))
    with pytest.raises(RewardError, match=r"reward.models.vlm_judge .*does not exist"):
        VLMJudgeReward.from_folder(str(tmp_path / "nowhere"))
    with pytest.raises(ValueError, match=r"reward.judge_question .* has no \{prompt\}"):
        RewardSection(name="vlm-judge", judge_question="Is it good?")


def test_images_are_resized_within_qwens_pixel_budget():
    pixels, grid = qwen_patches(torch.rand(1, 3, 512, 512))
    assert grid.tolist() == [[1, 32, 32]] and pixels.shape == (32 * 32, 3 * 2 * 14 * 14)
    assert np.prod(grid[0].tolist()) * 14 * 14 <= MAX_PIXELS
