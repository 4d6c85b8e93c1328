"""Checks that a reward's model folder exists and holds the kind of model the reward needs.

A run that loads a PickScore folder as a detector, or a folder that is not there, should stop at
start-up with one line naming the field and the fix, not with a transformers traceback at the first
rollout. The kind is read from the folder's `config.json` (`model_type`), without loading weights.
"""

from __future__ import annotations

import json
from pathlib import Path

from spotlight.rewards.base import RewardError


def check_model_folder(folder: str | None, field: str, kinds: tuple[str, ...], example: str) -> Path:
    """`folder` as a Path if its config.json names one of `kinds`; RewardError in one line otherwise."""
    if folder is None:
        raise RewardError(f"{field} is not set; save the model with save_pretrained (e.g. {example}) and set "
                          f"{field} to that folder")
    path = Path(folder).expanduser()
    config = path / "config.json"
    if not config.is_file():
        what = "does not exist" if not path.exists() else "has no config.json"
        raise RewardError(f"{field} {folder} {what}; point it at a folder written by save_pretrained (e.g. {example})")
    try:
        kind = json.loads(config.read_text()).get("model_type")
    except (ValueError, OSError) as error:
        raise RewardError(f"{field} {folder}: config.json is unreadable ({error}); re-save the model") from None
    if kind not in kinds:
        raise RewardError(f"{field} {folder} holds a {kind!r} model, not {' or '.join(repr(k) for k in kinds)}; "
                          f"point it at {example}")
    return path
