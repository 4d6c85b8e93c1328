"""The ``data`` section of a training config: which prompts a run trains and validates on."""

from __future__ import annotations

from pydantic import Field

from spotlight.schema import Section


class DataSection(Section):
    """``dataset``: a folder in flow_grpo's layout or a shipped set (``ocr``, ``geneval``); null: the task's prompts."""

    dataset: str | None = None
    # train on these kinds of prompt only (e.g. [counting, position]: the hard ones, where most random
    # groups score alike); validation keeps every kind, so scores stay comparable. null: every kind
    train_kinds: list[str] | None = Field(None, min_length=1)
