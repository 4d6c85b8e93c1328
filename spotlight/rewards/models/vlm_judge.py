"""A VLM judge: a local Qwen2.5-VL asked one yes/no question per image; the reward is P("yes").

The question is `reward.judge_question` with the prompt in place of `{prompt}` (default "Does this image
show {prompt}? Answer yes or no."), put through the model's own chat template with the image before it,
as Qwen2.5-VL's processor lays out a user turn, then the assistant's turn opened. ONE forward pass of the
whole batch (right-padded, with its attention mask) gives the logits at each prompt's last position, the
answer's first token; the reward is the softmax restricted to the yes/no tokens, P(yes) = sum of the
"yes"/"Yes" tokens' probabilities over that of those and "no"/"No" (whichever of them the vocabulary has as
single tokens). No text is generated or parsed, so the reward is a smooth number in [0, 1] and costs one
forward, and `strict` is P(yes) > 0.5.

Images are turned into Qwen2-VL's patches on the reward's device (`qwen_patches`): resized so both sides are
multiples of 28 within `MIN_PIXELS`..`MAX_PIXELS` (Qwen2-VL's smart_resize, bicubic antialiased), normalised
with CLIP's mean/std, cut into 14-px patches in 2x2 merge order and repeated over the 2 temporal slots, the
layout of transformers' Qwen2-VL image processor (tests/rewards/test_vlm_judge.py compares them).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from spotlight.rewards.base import RewardError, RewardOutput
from spotlight.rewards.model_folder import check_model_folder
from spotlight.rewards.models.cache import shared
from spotlight.rewards.models.pixels import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, reward_dtype
from spotlight.rewards.models.speed import Throughput

DEFAULT_QUESTION = "Does this image show {prompt}? Answer yes or no."
MIN_PIXELS, MAX_PIXELS = 56 * 56, 448 * 448  # a 512x512 image is judged at 448x448: 256 merged image tokens
YES, NO = ("yes", "Yes"), ("no", "No")
IMAGE_TOKEN = "<|image_pad|>"


def smart_resize(height: int, width: int, factor: int = 28, min_pixels: int = MIN_PIXELS,
                 max_pixels: int = MAX_PIXELS) -> tuple[int, int]:
    """Qwen2-VL's target size: sides multiples of `factor`, area within [min_pixels, max_pixels], aspect kept."""
    h_bar, w_bar = round(height / factor) * factor, round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar, w_bar = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def qwen_patches(images: torch.Tensor, patch: int = 14, merge: int = 2, temporal: int = 2,
                 device: str | torch.device = "cpu",
                 dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """Images (B, 3, H, W) in [0, 1] -> (pixel_values (B * gh * gw, 3 * temporal * patch^2), image_grid_thw (B, 3))."""
    x = images.to(device=device, dtype=torch.float32)
    batch, channels, height, width = x.shape
    new_h, new_w = smart_resize(height, width, patch * merge)
    if (new_h, new_w) != (height, width):
        x = torch.nn.functional.interpolate(x, size=(new_h, new_w), mode="bicubic", antialias=True,
                                            align_corners=False).clamp(0, 1)
    mean = torch.tensor(OPENAI_CLIP_MEAN, device=x.device).view(1, 3, 1, 1)
    std = torch.tensor(OPENAI_CLIP_STD, device=x.device).view(1, 3, 1, 1)
    x = (x - mean) / std
    grid_h, grid_w = new_h // patch, new_w // patch
    x = x.reshape(batch, channels, grid_h // merge, merge, patch, grid_w // merge, merge, patch)
    x = x.permute(0, 2, 5, 3, 6, 1, 4, 7)  # (B, gh/m, gw/m, m, m, C, P, P): the processor's patch order
    x = x.unsqueeze(6).expand(*x.shape[:6], temporal, patch, patch)  # the image repeated over the temporal slots
    pixel_values = x.reshape(batch * grid_h * grid_w, channels * temporal * patch * patch).to(dtype)
    grid = torch.tensor([[1, grid_h, grid_w]] * batch, device=x.device)
    return pixel_values, grid


def _single_tokens(tokenizer: Any, words: Sequence[str]) -> list[int]:
    ids = [tokenizer.encode(word, add_special_tokens=False) for word in words]
    return [one[0] for one in ids if len(one) == 1]


class VLMJudgeReward:
    """P("yes") of a Qwen2.5-VL asked `question` about each image (module docstring)."""

    name = "vlm-judge"

    def __init__(self, model: Any, tokenizer: Any, question: str = DEFAULT_QUESTION, device: str = "cpu",
                 batch_size: int = 32) -> None:
        self.model, self.tokenizer, self.question = model, tokenizer, question
        self.device, self.batch_size = device, batch_size
        self.yes, self.no = _single_tokens(tokenizer, YES), _single_tokens(tokenizer, NO)
        if not self.yes or not self.no:
            raise RewardError("reward.models.vlm_judge: its tokenizer has no single token for 'yes'/'Yes' or "
                              "'no'/'No'; use a Qwen2.5-VL folder with its own tokenizer")
        if getattr(tokenizer, "chat_template", None) is None:
            raise RewardError("reward.models.vlm_judge: its tokenizer has no chat template; save the Qwen2.5-VL "
                              "processor's tokenizer (with chat_template) into the folder")
        self.image_token = tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)
        if self.image_token != model.config.image_token_id:
            raise RewardError(f"reward.models.vlm_judge: the tokenizer's {IMAGE_TOKEN} is id {self.image_token} but "
                              f"the model expects {model.config.image_token_id}; save model and tokenizer from one "
                              "release")
        self.throughput = Throughput()

    @classmethod
    def from_folder(cls, folder: str | None, question: str = DEFAULT_QUESTION, device: str = "cpu",
                    batch_size: int = 32) -> VLMJudgeReward:
        path = check_model_folder(folder, "reward.models.vlm_judge", ("qwen2_5_vl",), "Qwen/Qwen2.5-VL-7B-Instruct")

        def load() -> Any:
            from transformers import Qwen2_5_VLForConditionalGeneration

            model = Qwen2_5_VLForConditionalGeneration.from_pretrained(path, dtype=reward_dtype(device))
            return model.to(device).eval()

        from transformers import AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(path)
        except (OSError, ValueError) as error:
            raise RewardError(f"reward.models.vlm_judge {folder} has no tokenizer ({str(error).splitlines()[0][:120]});"
                              " save the Qwen2.5-VL processor there too") from None
        return cls(shared(path, "qwen2_5_vl", device, load), tokenizer, question, device, batch_size)

    def texts(self, prompts: Sequence[str], image_tokens: int) -> list[str]:
        """Each prompt's question in the chat template, its one image placeholder expanded to `image_tokens`."""
        texts = []
        for prompt in prompts:
            message = [{"role": "user", "content": [{"type": "image"},
                                                    {"type": "text", "text": self.question.format(prompt=prompt)}]}]
            text = self.tokenizer.apply_chat_template(message, tokenize=False, add_generation_prompt=True)
            if text.count(IMAGE_TOKEN) != 1:
                raise RewardError(f"reward.models.vlm_judge: the chat template put {text.count(IMAGE_TOKEN)} image "
                                  f"placeholders ({IMAGE_TOKEN}) in a one-image turn; use Qwen2.5-VL's template")
            texts.append(text.replace(IMAGE_TOKEN, IMAGE_TOKEN * image_tokens))
        return texts

    @torch.no_grad()
    def _p_yes(self, images: torch.Tensor, prompts: Sequence[str]) -> torch.Tensor:
        vision = self.model.config.vision_config
        pixels, grid = qwen_patches(images, vision.patch_size, vision.spatial_merge_size, vision.temporal_patch_size,
                                    self.device, next(self.model.parameters()).dtype)
        image_tokens = int(grid[0].prod()) // vision.spatial_merge_size ** 2
        tokens = self.tokenizer(self.texts(prompts, image_tokens), padding=True, padding_side="right",
                                return_tensors="pt", add_special_tokens=False)
        input_ids, mask = tokens["input_ids"].to(self.device), tokens["attention_mask"].to(self.device)
        logits = self.model(input_ids=input_ids, attention_mask=mask, pixel_values=pixels, image_grid_thw=grid).logits
        last = logits[torch.arange(len(prompts), device=logits.device), mask.sum(dim=1) - 1].float()
        choices = last[:, self.yes + self.no].softmax(dim=-1)
        return choices[:, : len(self.yes)].sum(dim=-1)

    def score(self, images: torch.Tensor, prompts: Sequence[str]) -> RewardOutput:
        batch = len(prompts)
        with self.throughput.timing(batch):
            chunks = [self._p_yes(images[start : start + self.batch_size], prompts[start : start + self.batch_size])
                      for start in range(0, batch, self.batch_size)]
            rewards = torch.cat(chunks).cpu()
        return RewardOutput(rewards, rewards > 0.5, torch.ones(batch, dtype=torch.bool))
