"""Prompt conditioning from a pipeline's own text encoders, computed once per prompt and cached.

Why prompt ids and not embeddings travel through the loop. The loop, the updates, exploration, the
Ray queue and checkpoints all carry a prompt as a small integer tensor (the ``tokens`` of
``Policy.__call__``): it batches, slices and moves between processes for free. A real pipeline's
conditioning is large (Qwen-Image: ~200 x 3584 floats per prompt) and costs a multi-billion-parameter
text encoder to compute. So a pipeline policy's "tokens" are **prompt ids**: a 63-bit hash of the
prompt's text, which every process computes alike with no shared prompt list, and which index a
per-process cache of the embeddings ``pipe.encode_prompt`` returned for that prompt. A process encodes
a prompt the first time it sees its text (`PromptCache.ids`); after that the text encoders are not
needed for it and can leave the device (`offload`) or be dropped (`release`). An id this process never
encoded is refused in one line rather than looked up wrong.

Each prompt is encoded alone, exactly as ``pipe.encode_prompt(prompt)`` encodes it (a batched call
would pad Qwen-Image's prompts to a common length and change nothing but float rounding), so the
cached rows equal the pipeline's own embeddings bit for bit.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from spotlight.models.pipelines.inputs import PromptEmbeddings
from spotlight.models.pipelines.loading import quiet_loading
from spotlight.models.pipelines.folder import PipelineFolder

__all__ = ["DEFAULT_MAX_SEQUENCE_LENGTH", "PromptCache", "prompt_id"]

# what each family's pipeline __call__ passes to encode_prompt by default
DEFAULT_MAX_SEQUENCE_LENGTH = {"sd3": 256, "flux": 512, "qwen-image": 512}


def prompt_id(prompt: str) -> int:
    """The prompt's id: a 63-bit BLAKE2b hash of its UTF-8 text (non-negative, fits int64, same in every process)."""
    digest = hashlib.blake2b(prompt.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


class PromptCache:
    """Text -> prompt id -> ``PromptEmbeddings`` rows, encoded by the folder's pipeline (text encoders only).

    ``device``: where the text encoders run while encoding; with ``offload`` (the default) they go back
    to the CPU after every call that encoded new prompts, so on a GPU they hold no memory between
    encodings. The cached rows stay on the CPU in the encoders' dtype.
    """

    def __init__(self, folder: PipelineFolder, dtype: torch.dtype, max_sequence_length: int | None = None,
                 device: torch.device | str = "cpu", offload: bool = True) -> None:
        self.folder = folder
        self.family = folder.family
        self.dtype = dtype
        self.max_sequence_length = max_sequence_length or DEFAULT_MAX_SEQUENCE_LENGTH[folder.family]
        self.device = torch.device(device)
        self.offload = offload
        self._pipe: Any = None
        self._released = False
        self._rows: dict[int, PromptEmbeddings] = {}
        self._texts: dict[int, str] = {}

    def __deepcopy__(self, memo: dict[int, Any]) -> PromptCache:
        """Shared, not copied: the encoders are frozen and the cache a pure function of the text, so the
        loop's copies of a policy (EMA, the previous weights) use one cache and one set of encoders."""
        return self

    # --- encoding ------------------------------------------------------------------------------

    def _pipeline(self) -> Any:
        if self._released:
            raise RuntimeError("the text encoders were released (PromptCache.release): encode every prompt "
                               "before releasing them, or keep them")
        if self._pipe is None:
            import diffusers

            from spotlight.models.pipelines.folder import PIPELINE_FAMILIES

            name = next(cls for cls, family in PIPELINE_FAMILIES.items() if family == self.family)
            # the text half of the pipeline: its encode_prompt is the reference we must equal
            with quiet_loading():
                self._pipe = getattr(diffusers, name).from_pretrained(
                    str(self.folder.path), transformer=None, vae=None, dtype=self.dtype)
            self._pipe.set_progress_bar_config(disable=True)
            for component in self._pipe.components.values():
                if isinstance(component, torch.nn.Module):
                    component.requires_grad_(False).eval()
        return self._pipe

    @contextlib.contextmanager
    def _encoding(self) -> Iterator[Any]:
        """The pipeline on ``device`` for one batch of new prompts (then back to the CPU with ``offload``),
        its per-prompt truncation warnings muted: the length is the user's choice (max_sequence_length)."""
        pipe = self._pipeline()
        if self.device.type != "cpu":
            pipe.to(self.device)
        pipeline_log = logging.getLogger(type(pipe).__module__)
        level = pipeline_log.level
        pipeline_log.setLevel(logging.ERROR)
        try:
            with torch.no_grad():
                yield pipe
        finally:
            pipeline_log.setLevel(level)
            if self.offload and self.device.type != "cpu":
                pipe.to("cpu")

    def _encode(self, pipe: Any, prompt: str) -> PromptEmbeddings:
        """``pipe.encode_prompt`` of one prompt, as the family's pipeline calls it; rows on the CPU."""
        if self.family == "sd3":
            embeds, _, pooled, _ = pipe.encode_prompt(
                prompt=[prompt], prompt_2=None, prompt_3=None, device=self.device,
                do_classifier_free_guidance=False, max_sequence_length=self.max_sequence_length)
            row = PromptEmbeddings(embeds=embeds, pooled=pooled)
        elif self.family == "flux":
            embeds, pooled, _ = pipe.encode_prompt(prompt=[prompt], prompt_2=None, device=self.device,
                                                   max_sequence_length=self.max_sequence_length)
            row = PromptEmbeddings(embeds=embeds, pooled=pooled)
        else:
            embeds, mask = pipe.encode_prompt(prompt=[prompt], device=self.device,
                                              max_sequence_length=self.max_sequence_length)
            if mask is not None:  # one prompt: padding only if the pipeline kept some; drop it
                embeds = embeds[:, : int(mask[0].sum())]
            row = PromptEmbeddings(embeds=embeds)
        return row.to(device="cpu")

    def ids(self, prompts: Sequence[str]) -> torch.Tensor:
        """Prompt ids (B,) int64 of ``prompts``, encoding (once) each prompt not yet cached.

        The new prompts of one call are encoded with the encoders moved to ``device`` once, so warming
        the cache with a whole prompt list (``ids(train + test)``) costs one move, not one per prompt.
        """
        keys = []
        for prompt in prompts:
            if not isinstance(prompt, str):
                raise TypeError(f"prompts must be strings (got {type(prompt).__name__}): pass the prompt texts")
            key = prompt_id(prompt)
            if key in self._texts and self._texts[key] != prompt:  # 2^-63 a pair; never condition on another text
                raise RuntimeError(f"prompts {self._texts[key]!r} and {prompt!r} hash to the same id: report this")
            self._texts.setdefault(key, prompt)
            keys.append(key)
        new = [key for key in dict.fromkeys(keys) if key not in self._rows]
        if new:
            with self._encoding() as pipe:
                for key in new:
                    self._rows[key] = self._encode(pipe, self._texts[key])
        return torch.tensor(keys, dtype=torch.int64)

    def release(self) -> None:
        """Drop the text encoders: the cached prompts stay usable, a new prompt raises."""
        self._pipe = None
        self._released = True

    # --- lookup --------------------------------------------------------------------------------

    def text(self, key: int) -> str:
        """The prompt text of a cached id."""
        return self._texts[key]

    def embeddings(self, ids: torch.Tensor) -> PromptEmbeddings:
        """The batch (B, L, D) of cached prompts ``ids`` (B,); Qwen-Image's are padded to the longest, with a mask.

        The mask is None when no row is padded, as the pipeline passes it for prompts of one length.
        """
        rows = []
        for key in ids.reshape(-1).tolist():
            if key not in self._rows:
                raise KeyError(f"prompt id {key} was never encoded in this process: turn prompts into ids with "
                               "spotlight.models.generation.prompt_tokens(policy, prompts) here, not in another process")
            rows.append(self._rows[key])
        lengths = [row.embeds.shape[1] for row in rows]
        longest = max(lengths)
        if all(length == longest for length in lengths):
            return PromptEmbeddings(embeds=torch.cat([row.embeds for row in rows]),
                                    pooled=None if rows[0].pooled is None else torch.cat([row.pooled for row in rows]))
        embeds = torch.zeros(len(rows), longest, rows[0].embeds.shape[2], dtype=rows[0].embeds.dtype)
        mask = torch.zeros(len(rows), longest, dtype=torch.bool)
        for index, (row, length) in enumerate(zip(rows, lengths, strict=True)):
            embeds[index, :length] = row.embeds[0]
            mask[index, :length] = True
        return PromptEmbeddings(embeds=embeds, mask=mask)
