"""Shared fixtures: a tiny TinyDiT base model on disk, so pipeline tests run in seconds; and the order in
which the test files are handed to the xdist workers."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from spotlight.components.checkpoint import save_model
from spotlight.models.tinydit import TinyDiT, TinyDiTConfig
from spotlight.tasks.shapes import VOCAB


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Files with a test marked ``slow`` first, each file's tests still together and in their order.

    ``--dist loadfile`` hands the workers whole files in collection order, and the end-to-end files
    (tens of seconds to minutes each) sort last (``tests/test_*.py``): one of them started at the end
    kept one worker busy while the other sat idle. Started first, the slow files overlap each other and
    the hundreds of short files fill both workers to the end. The sort is stable and the same in every
    worker, as xdist requires.
    """
    slow_files = {item.path for item in items if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: item.path not in slow_files)


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
