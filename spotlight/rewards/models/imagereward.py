"""ImageReward (Xu et al. 2023): BLIP's image-grounded text encoder and an MLP head, on transformers' BLIP.

The release (THUDM/ImageReward: `ImageReward.pt` and `med_config.json`) is BLIP's ViT-L/16 image encoder
(`blip.visual_encoder.*`, timm-style blocks with fused qkv, LayerNorm eps 1e-6), BLIP's BERT text encoder
with cross-attention over the image tokens (`blip.text_encoder.*`, no pooler, shaped by med_config.json
with encoder_width = the ViT's width) and a head `mlp.layers.{0,2,4,6,7}` (Linear 768->1024->128->64->16->1,
Dropouts between, no activations: the aesthetic predictor's layout). ImageReward scores a pair as
    text = BERT([CLS] prompt [SEP], padded to 35 tokens; cross-attending to ViT(image))
    reward = (mlp(text[:, 0]) - 0.16717362830052426) / 1.0333394966054072
with images resized (bicubic, short side) and centre-cropped to 224 with CLIP's mean/std. transformers'
`BlipVisionModel` and `BlipTextModel` (is_decoder config, so each layer has its cross-attention; run
bidirectionally) are the same modules: the text encoder's names are BERT's in both, and the image encoder's
are renamed here (`_VISION`). `blip.vision_proj` / `blip.text_proj` (unused for the score) are skipped.
The tokenizer is bert-base-uncased's (BLIP adds [DEC] and [ENC], which the score never uses).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from spotlight.rewards.base import RewardError, RewardOutput
from spotlight.rewards.models.aesthetic import AestheticMLP
from spotlight.rewards.models.cache import release_loaded, shared
from spotlight.rewards.models.pixels import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, clip_pixels
from spotlight.rewards.models.speed import Throughput

REWARD_MEAN, REWARD_STD = 0.16717362830052426, 1.0333394966054072  # the release's normalisation
MAX_TOKENS = 35
VIT_HEAD_WIDTH = 64  # BLIP's ViTs: base 768 / 12 heads, large 1024 / 16
RELEASE_LAYOUT = ("ImageReward.pt (blip.visual_encoder.*, blip.text_encoder.*, mlp.layers.{0,2,4,6,7}.*) with "
                  "med_config.json beside it")
_VISION_TOP = {"cls_token": "embeddings.class_embedding", "pos_embed": "embeddings.position_embedding",
               "patch_embed.proj.weight": "embeddings.patch_embedding.weight",
               "patch_embed.proj.bias": "embeddings.patch_embedding.bias",
               "norm.weight": "post_layernorm.weight", "norm.bias": "post_layernorm.bias"}
_VISION_BLOCK = {"norm1": "layer_norm1", "attn.qkv": "self_attn.qkv", "attn.proj": "self_attn.projection",
                 "norm2": "layer_norm2", "mlp.fc1": "mlp.fc1", "mlp.fc2": "mlp.fc2"}
_BLOCK = re.compile(r"^blocks\.(\d+)\.(.+)\.(weight|bias)$")


class ImageRewardModel(torch.nn.Module):
    """BLIP's image encoder, its image-grounded text encoder and ImageReward's head."""

    def __init__(self, vision_config: Any, text_config: Any) -> None:
        from transformers import BlipTextModel, BlipVisionModel

        super().__init__()
        self.vision = BlipVisionModel(vision_config)
        self.text = BlipTextModel(text_config, add_pooling_layer=False)
        self.mlp = AestheticMLP((text_config.hidden_size, 1024, 128, 64, 16))

    def forward(self, pixels: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        image = self.vision(pixel_values=pixels).last_hidden_state
        image_mask = torch.ones(image.shape[:-1], dtype=torch.long, device=image.device)
        text = self.text(input_ids=input_ids, attention_mask=attention_mask, encoder_hidden_states=image,
                         encoder_attention_mask=image_mask).last_hidden_state
        return (self.mlp(text[:, 0].float()).squeeze(-1) - REWARD_MEAN) / REWARD_STD


def _rename(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    renamed = {}
    for name, tensor in state.items():
        if name.startswith("blip.text_encoder."):
            renamed["text." + name.removeprefix("blip.text_encoder.")] = tensor
        elif name.startswith("mlp."):
            renamed[name] = tensor
        elif name.startswith("blip.visual_encoder."):
            part = name.removeprefix("blip.visual_encoder.")
            block = _BLOCK.match(part)
            if block is None:
                renamed["vision." + _VISION_TOP[part]] = tensor
            else:
                index, module, kind = block.groups()
                renamed[f"vision.encoder.layers.{index}.{_VISION_BLOCK[module]}.{kind}"] = tensor
    return renamed


def _configs(state: dict[str, torch.Tensor], med_config: dict[str, Any]) -> tuple[Any, Any]:
    """The ViT's shape from its weights (BLIP's heads are 64 wide), the text encoder's from med_config.json."""
    from transformers import BlipTextConfig, BlipVisionConfig

    patch = state["blip.visual_encoder.patch_embed.proj.weight"]
    width, patch_size = patch.shape[0], patch.shape[-1]
    grid = round((state["blip.visual_encoder.pos_embed"].shape[1] - 1) ** 0.5)
    depth = len({name.split(".")[3] for name in state if name.startswith("blip.visual_encoder.blocks.")})
    vision = BlipVisionConfig(hidden_size=width, intermediate_size=state["blip.visual_encoder.blocks.0.mlp.fc1.weight"]
                              .shape[0], num_hidden_layers=depth, num_attention_heads=width // VIT_HEAD_WIDTH,
                              image_size=grid * patch_size, patch_size=patch_size, hidden_act="gelu",
                              layer_norm_eps=1e-6)
    text = BlipTextConfig(vocab_size=med_config["vocab_size"], hidden_size=med_config["hidden_size"],
                          encoder_hidden_size=width, intermediate_size=med_config["intermediate_size"],
                          num_hidden_layers=med_config["num_hidden_layers"],
                          num_attention_heads=med_config["num_attention_heads"],
                          max_position_embeddings=med_config["max_position_embeddings"],
                          hidden_act=med_config.get("hidden_act", "gelu"),
                          layer_norm_eps=med_config.get("layer_norm_eps", 1e-12),
                          pad_token_id=med_config.get("pad_token_id", 0), is_decoder=True)
    return vision, text


