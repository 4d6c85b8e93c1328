"""Is a refactor a no-behaviour change? Run the same fixed-seed runs on two commits and compare their metrics.

A run is fully described by its config and seed, so two commits that only move code give the same
``metrics.jsonl`` bit for bit, apart from the wall-clock timings (``time/*``). This script runs two
such runs on the checkout it lives in (a toy TinyDiT run and a tiny SD3 pipeline-folder run, both mode
vanilla, seed 0), hashes each ``metrics.jsonl`` without its timings, and, given ``--against JSON`` (an
earlier output of this script, from another commit), says which keys differ. Keys a commit adds on
purpose are named with ``--new-key`` and left out of both hashes.

    python benchmarks/reliability/metrics_identity.py --out runs/identity  # writes runs/identity/identity.json
    python benchmarks/reliability/metrics_identity.py --out runs/after --against runs/before/identity.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `benchmarks.*` imports

from benchmarks.provenance import git_commit, machine

RUNS = {
    "toy": ["-s", "mode=vanilla", "-s", "iterations=4", "-s", "eval.every=2", "-s", "seed=0"],
    "pipeline": ["-s", "model.pretrained={folder}", "-s", "rollout.resolution=32", "-s", "mode=vanilla",
                 "-s", "iterations=3", "-s", "eval.every=3", "-s", "seed=0"],
}


def records(path: Path, ignored: set[str]) -> list[dict]:
    """The records of ``metrics.jsonl`` without timings and without the ``ignored`` keys."""
    lines = path.read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if not k.startswith("time/") and k not in ignored}
            for line in lines]


def digest(rows: list[dict]) -> str:
    return hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest()


def run(out: Path, ignored: set[str]) -> dict:
    """Both runs into ``out``; each one's hash and its records."""
    spotlight = [sys.executable, "-m", "spotlight"]
    folder = out / "tiny-sd3"
    if not folder.exists():
        subprocess.run([*spotlight, "make-tiny-pipeline", "sd3", str(folder)], check=True, capture_output=True)
    result = {}
    for name, overrides in RUNS.items():
        run_dir = out / name
        args = [arg.format(folder=folder) for arg in overrides] + ["-s", f"run_dir={run_dir}"]
        subprocess.run([*spotlight, "train", *args], check=True, capture_output=True)
        rows = records(run_dir / "metrics.jsonl", ignored)
        result[name] = {"command": "spotlight train " + " ".join(args), "sha256": digest(rows), "records": rows}
    return result


def differences(mine: list[dict], theirs: list[dict]) -> list[str]:
    """``iteration key: theirs -> mine`` for each value that differs (a missing key reads as None)."""
    found = [f"{len(theirs)} -> {len(mine)} records"] if len(mine) != len(theirs) else []
    for a, b in zip(theirs, mine, strict=False):  # a length difference is reported above
        found += [f"{a.get('iteration')} {key}: {a.get(key)} -> {b.get(key)}"
                  for key in sorted(set(a) | set(b)) if a.get(key) != b.get(key)]
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="a new folder for the runs and identity.json")
    parser.add_argument("--against", type=Path, help="identity.json of another commit to compare with")
    parser.add_argument("--new-key", action="append", default=[], help="a metric this commit adds on purpose")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    ignored = set(args.new_key)
    runs = run(args.out, ignored)
    report = {"commit": git_commit(), "machine": machine(), "ignored_keys": sorted(ignored), "runs": runs}
    if args.against is not None:
        earlier = json.loads(args.against.read_text())
        report["against"] = {"commit": earlier["commit"], "runs": {}}
        for name, mine in runs.items():
            theirs = [{k: v for k, v in row.items() if k not in ignored} for row in earlier["runs"][name]["records"]]
            found = differences(mine["records"], theirs)
            report["against"]["runs"][name] = {"sha256": digest(theirs), "identical": not found, "differences": found}
            print(f"{name}: {earlier['commit'][:7]} {digest(theirs)[:16]}  vs  {report['commit'][:7]} "
                  f"{mine['sha256'][:16]}  {'identical' if not found else 'DIFFERENT: ' + '; '.join(found[:5])}")
    else:
        for name, mine in runs.items():
            print(f"{name}: {report['commit'][:7]} {mine['sha256'][:16]}")
    (args.out / "identity.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
