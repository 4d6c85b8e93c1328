"""docs/results.md's tables for the rewards' benchmarks (this folder), one function each.

Each function reads only what its benchmark wrote (see that benchmark's docstring for the fields) and
returns tables of formatted strings; nothing here computes a new number beyond a ratio or a rounding,
so the page says what the JSON says. Standard library only.
"""

from __future__ import annotations

from collections.abc import Callable

from benchmarks.tables import Table, fmt


def reward_accuracy(result: dict) -> list[Table]:
    """The reward on rendered ground truth, on another prompt's image, and on images with no object."""
    key = "strict_accuracy" if "no_object" in result else "exact_match"
    table = Table(["images", "count", key.replace("_", " "), "mean reward"])
    for condition, kinds in result.get("accuracy", {}).items():
        row = kinds.get("all", {})
        table.rows.append([condition, fmt(row.get("images"), 0), fmt(row.get(key)), fmt(row.get("mean_reward"))])
    for label, kinds in (("all prompts, clean", result.get("all_prompts_clean")),
                         ("another prompt's image", result.get("wrong_prompt") or result.get("wrong_text"))):
        if isinstance(kinds, dict):
            row = kinds.get("all", {})
            table.rows.append([label, fmt(row.get("images"), 0), fmt(row.get(key)), fmt(row.get("mean_reward"))])
    for condition, row in (result.get("no_object") or result.get("no_text") or {}).items():
        table.rows.append([condition, "–", fmt(row.get("strict_rate", row.get("exact_match"))),
                           fmt(row.get("mean_reward"))])
    return [table]


SECTIONS: dict[str, Callable[[dict], list[Table]]] = {
    "reward_accuracy": reward_accuracy, "ocr_reward_accuracy": reward_accuracy,
}
