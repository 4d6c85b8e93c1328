"""The LAION aesthetic score: a small MLP on CLIP ViT-L/14 image embeddings (improved-aesthetic-predictor).

The predictor (christophschuhmann/improved-aesthetic-predictor, `sac+logos+ava1-l14-linearMSE.pth`) is
five Linear layers, 768 -> 1024 -> 128 -> 64 -> 16 -> 1, with Dropout between the first four (inactive at
inference), fed the L2-normalised image embedding of OpenAI's CLIP ViT-L/14. Its output is a rating on
AVA's 1-10 scale (most images land in 4-7); the reward is that number as it is, as DDPO and flow_grpo
use it. The prompt plays no part. The release's state dict has keys `layers.{0,2,4,6,7}.{weight,bias}`
(the indices of the Linear layers in its nn.Sequential); that is the layout checked and loaded here.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from spotlight.rewards.base import RewardError, RewardOutput
from spotlight.rewards.model_folder import check_model_folder
from spotlight.rewards.models.cache import shared
from spotlight.rewards.models.pixels import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, clip_pixels, reward_dtype
from spotlight.rewards.models.speed import Throughput

LINEAR_INDICES = (0, 2, 4, 6, 7)  # the Linear layers of the release's nn.Sequential (Dropouts at 1, 3, 5)
RELEASE_LAYOUT = ("sac+logos+ava1-l14-linearMSE.pth: a state dict with layers.{0,2,4,6,7}.{weight,bias}, "
                  "Linear 768->1024->128->64->16->1")


class AestheticMLP(torch.nn.Module):
    """The release's layer layout, sized from its state dict (768 in for ViT-L/14)."""

    def __init__(self, widths: Sequence[int]) -> None:
        super().__init__()
        d_in, h1, h2, h3, h4 = widths
        self.layers = torch.nn.Sequential(
            torch.nn.Linear(d_in, h1), torch.nn.Dropout(0.2), torch.nn.Linear(h1, h2), torch.nn.Dropout(0.2),
            torch.nn.Linear(h2, h3), torch.nn.Dropout(0.1), torch.nn.Linear(h3, h4), torch.nn.Linear(h4, 1))

    def forward(self, embeddings: torch.Tensor) -> torch.Tensor:
        return self.layers(embeddings)


def load_aesthetic_mlp(file: str | None, field: str = "reward.models.aesthetic") -> AestheticMLP:
    """The predictor in `file` (the release's layout, module docstring); RewardError in one line otherwise."""
    if file is None:
        raise RewardError(f"{field} is not set; download {RELEASE_LAYOUT.split(':')[0]} from "
                          f"improved-aesthetic-predictor and set {field} to that file")
    path = Path(file).expanduser()
    if not path.is_file():
        raise RewardError(f"{field} {file} does not exist; point it at the aesthetic predictor's file "
                          f"({RELEASE_LAYOUT})")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # a pickle of something else, a truncated download
        raise RewardError(f"{field} {file} is not a torch state dict ({type(error).__name__}); expected "
                          f"{RELEASE_LAYOUT}") from None
    expected = {f"layers.{index}.{part}" for index in LINEAR_INDICES for part in ("weight", "bias")}
    if not isinstance(state, dict) or set(state) != expected:
        found = sorted(state)[:4] if isinstance(state, dict) else type(state).__name__
        raise RewardError(f"{field} {file} does not hold the aesthetic predictor (found {found}); "
                          f"expected {RELEASE_LAYOUT}")
    weights = [state[f"layers.{index}.weight"] for index in LINEAR_INDICES]
    widths = [weights[0].shape[1]] + [weight.shape[0] for weight in weights[:-1]]
    if weights[-1].shape[0] != 1 or any(w.shape[1] != d for w, d in zip(weights, widths, strict=True)):
        raise RewardError(f"{field} {file}: its layers do not chain to one output; expected {RELEASE_LAYOUT}")
    mlp = AestheticMLP(widths)
    mlp.load_state_dict(state)
    return mlp.eval()


