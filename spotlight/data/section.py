"""The ``data`` section of a training config: which prompts a run trains and validates on."""

from __future__ import annotations

from spotlight.schema import Section


class DataSection(Section):
    """``dataset``: a folder in flow_grpo's layout or a shipped set (``ocr``, ``geneval``); null: the task's prompts."""

    dataset: str | None = None