def load_imagereward(file: str | None, device: str, field: str = "reward.models.imagereward") -> ImageRewardModel:
    """The ImageReward model in `file` (module docstring), shared across rewards (`cache.py`)."""
    if file is None:
        raise RewardError(f"{field} is not set; download ImageReward.pt and med_config.json (THUDM/ImageReward) into "
                          f"one folder and set {field} to ImageReward.pt")
    path = Path(file).expanduser()
    med = path.parent / "med_config.json"
    if not path.is_file() or not med.is_file():
        missing = path if not path.is_file() else med
        raise RewardError(f"{field}: {missing} does not exist; expected {RELEASE_LAYOUT}")

    def load() -> ImageRewardModel:
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as error:
            raise RewardError(f"{field} {file} is not a torch checkpoint ({type(error).__name__}); expected "
                              f"{RELEASE_LAYOUT}") from None
        state = state.get("state_dict", state) if isinstance(state, dict) else None
        if not isinstance(state, dict) or "blip.visual_encoder.patch_embed.proj.weight" not in state:
            raise RewardError(f"{field} {file} does not hold ImageReward's weights; expected {RELEASE_LAYOUT}")
        try:
            model = ImageRewardModel(*_configs(state, json.loads(med.read_text())))
            missing, unexpected = model.load_state_dict(_rename(state), strict=False)
        except (KeyError, RuntimeError, ValueError) as error:
            cause = f"{type(error).__name__}: {' '.join(str(error).split())[:240]}"  # the mismatch, on one line
            raise RewardError(f"{field} {file} does not match BLIP's layout or med_config.json ({cause}); expected "
                              f"{RELEASE_LAYOUT}") from None
        return release_loaded(model, missing, unexpected, f"{field} {file}", RELEASE_LAYOUT, device)

    return shared(path, "imagereward", device, load)


class ImageRewardReward:
    """ImageReward's normalised score of (image, prompt) (module docstring)."""

    name = "imagereward"
    has_strict = False

    def __init__(self, model: ImageRewardModel, tokenizer: Any, device: str = "cpu", batch_size: int = 32) -> None:
        self.model, self.tokenizer, self.device, self.batch_size = model, tokenizer, device, batch_size
        self.throughput = Throughput()

    @classmethod
    def from_files(cls, checkpoint: str | None, tokenizer_folder: str | None, device: str = "cpu",
                   batch_size: int = 32) -> ImageRewardReward:
        field = "reward.models.imagereward_tokenizer"
        if tokenizer_folder is None:
            raise RewardError(f"{field} is not set; save bert-base-uncased's tokenizer with save_pretrained and set "
                              f"{field} to that folder")
        from transformers import AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(tokenizer_folder)
        except (OSError, ValueError) as error:
            raise RewardError(f"{field} {tokenizer_folder} has no tokenizer ({str(error).splitlines()[0][:120]}); "
                              "save bert-base-uncased's tokenizer there") from None
        return cls(load_imagereward(checkpoint, device), tokenizer, device, batch_size)

    @torch.no_grad()
    def _scores(self, images: torch.Tensor, prompts: Sequence[str]) -> torch.Tensor:
        size = int(self.model.vision.config.image_size)
        dtype = next(self.model.vision.parameters()).dtype
        pixels = clip_pixels(images, size, OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, self.device, dtype)
        tokens = self.tokenizer(list(prompts), padding="max_length", truncation=True, max_length=MAX_TOKENS,
                                return_tensors="pt")
        return self.model(pixels, tokens["input_ids"].to(self.device), tokens["attention_mask"].to(self.device))

    def score(self, images: torch.Tensor, prompts: Sequence[str]) -> RewardOutput:
        batch = len(prompts)
        with self.throughput.timing(batch):
            scores = [self._scores(images[start : start + self.batch_size], prompts[start : start + self.batch_size])
                      for start in range(0, batch, self.batch_size)]
            rewards = torch.cat(scores).float().cpu()
        return RewardOutput(rewards, torch.zeros(batch, dtype=torch.bool), torch.ones(batch, dtype=torch.bool))
