"""Tasks: prompt sets with their train / validation split, tokenizers and renderers (see registry)."""

from typing import Literal

TaskName = Literal["shapes", "ocr"]  # the names spotlight.task_presets.TASKS knows; kept here, torch-free
