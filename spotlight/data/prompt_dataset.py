"""Prompt datasets in flow_grpo's folder layout: what a run trains on and validates on.

A folder holds one of two layouts, which users of flow_grpo, DiffusionNFT and verl-omni already have:

- ``train.txt`` / ``test.txt``: one prompt a line (flow_grpo's OCR and PickScore sets);
- ``train_metadata.jsonl`` / ``test_metadata.jsonl``: one JSON object a line with at least ``prompt``;
  the rest (GenEval's ``tag``, ``include``, ``exclude``) is the prompt's metadata, which the reward
  reads (which objects, how many, which colour, where).

Prompts travel through the loop, the Ray devices and the generators as plain strings, so the
metadata is kept as a lookup from prompt text to its record (`PromptDataset.metadata_for`); a prompt
given twice must carry the same record. Repeated prompts are kept: flow_grpo's GenEval test split
lists each of its 553 prompts four times, GenEval's four images per prompt.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spotlight.data.edit_key import edit_sample_key, split_sample_key
from spotlight.schema import ConfigError

logger = logging.getLogger(__name__)

SPLITS = ("train", "test")
TEXT_SUFFIX = ".txt"
METADATA_SUFFIX = "_metadata.jsonl"


class DatasetError(ConfigError):
    """A prompt dataset that cannot be read; the message is one line naming the path and the fix."""


@dataclass(frozen=True)
class PromptDataset:
    """A run's prompts: the train split (rollouts), the test split (validation), their metadata.

    ``metadata`` maps a prompt to its record (empty for a ``*.txt`` dataset). ``kind_of`` names a
    prompt's kind for per-kind validation accuracy (GenEval's ``tag``; a task's own grammar), None
    when the dataset has no kinds.
    """

    name: str
    train: list[str]
    test: list[str]
    metadata: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    kinds: Mapping[str, str] = field(default_factory=dict)

    @property
    def has_metadata(self) -> bool:
        return bool(self.metadata)

    def metadata_for(self, prompts: Sequence[str]) -> list[Mapping[str, Any]] | None:
        """One metadata record per prompt (None for a dataset without metadata); KeyError names an unknown prompt."""
        if not self.metadata:
            return None
        missing = [prompt for prompt in prompts if prompt not in self.metadata]
        if missing:
            raise KeyError(f"prompt {missing[0]!r} is not in dataset {self.name}: its metadata is unknown")
        return [self.metadata[prompt] for prompt in prompts]

    def train_of_kinds(self, kinds: Sequence[str]) -> list[str]:
        """The train prompts of ``kinds``; ValueError naming the kinds there are when none matches or one is unknown."""
        known = sorted({kind for prompt in self.train if (kind := self.kind_of(prompt)) is not None})
        unknown = sorted(set(kinds) - set(known))
        if unknown:
            raise ValueError(f"data.train_kinds names {unknown}, which dataset {self.name} has not "
                             f"(its kinds: {known or 'none'}); list some of those, or set data.train_kinds to null")
        return [prompt for prompt in self.train if self.kind_of(prompt) in kinds]

    def kind_of(self, prompt: str) -> str | None:
        """The prompt's kind (e.g. GenEval's ``counting``), or None when the dataset names none."""
        return self.kinds.get(prompt)


def _read_lines(path: Path) -> list[str]:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise DatasetError(f"prompt file {path} is not UTF-8 text (byte {error.start}): save it as UTF-8") from None
    except OSError as error:
        raise DatasetError(f"prompt file {path} cannot be read ({error.strerror}): fix its permissions") from None
    return text.splitlines()


def read_prompt_file(path: Path) -> list[str]:
    """The prompts of a ``*.txt`` split: one a line, surrounding blanks stripped, empty lines skipped."""
    return [line.strip() for line in _read_lines(path) if line.strip()]


def read_metadata_file(path: Path) -> list[dict[str, Any]]:
    """The records of a ``*_metadata.jsonl`` split, each a JSON object with a non-empty string ``prompt``."""
    records = []
    for number, line in enumerate(_read_lines(path), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise DatasetError(f"{path} line {number} is not JSON ({error.msg}): one JSON object a line") from None
        prompt = record.get("prompt") if isinstance(record, dict) else None
        if not isinstance(prompt, str) or not prompt.strip():
            raise DatasetError(f"{path} line {number} has no \"prompt\" string: each line needs "
                               "{\"prompt\": \"...\", ...}")
        records.append(record)
    return records


def edit_row(record: dict[str, Any], folder: Path, meta: Path) -> dict[str, Any]:
    """An edit dataset's row (an ``"image"`` beside the instruction) as the loop carries it: ``prompt`` becomes
    the row's key (instruction + the image's absolute path, `spotlight.data.edit_key`), since
    one instruction may come with many images; ``instruction`` keeps the text and ``image`` the absolute path,
    which an edit reward reads its source image from. A row without ``"image"`` is returned as it is."""
    image = record.get("image")
    if image is None:
        return record
    path = folder / image if isinstance(image, str) else None
    if path is None or not path.is_file():
        raise DatasetError(f"{meta}: the row {record['prompt']!r} names image {image!r}, which is not a file under "
                           f"{folder}: give each edit row's source image as a path relative to the dataset folder")
    key = edit_sample_key(record["prompt"], path)
    return {**record, "prompt": key, "instruction": record["prompt"], "image": split_sample_key(key)[1]}


def _split_files(folder: Path, split: str) -> tuple[Path | None, Path | None]:
    text, metadata = folder / f"{split}{TEXT_SUFFIX}", folder / f"{split}{METADATA_SUFFIX}"
    return (text if text.is_file() else None), (metadata if metadata.is_file() else None)


def load_prompt_folder(folder: str | Path) -> PromptDataset:
    """Read a dataset folder (module docstring); every way it can be unusable is one `DatasetError` line.

    Both splits must use the same layout: a metadata-aware reward would otherwise see records for
    the train prompts and none for the test prompts, or the other way round.
    """
    folder = Path(folder)
    expected = ("train.txt and test.txt, or train_metadata.jsonl and test_metadata.jsonl "
                "(flow_grpo's dataset layout)")
    if not folder.exists():
        raise DatasetError(f"data.dataset {folder} does not exist: point it at a folder holding {expected}, or "
                           "name a shipped set (ocr, geneval)")
    if not folder.is_dir():
        raise DatasetError(f"data.dataset {folder} is a file, not a folder: point it at a folder holding {expected}")
    files = {split: _split_files(folder, split) for split in SPLITS}
    uses_metadata = all(metadata is not None for _, metadata in files.values())
    if not uses_metadata and not all(text is not None for text, _ in files.values()):
        found = sorted(path.name for pair in files.values() for path in pair if path is not None)
        raise DatasetError(f"data.dataset {folder} holds {', '.join(found) or 'neither split'}: it needs {expected}")
    if not uses_metadata:  # one split's metadata beside the text layout: checked, and said to be unused
        for meta in (meta for _, meta in files.values() if meta is not None):
            read_metadata_file(meta)  # a broken file is an error, not silently left unread
            logger.warning(f"{meta} is not used: metadata is read when both splits have it "
                           f"({' and '.join(split + METADATA_SUFFIX for split in SPLITS)}); the prompts come from "
                           f"the {TEXT_SUFFIX} files")
    splits: dict[str, list[str]] = {}
    metadata: dict[str, dict[str, Any]] = {}
    kinds: dict[str, str] = {}
    for split, (text, meta) in files.items():
        if uses_metadata:
            assert meta is not None
            records = [edit_row(record, folder, meta) for record in read_metadata_file(meta)]
            for record in records:
                prompt = record["prompt"]
                if prompt in metadata and metadata[prompt] != record:
                    raise DatasetError(f"{meta}: prompt {prompt!r} appears with two different records: keep one, "
                                       "since the reward looks a prompt's record up by its text")
                metadata[prompt] = record
                if isinstance(record.get("tag"), str):
                    kinds[prompt] = record["tag"]
            splits[split] = [record["prompt"] for record in records]
            source = meta
        else:
            assert text is not None
            splits[split] = read_prompt_file(text)
            source = text
        if not splits[split]:
            raise DatasetError(f"{source} has no prompts: the {split} split needs at least one")
    return PromptDataset(name=str(folder), train=splits["train"], test=splits["test"], metadata=metadata, kinds=kinds)