class CLIPVision:
    """A CLIP's image tower from a save_pretrained folder (CLIPModel or CLIPVisionModelWithProjection):
    unit-norm projected image embeddings of policy images, preprocessed on the device (`pixels.py`)."""

    def __init__(self, model: Any, size: int, mean: Sequence[float], std: Sequence[float], device: str) -> None:
        self.model, self.size, self.mean, self.std, self.device = model, size, mean, std, device
        self.dtype = next(model.parameters()).dtype

    @property
    def embed_dim(self) -> int:
        return int(self.model.config.projection_dim)

    @torch.no_grad()
    def embed(self, images: torch.Tensor) -> torch.Tensor:
        pixels = clip_pixels(images, self.size, self.mean, self.std, self.device, self.dtype)
        if hasattr(self.model, "get_image_features"):
            features = self.model.get_image_features(pixel_values=pixels)
            features = features if isinstance(features, torch.Tensor) else features.pooler_output
        else:
            features = self.model(pixel_values=pixels).image_embeds
        return torch.nn.functional.normalize(features.float(), dim=-1)


def image_processor_settings(folder: Path) -> dict[str, Any]:
    """The folder's image-processor settings (mean, std): preprocessor_config.json, or the `image_processor`
    entry of processor_config.json (how transformers 5 saves a processor); {} when there is neither."""
    for name, entry in (("preprocessor_config.json", None), ("processor_config.json", "image_processor")):
        file = folder / name
        if file.is_file():
            settings = json.loads(file.read_text())
            settings = settings.get(entry, {}) if entry else settings
            if "image_mean" in settings:
                return settings
    return {}


def load_clip_vision(folder: str | None, field: str, device: str) -> CLIPVision:
    """The image tower of the CLIP in `folder`, shared with any reward that loaded it already (`cache.py`)."""
    path = check_model_folder(folder, field, ("clip", "clip_vision_model"), "openai/clip-vit-large-patch14")
    kind = json.loads((path / "config.json").read_text())["model_type"]

    def load() -> CLIPVision:
        from transformers import CLIPModel, CLIPVisionModelWithProjection

        cls = CLIPModel if kind == "clip" else CLIPVisionModelWithProjection
        model = cls.from_pretrained(path, dtype=reward_dtype(device)).to(device).eval()
        vision = model.config.vision_config if kind == "clip" else model.config
        settings = image_processor_settings(path)
        return CLIPVision(model, int(vision.image_size), settings.get("image_mean", OPENAI_CLIP_MEAN),
                          settings.get("image_std", OPENAI_CLIP_STD), device)

    return shared(path, f"clip-vision:{kind}", device, load)


class AestheticReward:
    """The LAION aesthetic predictor's rating of each image (module docstring); prompts are not used."""

    name = "aesthetic"
    has_strict = False

    def __init__(self, vision: CLIPVision, mlp: AestheticMLP, batch_size: int = 32) -> None:
        if mlp.layers[0].in_features != vision.embed_dim:
            raise RewardError(f"the aesthetic predictor takes {mlp.layers[0].in_features}-d embeddings but the CLIP "
                              f"gives {vision.embed_dim}-d; the release pairs with CLIP ViT-L/14 (768)")
        self.vision, self.batch_size = vision, batch_size
        self.mlp = mlp.to(vision.device)
        self.throughput = Throughput()

    @classmethod
    def from_files(cls, predictor: str | None, clip_folder: str | None, device: str = "cpu",
                   batch_size: int = 32) -> AestheticReward:
        vision = load_clip_vision(clip_folder, "reward.models.aesthetic_clip", device)
        return cls(vision, load_aesthetic_mlp(predictor), batch_size)

    @torch.no_grad()
    def score(self, images: torch.Tensor, prompts: Sequence[str]) -> RewardOutput:
        batch = len(prompts)
        with self.throughput.timing(batch):
            ratings = [self.mlp(self.vision.embed(images[start : start + self.batch_size])).squeeze(-1)
                       for start in range(0, batch, self.batch_size)]
            rewards = torch.cat(ratings).float().cpu()
        return RewardOutput(rewards, torch.zeros(batch, dtype=torch.bool), torch.ones(batch, dtype=torch.bool))
