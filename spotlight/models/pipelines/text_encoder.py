"""A small frozen text encoder for diffusers transformers trained on a task's token ids.

The real pipelines encode prompts with T5 / CLIP (SD3, FLUX) or Qwen2.5-VL (Qwen-Image), which no
CPU test can download or run. A task's tokenizer (``spotlight.tasks``) gives token ids instead, and
this module turns them into what a transformer takes: per-token embeddings (B, L, D), a pooled
vector (B, P) where the family needs one, and the padding mask (token id 0 is padding). It is part
of the frozen base, like the real encoders under Flow-GRPO: LoRA adapts the transformer's text
projections to it, and its weights come from the base's seed, so they are never stored or sent.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from spotlight.models.pipelines.inputs import PromptEmbeddings


class TokenTextEncoder(nn.Module):
    """Token ids (B, L) -> ``PromptEmbeddings``: learned-position embeddings and a masked-mean pooled vector.

    ``pooled_width`` None: no pooled vector (Qwen-Image). The embeddings have unit scale, the range
    the transformers' text projections were designed for (T5 / CLIP outputs after their final norm).
    """

    def __init__(self, vocab_size: int, max_text_len: int, width: int, pooled_width: int | None) -> None:
        super().__init__()
        self.token_embed = nn.Embedding(vocab_size, width)
        self.position = nn.Parameter(torch.randn(1, max_text_len, width) * 0.1)
        self.pool = None if pooled_width is None else nn.Linear(width, pooled_width)
        self.requires_grad_(False)

    def forward(self, tokens: torch.Tensor) -> PromptEmbeddings:
        """Embeddings of ``tokens`` (B, L) int64, L <= max_text_len; mask True = a real token."""
        if tokens.dim() != 2 or tokens.shape[1] > self.position.shape[1]:
            raise ValueError(f"tokens must be (B, L) with L <= {self.position.shape[1]} (got shape "
                             f"{tuple(tokens.shape)}): tokenize with the policy's max_text_len")
        mask = tokens != 0
        embeds = self.token_embed(tokens) + self.position[:, : tokens.shape[1]]
        pooled = None
        if self.pool is not None:
            mean = (embeds * mask[..., None]).sum(1) / mask.sum(1, keepdim=True).clamp(min=1)
            pooled = self.pool(mean)
        return PromptEmbeddings(embeds=embeds, pooled=pooled, mask=mask)
