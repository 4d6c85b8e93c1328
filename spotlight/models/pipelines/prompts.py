"""Prompt conditioning from a pipeline's own text encoders, computed once per prompt and cached.

Why prompt ids and not embeddings travel through the loop. The loop, the updates, exploration, the
Ray queue and checkpoints all carry a prompt as a small integer tensor (the ``tokens`` of
``Policy.__call__``): it batches, slices and moves between processes for free. A real pipeline's
conditioning is large (Qwen-Image: ~200 x 3584 floats per prompt) and costs a multi-billion-parameter
text encoder to compute. So a pipeline policy's "tokens" are **prompt ids**: a 63-bit hash of the
prompt's text, which every process computes alike with no shared prompt list, and which index a
per-process cache of the embeddings ``pipe.encode_prompt`` returned for that prompt. An id this process
never encoded is refused in one line rather than looked up wrong.

Where the text encoders live (`PromptCache.placement`). The encoders are large (T5-XXL + two CLIPs
~10 GB, Qwen2.5-VL-7B ~17 GB in bfloat16): moving them to the GPU and back whenever an iteration brings
a prompt not yet cached costs more than the iteration's sampling. A training run therefore chooses one
of two placements at start (`spotlight.loop.text_encoders`), after which no encoder
weight crosses between host and device inside the loop:

- ``resident``: the encoders go to the device once and stay; an iteration's new prompts are encoded
  there, in one batched call;
- ``precomputed``: every prompt the run will see (training and validation prompts, the negative
  prompt) is encoded once before the loop (`PromptCache.precompute`: the encoders on the device once,
  batches of ``ENCODE_BATCH``), and the encoders go back to the CPU for good. A prompt outside that set
  (none in a training run) is encoded on the CPU where they now sit, with a warning.

A process that chose neither (a spot device, a test, a tool) encodes on demand (``offload``): the
encoders come to the device for each call that brings new prompts, all of them in batches, and leave
after it.

Batches: on an accelerator the new prompts of a call are encoded ``ENCODE_BATCH`` at a time. SD3's and
FLUX's encoders pad every prompt to ``max_sequence_length`` and Qwen-Image's rows are cut back to each
prompt's own length (the pipeline pads a batch to its longest prompt and masks the rest), so a batched
row is the prompt's own embedding up to float rounding: a matrix product of 32 rows is blocked unlike one
of 1 (CLIP's pooled projection differs in the last bits; tests/models/test_prompt_batches.py bounds it).
On the CPU, where nothing crosses to a device and runs are tests and toys, each prompt is encoded alone,
so the rows equal ``pipe.encode_prompt(prompt)`` bit for bit (tests/models/test_pipeline_policy.py).

The cache lives on the device the encoders run on (the transformer's): ~4 MB a prompt for FLUX's
512 T5 tokens, 3.2 GB for the OCR recipe's ~800 prompts, against 10-17 GB of encoders. So binding a
batch (below) copies nothing from the host. `export` hands rows to another process on the CPU, and
`adopt` moves them onto this process's device once.

Why a bound `PromptBatch` for the loops. Turning ids into embeddings means reading the ids on the host
(a device-to-host sync when they sit on an accelerator) and gathering rows: done at every forward, that
is a sync per denoising step. A `PromptBatch` does it once for a rollout chunk or an update's minibatch
(`PipelinePolicy.bind_prompts`): the batch's distinct prompts' rows are gathered on the device, and
what decides shapes (each row's text length, whether it is guided) stays on the host as plain Python
values, beside a device copy of the lengths for the attention mask. Slicing it (``batch[part]``, a
micro-batch) and building a forward's input from it (`forward_embeddings`) then read nothing from the
device and copy nothing to it, so the denoising loop and the update's inner loop never wait.

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
from typing import Any, Literal

import torch
import torch.nn.functional as F

from spotlight.diffusion.sampler import to_device
from spotlight.models.editing.condition import split_edit_rows, text_encoder_images
from spotlight.models.editing.qwen_processor import pipeline_parts
from spotlight.models.pipelines.folder import PipelineFolder
from spotlight.models.pipelines.inputs import PromptEmbeddings
from spotlight.models.pipelines.loading import quiet_loading

__all__ = ["DEFAULT_MAX_SEQUENCE_LENGTH", "ENCODE_BATCH", "Placement", "PromptBatch", "PromptCache", "bind_prompts",
           "prompt_id", "stack_rows"]

logger = logging.getLogger(__name__)

# what each family's pipeline __call__ passes to encode_prompt by default
DEFAULT_MAX_SEQUENCE_LENGTH = {"sd3": 256, "flux": 512, "qwen-image": 512, "wan": 512}
# prompts per encode_prompt call on an accelerator: a T5-XXL / Qwen2.5-VL forward of 32 x 512 tokens is a
# few GB of activations (on the CPU: 1, the pipeline's own rows bit for bit; module docstring)
ENCODE_BATCH = 32
CPU = torch.device("cpu")

Placement = Literal["offload", "resident", "precomputed"]


def prompt_id(prompt: str) -> int:
    """The prompt's id: a 63-bit BLAKE2b hash of its UTF-8 text (non-negative, fits int64, same in every process)."""
    digest = hashlib.blake2b(prompt.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


class PromptCache:
    """Text -> prompt id -> ``PromptEmbeddings`` rows, encoded by the folder's pipeline (text encoders only).

    ``device``: where the encoders run and the cached rows live (the transformer's device; setting it moves
    the rows already cached). ``placement`` (module docstring): ``offload`` until the run chooses
    (`keep_resident` or `precompute`). ``encode_batch``: prompts per ``encode_prompt`` call (None:
    ``ENCODE_BATCH`` on an accelerator, 1 on the CPU).
    """

    def __init__(self, folder: PipelineFolder, dtype: torch.dtype, max_sequence_length: int | None = None,
                 device: torch.device | str = "cpu", encode_batch: int | None = None) -> None:
        self.folder = folder
        self.family = folder.family
        self.dtype = dtype
        self.max_sequence_length = max_sequence_length or DEFAULT_MAX_SEQUENCE_LENGTH[folder.family]
        self.encode_batch = encode_batch
        self.placement: Placement = "offload"
        self._device = torch.device(device)
        self._pipe: Any = None
        self._encoders_on = CPU  # where the loaded encoders' weights are
        self._released = False
        self._warned = False
        self._rows: dict[int, PromptEmbeddings] = {}
        self._texts: dict[int, str] = {}
        self.condition: Any = None  # an edit folder's `spotlight.models.editing.condition.ConditionImages`

    def __deepcopy__(self, memo: dict[int, Any]) -> PromptCache:
        """Shared, not copied: the encoders are frozen and the cache a pure function of the text, so the
        loop's copies of a policy (EMA, the previous weights) use one cache and one set of encoders."""
        return self

    @property
    def device(self) -> torch.device:
        return self._device

    @device.setter
    def device(self, device: torch.device | str) -> None:
        """Where the rows live and the encoders run from now on; rows cached elsewhere move once (set-up time)."""
        self._device = torch.device(device)
        self._rows = {key: _on(row, self._device) for key, row in self._rows.items()}
        if self.placement == "resident" and self._pipe is not None:
            self._place(self._device)

    # --- where the encoders live -------------------------------------------------------------------

    def keep_resident(self) -> None:
        """Load the encoders onto ``device`` now and keep them there: no later encoding moves a weight."""
        self.placement = "resident"
        self._place(self.device)

    def precompute(self, prompts: Sequence[str]) -> None:
        """Encode ``prompts`` (every prompt of the run) in batches with the encoders on ``device`` once, then
        send the encoders back to the CPU for good: the loop finds every prompt cached."""
        self.placement = "offload"
        self.ids(prompts)
        self.placement = "precomputed"
        if self._pipe is not None:
            self._place(CPU)
        if self.device.type == "cuda":
            torch.cuda.empty_cache()  # the encoders' blocks back to the driver, for the transformer's use

    def _place(self, device: torch.device) -> None:
        """The encoders on ``device`` (a no-op where they are already): the only place their weights move."""
        pipe = self._pipeline()
        if device != self._encoders_on:
            pipe.to(device)
            self._encoders_on = device

    # --- encoding ------------------------------------------------------------------------------

    def _pipeline(self) -> Any:
        if self._released:
            raise RuntimeError("the text encoders were released (PromptCache.release): encode every prompt "
                               "before releasing them, or keep them")
        if self._pipe is None:
            import diffusers

            name = str(self.folder.index.get("_class_name"))  # the folder's own pipeline (Kontext: its own)
            # the text half of the pipeline: its encode_prompt is the reference we must equal
            with quiet_loading():
                self._pipe = getattr(diffusers, name).from_pretrained(  # parts: Qwen-Image-Edit's processor
                    str(self.folder.path), transformer=None, vae=None, dtype=self.dtype, **pipeline_parts(self.folder))
            self._pipe.set_progress_bar_config(disable=True)
            for component in self._pipe.components.values():
                if isinstance(component, torch.nn.Module):
                    component.requires_grad_(False).eval()
            self._encoders_on = CPU
        return self._pipe

    @contextlib.contextmanager
    def _encoding(self) -> Iterator[tuple[Any, torch.device]]:
        """The pipeline and the device it encodes on, for one call's new prompts (module docstring: where it
        runs by ``placement``), its truncation warnings muted: the length is the user's choice."""
        pipe = self._pipeline()
        runs_on = CPU if self.placement == "precomputed" else self.device
        self._place(runs_on)
        pipeline_log = logging.getLogger(type(pipe).__module__)
        level = pipeline_log.level
        pipeline_log.setLevel(logging.ERROR)
        try:
            with torch.no_grad():
                yield pipe, runs_on
        finally:
            pipeline_log.setLevel(level)
            if self.placement == "offload":
                self._place(CPU)

    def _encode(self, pipe: Any, prompts: list[str], device: torch.device) -> list[PromptEmbeddings]:
        """``pipe.encode_prompt`` of a batch of prompts, as the family's pipeline calls it: one row each, on
        ``device`` (Qwen-Image's cut to the prompt's own length); an edit key's row also holds its source image's
        latents (``condition``), the text encoders seeing only its instruction."""
        prompts, sources = split_edit_rows(prompts, self.condition, self.folder)
        if self.family == "sd3":
            embeds, _, pooled, _ = pipe.encode_prompt(
                prompt=prompts, prompt_2=None, prompt_3=None, device=device,
                do_classifier_free_guidance=False, max_sequence_length=self.max_sequence_length)
            lengths = [embeds.shape[1]] * len(prompts)
        elif self.family == "flux":
            embeds, pooled, _ = pipe.encode_prompt(prompt=prompts, prompt_2=None, device=device,
                                                   max_sequence_length=self.max_sequence_length)
            lengths = [embeds.shape[1]] * len(prompts)
        elif self.family == "wan":  # zero-padded to full length; the transformer attends to it, as in the pipeline
            embeds, _ = pipe.encode_prompt(prompt=prompts, do_classifier_free_guidance=False, device=device,
                                           max_sequence_length=self.max_sequence_length)
            pooled, lengths = None, [embeds.shape[1]] * len(prompts)
        else:
            embeds, mask = pipe.encode_prompt(prompt=prompts, device=device,  # Qwen-Image-Edit's: + source images
                                              max_sequence_length=self.max_sequence_length,
                                              **text_encoder_images(self.condition, sources))
            pooled = None
            # the batch is padded to its longest prompt: each row keeps its own length (one read per batch)
            lengths = [embeds.shape[1]] * len(prompts) if mask is None else mask.sum(dim=1).tolist()
        images = dict(zip((path for path in sources if path), self.condition.encode([p for p in sources if p]),
                          strict=True)) if any(sources) else {}  # each source once, however many rows name it
        return [PromptEmbeddings(embeds=embeds[index:index + 1, :length].clone(),
                                 pooled=None if pooled is None else pooled[index:index + 1].clone(),
                                 image=images[sources[index]].to(device) if sources and sources[index] else None)
                for index, length in enumerate(lengths)]

    def _encode_new(self, keys: Sequence[int]) -> None:
        """Encode the prompts of ``keys`` not yet cached, ``encode_batch`` at a time, in one placement of the
        encoders; the rows land on ``device``."""
        new = [key for key in dict.fromkeys(keys) if key not in self._rows]
        if not new:
            return
        if self.placement == "precomputed" and not self._warned:
            self._warned = True
            logger.warning("a prompt outside the precomputed set (%r): encoding it on the CPU, where the text "
                           "encoders sit (model.text_encoders precompute); list it in the dataset, or set "
                           "model.text_encoders resident", self._texts[new[0]][:60])
        with self._encoding() as (pipe, runs_on):
            size = self.encode_batch or (1 if runs_on.type == "cpu" else ENCODE_BATCH)
            for start in range(0, len(new), size):
                batch = new[start:start + size]
                rows = self._encode(pipe, [self._texts[key] for key in batch], runs_on)
                self._rows.update({key: _on(row, self.device) for key, row in zip(batch, rows, strict=True)})

    def _keys(self, prompts: Sequence[str]) -> list[int]:
        """Prompt ids of ``prompts``, encoding (once) each prompt not yet cached."""
        keys = []
        for prompt in prompts:
            if not isinstance(prompt, str):
                raise TypeError(f"prompts must be strings (got {type(prompt).__name__}): pass the prompt texts")
            key = prompt_id(prompt)
            if key in self._texts and self._texts[key] != prompt:  # 2^-63 a pair; never condition on another text
                raise RuntimeError(f"prompts {self._texts[key]!r} and {prompt!r} hash to the same id: report this")
            self._texts.setdefault(key, prompt)
            keys.append(key)
        self._encode_new(keys)
        return keys

    def ids(self, prompts: Sequence[str]) -> torch.Tensor:
        """Prompt ids (B,) int64 on the CPU of ``prompts``, encoding (once, in batches) each prompt not yet cached."""
        return torch.tensor(self._keys(prompts), dtype=torch.int64)

    def export(self, prompts: Sequence[str]) -> dict[int, tuple[str, PromptEmbeddings]]:
        """``prompts``' texts and cached rows (on the CPU) by id, encoding any not yet cached: what `adopt` takes
        in another process, so that K trainer ranks each encode 1/K of an iteration's prompts, not all of them."""
        keys = self._keys(prompts)
        return {key: (self._texts[key], _on(self._rows[key], CPU)) for key in dict.fromkeys(keys)}

    def adopt(self, rows: dict[int, tuple[str, PromptEmbeddings]]) -> None:
        """Rows another process encoded (`export`) into this cache, onto ``device``; a prompt already cached keeps
        its own."""
        for key, (text, row) in rows.items():
            if self._texts.setdefault(key, text) != text:
                raise RuntimeError(f"prompts {self._texts[key]!r} and {text!r} hash to the same id: report this")
            if key not in self._rows:
                self._rows[key] = _on(row, self.device)

    def release(self) -> None:
        """Drop the text encoders: the cached prompts stay usable, a new prompt raises."""
        self._pipe = None
        self._released = True

    @property
    def cached_bytes(self) -> int:
        """Bytes of the cached rows (what the cache holds on ``device``)."""
        return sum(row.embeds.nbytes + sum(0 if part is None else part.nbytes for part in (row.pooled, row.image))
                   for row in self._rows.values())

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
        """A `PromptBatch` of prompt ids ``keys`` on ``device``: the distinct prompts' rows (cached there) gathered;
        ``negative_prompt`` (None: no true CFG) encoded if new and kept beside them. Nothing is read back from
        the device; the row positions and lengths go there through pinned memory without waiting."""
        negative = None if negative_prompt is None else self._keys([negative_prompt])[0]
        distinct = list(dict.fromkeys(keys))
        table, lengths = stack_rows([_on(self.row(key), device) for key in distinct])
        where = {key: index for index, key in enumerate(distinct)}
        positions = to_device(torch.tensor([where[key] for key in keys], dtype=torch.int64), device)
        row_lengths = tuple(lengths[where[key]] for key in keys)
        rows = PromptEmbeddings(
            embeds=table.embeds.index_select(0, positions),
            pooled=None if table.pooled is None else table.pooled.index_select(0, positions),
            image=None if table.image is None else table.image.index_select(0, positions))
        negative_row = None if negative is None else _on(self.row(negative), device)
        negative_length = 0 if negative_row is None else negative_row.embeds.shape[1]
        bounds = to_device(torch.tensor([*row_lengths, negative_length], dtype=torch.int64), device)
        return PromptBatch(rows=rows, lengths=row_lengths, guided=tuple(guided), negative=negative_row,
                           negative_length=negative_length, bounds=bounds[:-1], negative_bound=bounds[-1:])

    def embeddings(self, ids: torch.Tensor) -> PromptEmbeddings:
        """The batch (B, L, D) of cached prompts ``ids`` (B,); Qwen-Image's are padded to the longest, with a mask.

        The mask is None when no row is padded, as the pipeline passes it for prompts of one length.
        """
        rows = [self.row(key) for key in ids.reshape(-1).tolist()]
        lengths = [row.embeds.shape[1] for row in rows]
        longest = max(lengths)
        if all(length == longest for length in lengths):
            return stack_rows(rows)[0]
        first = rows[0].embeds
        embeds = torch.zeros(len(rows), longest, first.shape[2], dtype=first.dtype, device=first.device)
        mask = torch.zeros(len(rows), longest, dtype=torch.bool, device=first.device)
        for index, (row, length) in enumerate(zip(rows, lengths, strict=True)):
            embeds[index, :length] = row.embeds[0]
            mask[index, :length] = True
        return PromptEmbeddings(embeds=embeds, mask=mask)



def _same_device(first: torch.device, second: torch.device) -> bool:
    """``cuda`` and ``cuda:0`` are one device (torch.device compares them unequal)."""
    return first.type == second.type and (first.index or 0) == (second.index or 0)


def _on(row: PromptEmbeddings, device: torch.device) -> PromptEmbeddings:
    """``row`` on ``device``: itself when it is there already (no copy, no call)."""
    return row if _same_device(row.embeds.device, device) else row.to(device=device)


# --- a batch bound to the device ------------------------------------------------------------


def bind_prompts(model: torch.nn.Module, tokens: torch.Tensor) -> Any:
    """``tokens`` ready for ``model``'s forward on its device, resolved once: a pipeline policy's `PromptBatch`
    (``bind_prompts`` of `spotlight.models.pipelines.policy.PipelinePolicy`), else the token ids moved there.

    Call it outside a loop of forwards: it may read the ids on the host; what it returns never does.
    ``model`` may be a DDP wrapper (its ``module`` binds).
    """
    policy = getattr(model, "module", model)
    bind = getattr(policy, "bind_prompts", None)
    if bind is not None:
        return bind(tokens)
    device = next(policy.parameters()).device
    if not isinstance(tokens, torch.Tensor):  # PromptEmbeddings a caller encoded itself
        return tokens.to(device=device)
    return tokens if _same_device(tokens.device, device) else to_device(tokens, device)


def stack_rows(rows: list[PromptEmbeddings]) -> tuple[PromptEmbeddings, list[int]]:
    """Rows (each (1, L_i, D)) stacked into (N, max L_i, D), zero-padded, and their lengths; no mask."""
    lengths = [row.embeds.shape[1] for row in rows]
    longest = max(lengths)
    embeds = torch.cat([F.pad(row.embeds, (0, 0, 0, longest - row.embeds.shape[1])) for row in rows])
    pooled = None if rows[0].pooled is None else torch.cat([row.pooled for row in rows])
    if len({row.image is None for row in rows}) > 1:
        raise ValueError("a batch mixes edit rows (a source image) with plain prompts: an edit pipeline's batch "
                         "is all edit rows (instruction + \"image\" in the dataset)")
    image = None if rows[0].image is None else torch.cat([row.image for row in rows])
    return PromptEmbeddings(embeds=embeds, pooled=pooled, image=image), lengths


@dataclass(frozen=True)
class PromptBatch:
    """The conditioning of B rows on the device, with the shape-deciding facts on the host.

    ``rows``: (B, L, D) embeddings zero-padded to the longest row (and pooled (B, P)), no mask;
    ``lengths``: each row's real text length; ``guided``: whether each row asks for the classifier-free
    guided velocity; ``negative``: the negative prompt's (1, L_n, D) row, present when the policy runs
    true CFG (None: no row is guided, or guidance is an input of the model). ``bounds`` (B,) and
    ``negative_bound`` (1,): the same lengths as int64 tensors on the device, for the attention mask.
    """

    rows: PromptEmbeddings
    lengths: tuple[int, ...]
    guided: tuple[bool, ...]
    negative: PromptEmbeddings | None = None
    negative_length: int = 0
    bounds: torch.Tensor | None = None
    negative_bound: torch.Tensor | None = None

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
                           negative=self.negative, negative_length=self.negative_length,
                           bounds=None if self.bounds is None else self.bounds[part],
                           negative_bound=self.negative_bound)

    def guided_rows(self) -> list[int]:
        """Indices of the rows that run with a negative-prompt half (none without true CFG)."""
        if self.negative is None:
            return []
        return [index for index, guided in enumerate(self.guided) if guided]

    def forward_embeddings(self, guided_count: int) -> PromptEmbeddings:
        """The transformer's ``PromptEmbeddings`` for the B rows followed by ``guided_count`` negative rows.

        Trimmed (or zero-padded) to the longest of those rows, with a (B + G, L) mask only when some row
        is shorter, as `PromptCache.embeddings` gives it; every size is read from the host-side lengths and
        the mask is made from the device-side ones (no copy to the device per forward).
        """
        lengths = list(self.lengths) + [self.negative_length] * guided_count
        longest = max(lengths)
        parts = [_fit(self.rows, longest)]
        if guided_count:
            assert self.negative is not None  # guided_rows() is empty without it
            parts.append(_fit(self.negative, longest).expand(guided_count))
        embeds = torch.cat([part.embeds for part in parts])
        pooled = None if parts[0].pooled is None else torch.cat([part.pooled for part in parts])
        image = self.rows.image  # an edit row's source latents (no true CFG on an edit folder: no negative half)
        if all(length == longest for length in lengths):
            return PromptEmbeddings(embeds=embeds, pooled=pooled, image=image)
        positions = torch.arange(longest, device=embeds.device)
        bounds = self._bounds(guided_count, embeds.device)
        return PromptEmbeddings(embeds=embeds, pooled=pooled, mask=positions[None, :] < bounds[:, None], image=image)

    def _bounds(self, guided_count: int, device: torch.device) -> torch.Tensor:
        """The rows' lengths and ``guided_count`` negative lengths, (B + G,) on the device."""
        if self.bounds is None:  # a batch built by hand, without device lengths
            return to_device(torch.tensor(list(self.lengths) + [self.negative_length] * guided_count), device)
        if not guided_count:
            return self.bounds
        assert self.negative_bound is not None
        return torch.cat([self.bounds, self.negative_bound.expand(guided_count)])


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
