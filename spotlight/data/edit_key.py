"""An edit sample's key: its instruction and the path of its source image, in one string.

Prompts travel through the loop, the Ray queue and the generators as plain strings (and are hashed into
prompt ids, `spotlight.models.pipelines.prompts`). An edit dataset lists one instruction with many
images, so the instruction alone does not name a sample: the row does. The key is the instruction
followed by ``SOURCE_MARK`` and the image's absolute path, readable in logs and reports, and split back
wherever the text encoder or a reward needs the two halves.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["SOURCE_MARK", "edit_sample_key", "split_sample_key"]

SOURCE_MARK = " @source:"  # between the instruction and its source image's path


def edit_sample_key(instruction: str, image: str | Path) -> str:
    """The key of the row that edits ``image`` (made absolute) by ``instruction``."""
    if SOURCE_MARK in instruction:
        raise ValueError(f"an edit instruction may not contain {SOURCE_MARK!r} (got {instruction!r}): reword it")
    return f"{instruction}{SOURCE_MARK}{Path(image).expanduser().resolve()}"


def split_sample_key(key: str) -> tuple[str, str | None]:
    """(instruction, source image path) of an edit key; (key, None) for a plain text-to-image prompt."""
    instruction, mark, path = key.rpartition(SOURCE_MARK)
    return (instruction, path) if mark else (key, None)
