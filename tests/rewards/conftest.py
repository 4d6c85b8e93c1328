"""Tiny random reward models saved once per test session (building one takes about a second)."""

from __future__ import annotations

from pathlib import Path

import pytest
from tiny_models import save_tiny_clip, save_tiny_mask2former


@pytest.fixture(scope="session")
def tiny_clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_clip(tmp_path_factory.mktemp("models") / "tiny-clip")


@pytest.fixture(scope="session")
def tiny_detector(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_mask2former(tmp_path_factory.mktemp("models") / "tiny-mask2former")


@pytest.fixture(scope="session")
def tiny_hps(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict]:
    from tiny_models import save_tiny_hps

    return save_tiny_hps(tmp_path_factory.mktemp("models") / "tiny-hps")


@pytest.fixture(scope="session")
def tiny_imagereward(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict]:
    from tiny_models import save_tiny_imagereward

    return save_tiny_imagereward(tmp_path_factory.mktemp("models") / "tiny-imagereward")


@pytest.fixture(scope="session")
def tiny_qwen_vl(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tiny_models import save_tiny_qwen_vl

    return save_tiny_qwen_vl(tmp_path_factory.mktemp("models") / "tiny-qwen2.5-vl")
