"""The LAION aesthetic reward on a tiny random CLIP and a predictor in the release's layout.

The expected ratings are computed here directly: CLIPModel.get_image_features on normalised pixels, the
L2 norm, and the five Linear layers applied with F.linear from the saved state dict.
"""

import pytest
import torch
from tiny_models import save_tiny_aesthetic_predictor
from transformers import CLIPModel, CLIPVisionConfig, CLIPVisionModelWithProjection

from spotlight.rewards.base import RewardError, guarded_score
from spotlight.rewards.models.aesthetic import AestheticReward, image_processor_settings
from spotlight.rewards.models.cache import forget_all
from spotlight.rewards.registry import build_reward
from spotlight.rewards.section import RewardSection


def reference_ratings(clip_folder, predictor, images: torch.Tensor) -> torch.Tensor:
    settings = image_processor_settings(clip_folder)
    mean = torch.tensor(settings["image_mean"]).view(1, 3, 1, 1)
    std = torch.tensor(settings["image_std"]).view(1, 3, 1, 1)
    model = CLIPModel.from_pretrained(clip_folder).eval()
    with torch.no_grad():
        features = model.get_image_features(pixel_values=(images - mean) / std)
    features = features if isinstance(features, torch.Tensor) else features.pooler_output
    x = features / features.norm(dim=-1, keepdim=True)
    state = torch.load(predictor, weights_only=True)
    for index in (0, 2, 4, 6, 7):
        x = torch.nn.functional.linear(x, state[f"layers.{index}.weight"], state[f"layers.{index}.bias"])
    return x.squeeze(-1)


@pytest.fixture(scope="module")
def predictor(tmp_path_factory):
    return save_tiny_aesthetic_predictor(tmp_path_factory.mktemp("aesthetic") / "sac+logos+ava1-l14-linearMSE.pth", 16)


def test_aesthetic_is_the_predictor_on_normalised_clip_embeddings(tiny_clip, predictor):
    forget_all()
    reward = build_reward(RewardSection(name="aesthetic", batch_size=3,
                                        models={"clip": str(tiny_clip), "aesthetic": str(predictor)}))
    images = torch.rand(5, 3, 32, 32, generator=torch.Generator().manual_seed(0))  # the tiny CLIP's size
    out = guarded_score(reward, images, ["a red clock"] * 5)
    assert out.valid.all() and not out.strict.any()
    torch.testing.assert_close(out.rewards, reference_ratings(tiny_clip, predictor, images), atol=1e-5, rtol=1e-5)
    assert reward.reward.throughput.images == 5 and reward.reward.throughput.images_per_s > 0  # per_frame wraps it


def test_aesthetic_resizes_any_image_and_accepts_a_vision_tower_folder(tiny_clip, predictor, tmp_path):
    vision_folder = tmp_path / "vision"
    full_model = CLIPModel.from_pretrained(tiny_clip)
    settings = {**full_model.config.vision_config.to_dict(), "projection_dim": full_model.config.projection_dim}
    tower = CLIPVisionModelWithProjection(CLIPVisionConfig(**settings))
    tower.load_state_dict({name: tensor for name, tensor in full_model.state_dict().items()
                           if name.startswith(("vision_model.", "visual_projection."))})
    tower.save_pretrained(vision_folder)
    (vision_folder / "processor_config.json").write_text((tiny_clip / "processor_config.json").read_text())
    forget_all()
    full = AestheticReward.from_files(str(predictor), str(tiny_clip))
    tower = AestheticReward.from_files(str(predictor), str(vision_folder))
    images = torch.rand(2, 3, 96, 64, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(full.score(images, ["", ""]).rewards, tower.score(images, ["", ""]).rewards)
    small = torch.nn.functional.interpolate(images, size=(48, 32), mode="bicubic", antialias=True).clamp(0, 1)
    crop = small[..., 8:40, :]
    torch.testing.assert_close(full.score(images, ["", ""]).rewards, reference_ratings(tiny_clip, predictor, crop),
                               atol=1e-5, rtol=1e-5)


def test_two_rewards_on_one_folder_share_the_backbone(tiny_clip, predictor):
    forget_all()
    first = AestheticReward.from_files(str(predictor), str(tiny_clip))
    second = AestheticReward.from_files(str(predictor), str(tiny_clip))
    assert first.vision is second.vision


def test_a_wrong_or_missing_predictor_fails_in_one_line_naming_the_layout(tiny_clip, tmp_path):
    with pytest.raises(RewardError, match=r"reward.models.aesthetic .*does not exist.*layers.\{0,2,4,6,7\}"):
        AestheticReward.from_files(str(tmp_path / "nowhere.pth"), str(tiny_clip))
    wrong = tmp_path / "other.pth"
    torch.save({"fc.weight": torch.zeros(1, 768)}, wrong)
    with pytest.raises(RewardError, match=r"does not hold the aesthetic predictor .*sac\+logos\+ava1") as error:
        AestheticReward.from_files(str(wrong), str(tiny_clip))
    assert "\n" not in str(error.value)
    mismatched = save_tiny_aesthetic_predictor(tmp_path / "768.pth", 768)
    with pytest.raises(RewardError, match=r"takes 768-d embeddings but the CLIP gives 16-d"):
        AestheticReward.from_files(str(mismatched), str(tiny_clip))
    with pytest.raises(RewardError, match="reward.models.aesthetic is not set"):
        AestheticReward.from_files(None, str(tiny_clip))
