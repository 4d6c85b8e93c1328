"""Tasks: prompt sets with their train / validation split, tokenizers and renderers (see registry)."""

from typing import Literal

TaskName = Literal["shapes", "ocr"]  # the names spotlight.tasks.registry.TASKS knows; kept here, torch-free
