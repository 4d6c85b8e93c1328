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

Why a bound `PromptBatch` for the loops. Turning ids into
embeddings means reading the ids on the host (a device-to-host sync when they sit on an accelerator),
looking rows up in a host-side cache, and copying them to the device: done at every forward, that is a
sync and a pageable copy of up to ~100 MB per denoising step. A `PromptBatch` does it once for a
rollout chunk or an update's minibatch (`PipelinePolicy.bind_prompts`): the embeddings of the batch's
distinct prompts go to the device in one copy and are gathered there, while what decides shapes (each
row's text length, whether it is guided) stays on the host as plain Python values. Slicing it
(``batch[part]``, a micro-batch) and building a forward's input from it (`forward_embeddings`) then read
no device value, so the denoising loop and the update's inner loop never wait for the device.

The embeddings a forward gets are equal, bit for bit, to what `PromptCache.embeddings` gives for the same
rows (the guided rows' negative-prompt half appended): the same rows, trimmed or zero-padded to the
forward's longest text, with a mask only when some row is padded.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from spotlight.models.pipelines.folder import PipelineFolder
from spotlight.models.pipelines.inputs import PromptEmbeddings
from spotlight.models.pipelines.loading import quiet_loading

__all__ = ["DEFAULT_MAX_SEQUENCE_LENGTH", "PromptBatch", "PromptCache", "bind_prompts", "prompt_id", "stack_rows"]

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

    def export(self, prompts: Sequence[str]) -> dict[int, tuple[str, PromptEmbeddings]]:
        """``prompts``' texts and cached rows by id (encoding any not yet cached): what `adopt` takes in another
        process, so that K trainer ranks each encode 1/K of an iteration's prompts instead of all of them."""
        keys = self.ids(prompts).tolist()
        return {key: (self._texts[key], self._rows[key]) for key in dict.fromkeys(keys)}

    def adopt(self, rows: dict[int, tuple[str, PromptEmbeddings]]) -> None:
        """Rows another process encoded (`export`) into this cache; a prompt already cached keeps its own."""
        for key, (text, row) in rows.items():
            if self._texts.setdefault(key, text) != text:
                raise RuntimeError(f"prompts {self._texts[key]!r} and {text!r} hash to the same id: report this")
            self._rows.setdefault(key, row)

    def release(self) -> None:
        """Drop the text encoders: the cached prompts stay usable, a new prompt raises."""
        self._pipe = None
        self._released = True

    # --- lookup --------------------------------------------------------------------------------

    def text(self, key: int) -> str:
        """The prompt text of a cached id."""
        return self._texts[key]

    def row(self, key: int) -> PromptEmbeddings:
        """The cached (1, L, D) embeddings of prompt id ``key``; a KeyError naming the fix if never encoded here."""
        if key not in self._rows:
            raise KeyError(f"prompt id {key} was never encoded in this process: turn prompts into ids with "
                           "spotlight.models.generation.prompt_tokens(policy, prompts) here, not in another process")
        return self._rows[key]

    def bind(self, keys: Sequence[int], guided: Sequence[bool], negative_prompt: str | None,
             device: torch.device) -> PromptBatch:
        """A `PromptBatch` of prompt ids ``keys`` on ``device``: the distinct prompts' rows copied there once and
        gathered; ``negative_prompt`` (None: no true CFG) encoded if new and kept beside them."""
        negative = None if negative_prompt is None else int(self.ids([negative_prompt])[0])
        distinct = list(dict.fromkeys(keys))
        table, lengths = stack_rows([self.row(key) for key in distinct])
        where = {key: index for index, key in enumerate(distinct)}
        positions = torch.tensor([where[key] for key in keys], dtype=torch.int64)
        on_device = table.to(device=device)
        rows = PromptEmbeddings(
            embeds=on_device.embeds.index_select(0, positions.to(device)),
            pooled=None if on_device.pooled is None else on_device.pooled.index_select(0, positions.to(device)))
        negative_row = None if negative is None else self.row(negative).to(device=device)
        return PromptBatch(rows=rows, lengths=tuple(lengths[where[key]] for key in keys), guided=tuple(guided),
                           negative=negative_row,
                           negative_length=0 if negative_row is None else negative_row.embeds.shape[1])

    def embeddings(self, ids: torch.Tensor) -> PromptEmbeddings:
        """The batch (B, L, D) of cached prompts ``ids`` (B,); Qwen-Image's are padded to the longest, with a mask.

        The mask is None when no row is padded, as the pipeline passes it for prompts of one length.
        """
        rows = [self.row(key) for key in ids.reshape(-1).tolist()]
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


# --- a batch bound to the device ------------------------------------------------------------


def bind_prompts(model: torch.nn.Module, tokens: torch.Tensor) -> Any:
    """``tokens`` ready for ``model``'s forward on its device, resolved once: a pipeline policy's `PromptBatch`
    (``bind_prompts`` of `spotlight.models.pipelines.policy.PipelinePolicy`), else the token ids moved there.

    Call it outside a loop of forwards: it may read the ids on the host; what it returns never does.
    ``model`` may be a DDP wrapper (its ``module`` binds).
    """
    policy = getattr(model, "module", model)
    bind = getattr(policy, "bind_prompts", None)
    return bind(tokens) if bind is not None else tokens.to(next(policy.parameters()).device)


def stack_rows(rows: list[PromptEmbeddings]) -> tuple[PromptEmbeddings, list[int]]:
    """Rows (each (1, L_i, D)) stacked into (N, max L_i, D), zero-padded, and their lengths; no mask."""
    lengths = [row.embeds.shape[1] for row in rows]
    longest = max(lengths)
    embeds = torch.cat([F.pad(row.embeds, (0, 0, 0, longest - row.embeds.shape[1])) for row in rows])
    pooled = None if rows[0].pooled is None else torch.cat([row.pooled for row in rows])
    return PromptEmbeddings(embeds=embeds, pooled=pooled), lengths


@dataclass(frozen=True)
class PromptBatch:
    """The conditioning of B rows on the device, with the shape-deciding facts on the host.

    ``rows``: (B, L, D) embeddings zero-padded to the longest row (and pooled (B, P)), no mask;
    ``lengths``: each row's real text length; ``guided``: whether each row asks for the classifier-free
    guided velocity; ``negative``: the negative prompt's (1, L_n, D) row, present when the policy runs
    true CFG (None: no row is guided, or guidance is an input of the model).
    """

    rows: PromptEmbeddings
    lengths: tuple[int, ...]
    guided: tuple[bool, ...]
    negative: PromptEmbeddings | None = None
    negative_length: int = 0

    def __len__(self) -> int:
        return len(self.lengths)

    @property
    def shape(self) -> tuple[int, int]:
        """(B, 2), the shape of the id rows it was bound from, for code that sizes a batch by its tokens."""
        return (len(self.lengths), 2)

    def __getitem__(self, part: slice) -> PromptBatch:
        """The rows of a slice (a micro-batch): views of the device tensors, no device read."""
        if not isinstance(part, slice):
            raise TypeError(f"a PromptBatch is sliced by row ranges (got {type(part).__name__}): bind the rows "
                            "you need with policy.bind_prompts(tokens[rows])")
        return PromptBatch(rows=self.rows[part], lengths=self.lengths[part], guided=self.guided[part],
                           negative=self.negative, negative_length=self.negative_length)

    def guided_rows(self) -> list[int]:
        """Indices of the rows that run with a negative-prompt half (none without true CFG)."""
        if self.negative is None:
            return []
        return [index for index, guided in enumerate(self.guided) if guided]

    def forward_embeddings(self, guided_count: int) -> PromptEmbeddings:
        """The transformer's ``PromptEmbeddings`` for the B rows followed by ``guided_count`` negative rows.

        Trimmed (or zero-padded) to the longest of those rows, with a (B + G, L) mask only when some row
        is shorter, as `PromptCache.embeddings` gives it; every size is read from the host-side lengths.
        """
        lengths = list(self.lengths) + [self.negative_length] * guided_count
        longest = max(lengths)
        parts = [_fit(self.rows, longest)]
        if guided_count:
            assert self.negative is not None  # guided_rows() is empty without it
            parts.append(_fit(self.negative, longest).expand(guided_count))
        embeds = torch.cat([part.embeds for part in parts])
        pooled = None if parts[0].pooled is None else torch.cat([part.pooled for part in parts])
        if all(length == longest for length in lengths):
            return PromptEmbeddings(embeds=embeds, pooled=pooled)
        positions = torch.arange(longest, device=embeds.device)
        bounds = torch.tensor(lengths, device="cpu").to(embeds.device, non_blocking=True)  # host list: no sync
        return PromptEmbeddings(embeds=embeds, pooled=pooled, mask=positions[None, :] < bounds[:, None])


@dataclass(frozen=True)
class _Fitted:
    embeds: torch.Tensor
    pooled: torch.Tensor | None

    def expand(self, count: int) -> _Fitted:
        return _Fitted(self.embeds.expand(count, -1, -1),
                       None if self.pooled is None else self.pooled.expand(count, -1))


def _fit(rows: PromptEmbeddings, length: int) -> _Fitted:
    """``rows`` cut or zero-padded to ``length`` text positions (their padding is zeros already)."""
    have = rows.embeds.shape[1]
    embeds = rows.embeds[:, :length] if have >= length else F.pad(rows.embeds, (0, 0, 0, length - have))
    return _Fitted(embeds, rows.pooled)
