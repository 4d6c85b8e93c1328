"""Shared fixtures: a tiny TinyDiT base model on disk, so pipeline tests run in seconds."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from spotlight.components.checkpoint import save_model
from spotlight.models.tinydit import TinyDiT, TinyDiTConfig
from spotlight.tasks.shapes import VOCAB


@pytest.fixture(scope="session")
def tiny_base_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A randomly initialised 32x32 TinyDiT (dim 32, one block) saved like a shipped base model."""
    torch.manual_seed(0)
    model = TinyDiT(TinyDiTConfig(dim=32, depth=1, num_heads=2, vocab_size=len(VOCAB), patch_size=8))
    with torch.no_grad():  # leave adaLN-Zero so that samples vary with the weights and the prompt
        for parameter in model.parameters():
            parameter.add_(0.02 * torch.randn_like(parameter))
    directory = tmp_path_factory.mktemp("base") / "tiny-base"
    save_model(directory, model, {"note": "random test model"})
    return directory


@pytest.fixture(scope="session")
def tiny_pipeline(tmp_path_factory: pytest.TempPathFactory):
    """``tiny_pipeline(family) -> folder``: a tiny random SD3 / FLUX / Qwen-Image pipeline folder
    (`spotlight.models.pipelines.tiny`), built at most once per family per test session."""
    from spotlight.models.pipelines.tiny import save_tiny_pipeline

    root = tmp_path_factory.mktemp("pipelines")
    built: dict[str, Path] = {}

    def folder(family: str) -> Path:
        if family not in built:
            built[family] = save_tiny_pipeline(family, root / family)
        return built[family]

    return folder
