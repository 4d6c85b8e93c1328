"""HPSv2.1: an OpenCLIP ViT-H-14 fine-tuned on human preference pairs; score = 100 x cos(image, prompt).

The release (`HPS_v2.1_compressed.pt`, xswu/HPSv2) is a state dict of open_clip's `CLIP` model, under
`state_dict` (how HPSv2's own `score` loads it) or at the top level. HPSv2 builds that model with
`open_clip.create_model_and_transforms("ViT-H-14")`; open_clip is not used here because it imports
torchvision, and PyPI's torchvision wheels are CUDA builds that fail to import beside the CPU torch this
project tests on (and pip would replace that torch to satisfy the newest one). The `hpsv2` package is not
used either (it pins old dependencies). Instead the state dict is renamed, tensor for tensor, into
transformers' `CLIPModel`, which has the same architecture: pre-norm residual blocks with fused-QKV
attention split into q/k/v, exact GELU, LayerNorm eps 1e-5, a class token pooled after `ln_post` for the
image, the end-of-text token (the largest id, found by argmax, as open_clip does) after `ln_final` for
the text, and projections without bias. tests/rewards/test_hps.py checks the rename against a direct
computation of open_clip's forward on the same state dict.

The architecture is ViT-H-14's open_clip config (below) unless an `open_clip_config.json` (open_clip's
hub layout: {"model_cfg": {...}}, or the model config itself) sits beside the checkpoint. The tokenizer
is the ViT-H-14 CLIP processor's (`laion/CLIP-ViT-H-14-laion2B-s32B-b79K`, the same BPE vocabulary as
open_clip's). Images are preprocessed on the device (`pixels.py`: 224 px, OpenAI's mean and std).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from spotlight.rewards.base import RewardError, RewardOutput
from spotlight.rewards.models.cache import release_loaded, shared
from spotlight.rewards.models.pixels import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, clip_pixels
from spotlight.rewards.models.speed import Throughput

HPS_SCALE = 100.0
VIT_H_14: dict[str, Any] = {  # open_clip's model_configs/ViT-H-14.json
    "embed_dim": 1024,
    "vision_cfg": {"image_size": 224, "layers": 32, "width": 1280, "head_width": 80, "patch_size": 14},
    "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 1024, "heads": 16, "layers": 24},
}
RELEASE_LAYOUT = ("HPS_v2.1_compressed.pt: {'state_dict': open_clip ViT-H-14 CLIP weights} (visual.conv1.weight, "
                  "visual.transformer.resblocks.*, token_embedding.weight, text_projection, logit_scale, ...)")
_BLOCK = re.compile(r"^(visual\.)?transformer\.resblocks\.(\d+)\.(.+)$")
_BLOCK_PARTS = {"ln_1": "layer_norm1", "ln_2": "layer_norm2", "mlp.c_fc": "mlp.fc1", "mlp.c_proj": "mlp.fc2",
                "attn.out_proj": "self_attn.out_proj"}
_TOP = {  # open_clip name -> (transformers name, transposed)
    "visual.class_embedding": ("vision_model.embeddings.class_embedding", False),
    "visual.conv1.weight": ("vision_model.embeddings.patch_embedding.weight", False),
    "visual.positional_embedding": ("vision_model.embeddings.position_embedding.weight", False),
    "visual.ln_pre.weight": ("vision_model.pre_layrnorm.weight", False),
    "visual.ln_pre.bias": ("vision_model.pre_layrnorm.bias", False),
    "visual.ln_post.weight": ("vision_model.post_layernorm.weight", False),
    "visual.ln_post.bias": ("vision_model.post_layernorm.bias", False),
    "visual.proj": ("visual_projection.weight", True),
    "token_embedding.weight": ("text_model.embeddings.token_embedding.weight", False),
    "positional_embedding": ("text_model.embeddings.position_embedding.weight", False),
    "ln_final.weight": ("text_model.final_layer_norm.weight", False),
    "ln_final.bias": ("text_model.final_layer_norm.bias", False),
    "text_projection": ("text_projection.weight", True),
    "logit_scale": ("logit_scale", False),
}


def clip_config(open_clip_cfg: dict[str, Any]) -> Any:
    """transformers' CLIPConfig of an open_clip model config (a standard ViT/text-transformer CLIP)."""
    from transformers import CLIPConfig, CLIPTextConfig, CLIPVisionConfig

    vision, text = open_clip_cfg["vision_cfg"], open_clip_cfg["text_cfg"]
    vision_heads = vision.get("heads") or vision["width"] // vision.get("head_width", 64)
    return CLIPConfig(
        projection_dim=open_clip_cfg["embed_dim"],
        vision_config=CLIPVisionConfig(
            hidden_size=vision["width"], intermediate_size=int(vision["width"] * vision.get("mlp_ratio", 4.0)),
            num_hidden_layers=vision["layers"], num_attention_heads=vision_heads, image_size=vision["image_size"],
            patch_size=vision["patch_size"], hidden_act="gelu", layer_norm_eps=1e-5).to_dict(),
        text_config=CLIPTextConfig(
            vocab_size=text["vocab_size"], hidden_size=text["width"],
            intermediate_size=int(text["width"] * text.get("mlp_ratio", 4.0)), num_hidden_layers=text["layers"],
            num_attention_heads=text["heads"], max_position_embeddings=text["context_length"], hidden_act="gelu",
            layer_norm_eps=1e-5, eos_token_id=2).to_dict(),  # 2: transformers' legacy argmax pooling = open_clip's
    )


