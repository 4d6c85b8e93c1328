"""Prompt datasets: the prompts a run trains on (train split) and validates on (test split), with metadata.

One of the three parts a run names, beside the reward (``reward``) and the policy (``model``):
``data.dataset`` (a folder in flow_grpo's layout, or a shipped set) or, when unset, the task's own
prompts (`spotlight.task_presets`).
"""

from spotlight.data.prompt_dataset import DatasetError, PromptDataset, load_prompt_folder
from spotlight.data.shipped import resolve_dataset_folder, shipped_names

__all__ = ["DatasetError", "PromptDataset", "load_prompt_folder", "open_dataset", "resolve_dataset_folder",
           "shipped_names"]


def open_dataset(name_or_path: str) -> PromptDataset:
    """The dataset ``data.dataset`` names (a folder, or a shipped set by name); one-line `DatasetError` otherwise."""
    return load_prompt_folder(resolve_dataset_folder(name_or_path))
