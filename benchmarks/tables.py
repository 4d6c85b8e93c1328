"""What every section of docs/results.md is made of: a table of formatted strings, and the formatting.

Shared by each folder's ``sections.py`` (the tables for that folder's benchmarks), by ``headline.py`` (the
README's table) and by ``write_results_page.py``. Standard library only: the page is written before set-up.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class Table:
    """One markdown table: an optional caption line above it, its column names, its rows."""

    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)
    caption: str = ""


def fmt(value: object, digits: int = 3) -> str:
    """A number with ``digits`` decimals; '–' for a missing value, 'not reached' for infinity."""
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (int, float)):
        if isinstance(value, float) and math.isnan(value):
            return "–"
        if isinstance(value, float) and math.isinf(value):
            return "not reached"
        return f"{value:.{digits}f}" if isinstance(value, float) or digits == 0 else f"{value}"
    return str(value)


def short_commit(commit: object) -> str:
    """``abc1234`` (or ``abc1234+dirty``) from a full hash; 'not recorded' when the JSON has none."""
    if not isinstance(commit, str) or not commit:
        return "not recorded"
    head, _, dirty = commit.partition("+")
    return head[:7] + (f"+{dirty}" if dirty else "")


def spread(median: str, low: str, high: str) -> str:
    """``median [low–high]``, or '–' when nothing reached it."""
    return "–" if median in ("–", "not reached") else f"{median} [{low}–{high}]"


def minutes(seconds: object) -> str:
    """Seconds as minutes with one decimal."""
    return fmt(seconds / 60.0, 1) if isinstance(seconds, (int, float)) else "–"


def generic_table(result: dict) -> Table:
    """The JSON's top-level numbers and flags, for a benchmark without a summary of its own."""
    rows = [[f"`{key}`", fmt(value)] for key, value in result.items()
            if isinstance(value, (int, float, bool)) and key not in ("seed",)]
    return Table(["field", "value"], rows)
