"""The simulator's tests keep counted FLOPs in a temporary cache, never the user's (sim/planning/count_cache.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _private_count_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPOTLIGHT_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "count-cache"))
