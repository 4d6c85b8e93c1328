"""Preference and alignment rewards on CLIP models from local folders: PickScore and CLIPScore.

Each is scored the way its authors score it, with their prompt template:

- PickScore (Kirstain et al. 2023, `yuvalkirstain/PickScore_v1` with the processor of
  `laion/CLIP-ViT-H-14-laion2B-s32B-b79K`): the prompt as written; score = logit_scale x cos(image,
  text). The reward divides it by 26, as flow_grpo does, so typical images land near 0.8-0.9.
- CLIPScore (Hessel et al. 2021, CLIP ViT-B/32 in the paper; any CLIPModel folder here): the text
  "A photo depicts " + prompt; score = 2.5 x max(cos(image, text), 0), the paper's w = 2.5.

Neither has a notion of a correct image, so `strict` is always False and `has_strict` tells a
composite to leave them out of its strict flag. Images are handed to the processor as uint8 (what
the authors' PIL pipelines see), at whatever size the policy makes: the processor resizes.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from spotlight.rewards.base import RewardOutput
from spotlight.rewards.clip_embed import CLIP, load_clip

PICKSCORE_SCALE = 26.0  # flow_grpo's normalisation of PickScore to about [0, 1]
CLIPSCORE_W = 2.5
CLIPSCORE_PREFIX = "A photo depicts "


def _uint8_images(images: torch.Tensor) -> list:
    if images.dim() != 4 or images.shape[1] != 3:
        raise ValueError(f"expected images (B, 3, H, W) (got shape {tuple(images.shape)})")
    pixels = (images.detach().float().clamp(0, 1) * 255).round().byte().permute(0, 2, 3, 1).cpu().numpy()
    return list(pixels)


def _cosines(clip: CLIP, images: torch.Tensor, texts: Sequence[str], batch_size: int) -> torch.Tensor:
    """cos(image_i, text_i) for each pair, (B,)."""
    image_embeddings = clip.images(_uint8_images(images), batch_size)
    text_embeddings = torch.cat([clip.texts(texts[start : start + batch_size])
                                 for start in range(0, len(texts), batch_size)])
    return (image_embeddings * text_embeddings).sum(dim=-1)


class CosineReward:
    """A reward of cos(image, text(prompt)) under a CLIP: subclasses say which text and which scale."""

    name = "cosine"
    has_strict = False

    def __init__(self, clip: CLIP, batch_size: int = 32) -> None:
        self.clip, self.batch_size = clip, batch_size

    def text(self, prompt: str) -> str:
        return prompt

    def from_cosine(self, cosines: torch.Tensor) -> torch.Tensor:
        return cosines

    def score(self, images: torch.Tensor, prompts: Sequence[str]) -> RewardOutput:
        cosines = _cosines(self.clip, images, [self.text(prompt) for prompt in prompts], self.batch_size)
        batch = len(prompts)
        return RewardOutput(self.from_cosine(cosines), torch.zeros(batch, dtype=torch.bool),
                            torch.ones(batch, dtype=torch.bool))


class PickScoreReward(CosineReward):
    """logit_scale x cos(image, prompt) / 26 (module docstring)."""

    name = "pickscore"

    @classmethod
    def from_folder(cls, folder: str | None, processor_folder: str | None, device: str = "cpu",
                    batch_size: int = 32) -> PickScoreReward:
        return cls(load_clip(folder, "reward.models.pickscore", "yuvalkirstain/PickScore_v1", device,
                             processor_folder), batch_size)

    def from_cosine(self, cosines: torch.Tensor) -> torch.Tensor:
        return self.clip.logit_scale * cosines / PICKSCORE_SCALE


class CLIPScoreReward(CosineReward):
    """2.5 x max(cos(image, 'A photo depicts ' + prompt), 0) (module docstring)."""

    name = "clipscore"

    @classmethod
    def from_folder(cls, folder: str | None, device: str = "cpu", batch_size: int = 32) -> CLIPScoreReward:
        return cls(load_clip(folder, "reward.models.clip", "openai/clip-vit-large-patch14", device), batch_size)

    def text(self, prompt: str) -> str:
        return CLIPSCORE_PREFIX + prompt

    def from_cosine(self, cosines: torch.Tensor) -> torch.Tensor:
        return CLIPSCORE_W * cosines.clamp(min=0)
