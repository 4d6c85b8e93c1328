"""PickScore and CLIPScore on a tiny random CLIP saved locally: plumbing, and the authors' formulas.

The expected scores come from a second path through the model (CLIPModel's own forward and its
logits_per_image), not from the reward's embedding code. Real checkpoints: docs/rewards.md.
"""

import pytest
import torch
from transformers import AutoProcessor, CLIPModel

from spotlight.rewards.base import RewardError, guarded_score
from spotlight.rewards.preference import CLIPScoreReward, PickScoreReward


def logits_per_pair(folder, images: torch.Tensor, texts: list[str]) -> torch.Tensor:
    """logit_scale x cos(image_i, text_i) by CLIPModel.forward."""
    model, processor = CLIPModel.from_pretrained(folder).eval(), AutoProcessor.from_pretrained(folder)
    pixels = list((images * 255).round().byte().permute(0, 2, 3, 1).numpy())
    inputs = processor(text=texts, images=pixels, padding=True, return_tensors="pt")
    with torch.no_grad():
        out = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"],
                    pixel_values=inputs["pixel_values"])
    return out.logits_per_image.diag()


def test_pickscore_is_logit_scale_times_cosine_over_26(tiny_clip):
    reward = PickScoreReward.from_folder(str(tiny_clip), None, batch_size=2)
    images = torch.rand(3, 3, 64, 48, generator=torch.Generator().manual_seed(0))
    prompts = ["a photo of a red clock", "a green bench", "a sign that says hello"]
    out = guarded_score(reward, images, prompts)
    assert out.valid.all() and not out.strict.any()
    torch.testing.assert_close(out.rewards, logits_per_pair(tiny_clip, images, prompts) / 26, atol=1e-5, rtol=1e-5)


def test_clipscore_is_2_5_times_clipped_cosine_with_the_papers_prefix(tiny_clip):
    reward = CLIPScoreReward.from_folder(str(tiny_clip))
    images = torch.rand(4, 3, 512, 512, generator=torch.Generator().manual_seed(1))  # any size: the processor resizes
    prompts = ["a red clock", "a green bench", "a black cat", "a white dog"]
    out = guarded_score(reward, images, prompts)
    scale = CLIPModel.from_pretrained(tiny_clip).logit_scale.exp()
    cosines = logits_per_pair(tiny_clip, images, ["A photo depicts " + p for p in prompts]) / scale
    torch.testing.assert_close(out.rewards, 2.5 * cosines.clamp(min=0), atol=1e-5, rtol=1e-5)


def test_a_missing_or_wrong_kind_of_folder_fails_in_one_line(tmp_path, tiny_detector):
    with pytest.raises(RewardError, match=r"reward.models.clip .*does not exist; point it at a folder") as missing:
        CLIPScoreReward.from_folder(str(tmp_path / "nowhere"))
    assert "\n" not in str(missing.value)
    with pytest.raises(RewardError, match=r"holds a 'mask2former' model, not 'clip'"):
        PickScoreReward.from_folder(str(tiny_detector), None)
    with pytest.raises(RewardError, match="reward.models.pickscore is not set"):
        PickScoreReward.from_folder(None, None)
