"""The run's event log (events.jsonl): preemption notices, node removals and additions, busy intervals.

One JSON object a line, ``{"t": seconds since the run started, "kind": ..., ...}``; the HTML report
draws the spot utilisation timeline and the preemptions from it. Lines are flushed as they are
written, so a run that dies keeps its timeline up to that moment.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["EventLog"]


class EventLog:
    """Append-only writer of events.jsonl (or an in-memory list only, with ``path=None``)."""

    def __init__(self, path: Path | None) -> None:
        self.rows: list[dict[str, Any]] = []
        self._file = path.open("a") if path is not None else None

    def write(self, t: float, kind: str, **fields: Any) -> None:
        row = {"t": round(t, 4), "kind": kind, **fields}
        self.rows.append(row)
        if self._file is not None:
            self._file.write(json.dumps(row) + "\n")
            self._file.flush()

    def count(self, kind: str) -> int:
        return sum(1 for row in self.rows if row["kind"] == kind)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
