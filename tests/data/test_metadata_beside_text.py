"""A metadata file beside the text layout is read, not silently skipped: broken is an error, unused is said."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from spotlight.data.prompt_dataset import DatasetError, load_prompt_folder


def text_dataset(folder: Path) -> Path:
    folder.mkdir()
    (folder / "train.txt").write_text("a red circle\ntwo squares\n")
    (folder / "test.txt").write_text("a blue square\n")
    return folder


def test_a_broken_metadata_file_beside_the_text_files_is_one_line_naming_its_line(tmp_path: Path) -> None:
    folder = text_dataset(tmp_path / "data")
    (folder / "train_metadata.jsonl").write_text('{"prompt": "a red circle"}\n{"prompt": "two squ\n')
    with pytest.raises(DatasetError, match=r"train_metadata.jsonl line 2 is not JSON"):
        load_prompt_folder(folder)


def test_a_valid_metadata_file_of_one_split_is_reported_unused(tmp_path: Path, caplog) -> None:
    folder = text_dataset(tmp_path / "data")
    (folder / "train_metadata.jsonl").write_text('{"prompt": "a red circle", "tag": "colors"}\n')
    with caplog.at_level(logging.WARNING, logger="spotlight.data.prompt_dataset"):
        dataset = load_prompt_folder(folder)
    assert dataset.train == ["a red circle", "two squares"] and not dataset.has_metadata
    assert any("train_metadata.jsonl is not used" in record.getMessage() for record in caplog.records)
