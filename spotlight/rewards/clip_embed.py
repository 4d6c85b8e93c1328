"""CLIP models from local folders, and their normalised image and text embeddings.

Shared by PickScore, CLIPScore and GenEval's colour classifier, which differ only in the checkpoint,
the prompt template and what they do with the cosine. transformers 5 returns the projected
embedding as `pooler_output` of `get_*_features`; older versions return the tensor itself; both work.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from spotlight.rewards.model_folder import check_model_folder


def _projected(output: Any) -> torch.Tensor:
    return output if isinstance(output, torch.Tensor) else output.pooler_output


@dataclass
class CLIP:
    """A CLIPModel and its processor on one device."""

    model: torch.nn.Module
    processor: Any
    device: str

    @torch.no_grad()
    def images(self, pixels: Sequence[np.ndarray | Any], batch_size: int = 32) -> torch.Tensor:
        """Unit-norm image embeddings (N, D) of uint8 HWC arrays or PIL images, `batch_size` per forward pass."""
        chunks = []
        for start in range(0, len(pixels), batch_size):
            inputs = self.processor(images=list(pixels[start : start + batch_size]), return_tensors="pt")
            features = _projected(self.model.get_image_features(pixel_values=inputs["pixel_values"].to(self.device)))
            chunks.append(torch.nn.functional.normalize(features.float(), dim=-1).cpu())
        return torch.cat(chunks)

    @torch.no_grad()
    def texts(self, texts: Sequence[str]) -> torch.Tensor:
        """Unit-norm text embeddings (N, D); texts longer than CLIP's 77 tokens are truncated."""
        inputs = self.processor(text=list(texts), padding=True, truncation=True, max_length=77, return_tensors="pt")
        inputs = {key: value.to(self.device) for key, value in inputs.items() if key in ("input_ids", "attention_mask")}
        features = _projected(self.model.get_text_features(**inputs))
        return torch.nn.functional.normalize(features.float(), dim=-1).cpu()

    @property
    def logit_scale(self) -> float:
        return float(self.model.logit_scale.detach().exp())


def load_clip(folder: str | None, field: str, example: str, device: str = "cpu",
              processor_folder: str | None = None) -> CLIP:
    """The CLIPModel in `folder` with the processor in `processor_folder` (default: the same folder)."""
    path = check_model_folder(folder, field, ("clip",), example)  # before transformers: a bad folder fails at once
    from transformers import AutoProcessor, CLIPModel

    processor_path = path if processor_folder is None else processor_folder
    try:
        processor = AutoProcessor.from_pretrained(processor_path)
    except (OSError, ValueError) as error:
        raise_from = f"{field}: no CLIP processor in {processor_path} ({str(error).splitlines()[0][:120]})"
        from spotlight.rewards.base import RewardError

        raise RewardError(f"{raise_from}; save the processor there too (processor.save_pretrained)") from None
    return CLIP(CLIPModel.from_pretrained(path).to(device).eval(), processor, device)
