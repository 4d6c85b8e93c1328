"""One loaded copy of each backbone: rewards that name the same folder share its weights.

A run mixing `aesthetic` with `clipscore` on the same CLIP ViT-L/14 folder, or two terms of one composite,
would otherwise hold the model twice on the reward's device. The key is the resolved path, the class that
loads it and the device, so a folder loaded as a vision tower and as a full CLIP are two entries.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from spotlight.rewards.base import RewardError
from spotlight.rewards.models.pixels import reward_dtype

_LOADED: dict[tuple[str, str, str], Any] = {}
_LOCK = threading.Lock()  # a worker process or the background reward thread may build rewards concurrently


def shared(path: str | Path, kind: str, device: str, load: Callable[[], Any]) -> Any:
    """The object `load()` returns for (path, kind, device), loaded once per process and then reused."""
    key = (str(Path(path).expanduser().resolve()), kind, device)
    with _LOCK:
        if key not in _LOADED:
            _LOADED[key] = load()
        return _LOADED[key]


def loaded_count() -> int:
    """How many backbones this process holds (tests check that two rewards shared one)."""
    return len(_LOADED)


def forget_all() -> None:
    """Drop every cached backbone (tests; a process that is done with its rewards)."""
    with _LOCK:
        _LOADED.clear()


def release_loaded(model: Any, missing: list[str], unexpected: list[str], where: str, layout: str,
                   device: str) -> Any:
    """``model`` after a non-strict ``load_state_dict`` of a release checkpoint (``where``: the field and file):
    one line naming the missing and unexpected weights (position ids, buffers transformers rebuilds, aside),
    else the model on ``device`` in the reward dtype, in eval mode."""
    missing = [name for name in missing if not name.endswith("position_ids")]
    if missing or unexpected:
        raise RewardError(f"{where}: weights missing {missing[:3]} / unexpected {unexpected[:3]}; expected {layout}")
    return model.to(device=device, dtype=reward_dtype(device)).eval()