def open_clip_to_transformers(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """open_clip `CLIP` state dict -> transformers `CLIPModel` state dict (module docstring); KeyError on a
    name this architecture does not have."""
    renamed: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        if name == "attn_mask":  # the text's causal mask, a buffer in old open_clip checkpoints
            continue
        block = _BLOCK.match(name)
        if block is None:
            target, transposed = _TOP[name]
            renamed[target] = tensor.t() if transposed else tensor
            continue
        visual, index, part = block.groups()
        prefix = f"{'vision_model' if visual else 'text_model'}.encoder.layers.{index}."
        if part.startswith("attn.in_proj_"):
            kind = part.rsplit("_", 1)[1]  # weight or bias
            for projection, chunk in zip(("q_proj", "k_proj", "v_proj"), tensor.chunk(3, dim=0), strict=True):
                renamed[f"{prefix}self_attn.{projection}.{kind}"] = chunk
            continue
        module, kind = part.rsplit(".", 1)
        renamed[f"{prefix}{_BLOCK_PARTS[module]}.{kind}"] = tensor
    return renamed


def _architecture(checkpoint: Path) -> dict[str, Any]:
    config = checkpoint.parent / "open_clip_config.json"
    if not config.is_file():
        return VIT_H_14
    settings = json.loads(config.read_text())
    return settings.get("model_cfg", settings)


def load_hps_clip(file: str | None, device: str, field: str = "reward.models.hps") -> Any:
    """transformers CLIPModel holding the HPS checkpoint in `file`, shared across rewards (`cache.py`)."""
    if file is None:
        raise RewardError(f"{field} is not set; download HPS_v2.1_compressed.pt (xswu/HPSv2) and set {field} to it")
    path = Path(file).expanduser()
    if not path.is_file():
        raise RewardError(f"{field} {file} does not exist; point it at the HPSv2.1 checkpoint ({RELEASE_LAYOUT})")

    def load() -> Any:
        from transformers import CLIPModel

        try:
            checkpoint = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as error:
            raise RewardError(f"{field} {file} is not a torch checkpoint ({type(error).__name__}); expected "
                              f"{RELEASE_LAYOUT}") from None
        state = checkpoint.get("state_dict", checkpoint) if isinstance(checkpoint, dict) else None
        if not isinstance(state, dict) or "visual.conv1.weight" not in state:
            raise RewardError(f"{field} {file} does not hold an open_clip CLIP state dict; expected {RELEASE_LAYOUT}")
        state = {name.removeprefix("module."): tensor for name, tensor in state.items()}  # saved from DDP
        model = CLIPModel(clip_config(_architecture(path)))
        try:
            renamed = open_clip_to_transformers(state)
            missing, unexpected = model.load_state_dict(renamed, strict=False)
        except (KeyError, RuntimeError) as error:  # a name or a shape of another architecture
            detail = " ".join(str(error).split())[:240]  # load_state_dict names the mismatch on its second line
            raise RewardError(f"{field} {file} does not match the open_clip architecture "
                              f"({type(error).__name__}: {detail}); expected "
                              f"{RELEASE_LAYOUT}, or an open_clip_config.json beside it") from None
        return release_loaded(model, missing, unexpected, f"{field} {file}", RELEASE_LAYOUT, device)

    return shared(path, "hps-clip", device, load)


class HPSReward:
    """HPSv2.1: 100 x cos(image, prompt) (module docstring)."""

    name = "hps"
    has_strict = False

    def __init__(self, model: Any, tokenizer: Any, device: str = "cpu", batch_size: int = 32) -> None:
        self.model, self.tokenizer, self.device, self.batch_size = model, tokenizer, device, batch_size
        self.dtype = next(model.parameters()).dtype
        self.throughput = Throughput()

    @classmethod
    def from_files(cls, checkpoint: str | None, processor_folder: str | None, device: str = "cpu",
                   batch_size: int = 32) -> HPSReward:
        field = "reward.models.hps_processor"
        if processor_folder is None:
            raise RewardError(f"{field} (or reward.models.pickscore_processor) is not set; save the processor of "
                              "laion/CLIP-ViT-H-14-laion2B-s32B-b79K with save_pretrained and set it to that folder")
        from transformers import AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(processor_folder)
        except (OSError, ValueError) as error:
            raise RewardError(f"{field} {processor_folder} has no CLIP tokenizer ({str(error).splitlines()[0][:120]}); "
                              "save laion/CLIP-ViT-H-14-laion2B-s32B-b79K's processor there") from None
        return cls(load_hps_clip(checkpoint, device), tokenizer, device, batch_size)

    @torch.no_grad()
    def _cosines(self, images: torch.Tensor, prompts: Sequence[str]) -> torch.Tensor:
        size = int(self.model.config.vision_config.image_size)
        pixels = clip_pixels(images, size, OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, self.device, self.dtype)
        image = self.model.get_image_features(pixel_values=pixels)
        tokens = self.tokenizer(list(prompts), padding="max_length", truncation=True,
                                max_length=int(self.model.config.text_config.max_position_embeddings),
                                return_tensors="pt")
        text = self.model.get_text_features(input_ids=tokens["input_ids"].to(self.device))
        image, text = (f if isinstance(f, torch.Tensor) else f.pooler_output for f in (image, text))
        image, text = (torch.nn.functional.normalize(f.float(), dim=-1) for f in (image, text))
        return (image * text).sum(dim=-1)

    def score(self, images: torch.Tensor, prompts: Sequence[str]) -> RewardOutput:
        batch = len(prompts)
        with self.throughput.timing(batch):
            cosines = [self._cosines(images[start : start + self.batch_size], prompts[start : start + self.batch_size])
                       for start in range(0, batch, self.batch_size)]
            rewards = (HPS_SCALE * torch.cat(cosines)).cpu()
        return RewardOutput(rewards, torch.zeros(batch, dtype=torch.bool), torch.ones(batch, dtype=torch.bool))
