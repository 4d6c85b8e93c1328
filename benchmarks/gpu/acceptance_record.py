"""Add one step of `gpu_acceptance.sh` to its JSON: exit status, seconds, the step's own JSON and its log's tail.

Called after every step, so the file holds every step finished so far even if a later one hangs or the
machine is taken back; a step that wrote no JSON (it failed, or its timeout killed it) is recorded with
its status and the last lines of its log, which say why.

    python benchmarks/gpu/acceptance_record.py OUT.json STEP RC SECONDS TIMEOUT LOG [STEP_JSON ...]
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `benchmarks.*` imports

from benchmarks.provenance import git_commit, machine

LOG_TAIL = 40  # lines of a step's log kept


def record(out: Path, step: str, rc: int, seconds: float, timeout_s: float, log: Path,
           results: list[Path]) -> dict[str, Any]:
    """The acceptance JSON at ``out`` with ``step`` added (or replaced), written back."""
    document: dict[str, Any] = {}
    if out.is_file():
        document = json.loads(out.read_text())
    document.setdefault("benchmark", "gpu_acceptance")
    found = git_commit()  # a copy of the tree on a lent machine may not be a git checkout: the script's export
    document.setdefault("commit", os.environ.get("SPOTLIGHT_COMMIT", found) if found == "unknown" else found)
    document.setdefault("machine", machine())
    try:
        import torch

        if torch.cuda.is_available():
            document.setdefault("device", torch.cuda.get_device_name(0))
    except ImportError:  # the record is still written: the step's log says what failed
        pass
    lines = log.read_text(errors="replace").splitlines() if log.is_file() else []
    entry: dict[str, Any] = {"rc": rc, "ok": rc == 0, "seconds": round(seconds, 1), "timeout_s": timeout_s,
                             "timed_out": rc in (124, 137), "log": str(log), "log_tail": lines[-LOG_TAIL:],
                             "results": {}}
    for path in results:
        if path.is_file():
            try:
                entry["results"][path.name] = json.loads(path.read_text())
            except json.JSONDecodeError as error:
                entry["results"][path.name] = f"unreadable: {error}"
    document.setdefault("steps", {})[step] = entry
    document["passed"] = all(step_entry["ok"] for step_entry in document["steps"].values())
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_suffix(".json.tmp")
    partial.write_text(json.dumps(document, indent=1, default=str) + "\n")
    partial.replace(out)  # a reader never sees half a file
    return document


def main(argv: list[str]) -> int:
    if len(argv) < 6:
        print("usage: acceptance_record.py OUT.json STEP RC SECONDS TIMEOUT LOG [STEP_JSON ...]", file=sys.stderr)
        return 2
    out, step, rc, seconds, timeout_s, log, *results = argv
    document = record(Path(out), step, int(rc), float(seconds), float(timeout_s), Path(log),
                      [Path(path) for path in results])
    entry = document["steps"][step]
    state = "ok" if entry["ok"] else ("timed out" if entry["timed_out"] else f"failed (exit {rc})")
    print(f"gpu_acceptance: {step}: {state} in {entry['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
