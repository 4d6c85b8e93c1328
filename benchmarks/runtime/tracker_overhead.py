"""What experiment trackers cost an iteration (issue 44): the loop's hand-over and the tracker thread's CPU time.

Replays a real run's ``metrics.jsonl`` (every scalar of every iteration, and each validation's sample grid)
through `TrackerHub` with each tracker alone and all three together, as the loop feeds it. Two numbers per
iteration, median and spread over the iterations and ``--repeats`` repeats:
- ``critical_us``: time the loop spends in `TrackerHub.log` (a queue put: what lengthens an iteration);
- ``thread_cpu_ms``: CPU time the tracker thread spends on the iteration (the libraries' own work, off the
  critical path, but competing for a core on a machine with few).
Without ``--metrics`` it first makes a run to replay: the default config (mode spotlight), shortened.

    .venv/bin/python benchmarks/runtime/tracker_overhead.py [--metrics RUN/metrics.jsonl] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from spotlight.tracking import LogSection, TrackerHub

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `benchmarks.*` imports

from benchmarks.provenance import RESULTS, git_commit, machine

SETS = {"tensorboard": ["tensorboard"], "wandb": ["wandb"], "mlflow": ["mlflow"],
        "all three": ["tensorboard", "wandb", "mlflow"]}


def make_run(folder: Path, iterations: int) -> Path:
    """A short run of the default config (mode spotlight: its spot fleet's metrics too), whose metrics.jsonl and
    grids the replay feeds; validation shortened, as it adds no keys."""
    run_dir = folder / "source"
    overrides = [f"iterations={iterations}", f"run_dir={run_dir}", "eval.every=10", "eval.prompts=8",
                 "eval.seeds_per_prompt=2", "runtime.max_wall_s=null"]
    subprocess.run([sys.executable, "-m", "spotlight", "train", *[a for o in overrides for a in ("-s", o)]],
                   check=True, capture_output=True)
    return run_dir / "metrics.jsonl"


def replay(metrics: Path, trackers: list[str], folder: Path) -> dict[str, list[float]]:
    records = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    grids = metrics.parent / "samples"
    opened = time.perf_counter()
    hub = TrackerHub(LogSection(trackers=trackers), folder, {"seed": 0}, "seed: 0\n", first_step=0)
    critical = []
    for record in records:
        step = record["iteration"]
        grid = grids / f"iter-{step:05d}.png"
        if grid.is_file():
            hub.image(step, "val/samples", grid, "a validation grid")
        started = time.perf_counter()
        hub.log(step, record)
        critical.append(time.perf_counter() - started)
    hub.close(timeout_s=300)
    return {"critical_us": [1e6 * c for c in critical], "thread_cpu_ms": [1e3 * c for c in hub.record_cpu_s],
            "total_s": [time.perf_counter() - opened], "scalars_per_iteration": [len(records[-1]) - 1]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--metrics", type=Path, help="a run's metrics.jsonl (default: make a 24-iteration run)")
    parser.add_argument("--iterations", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        metrics = args.metrics or make_run(Path(scratch), args.iterations)
        rows = {}
        for name, trackers in SETS.items():
            runs = [replay(metrics, trackers, Path(scratch) / f"{name}-{r}") for r in range(args.repeats)]
            merged = {key: [v for run in runs for v in run[key]] for key in runs[0]}
            rows[name] = {key: {"median": statistics.median(values), "min": min(values), "max": max(values)}
                          for key, values in merged.items()}
            rows[name]["iterations"] = len(runs[0]["critical_us"])
    print(f"{'trackers':<12} {'iterations':>10} {'loop µs/iter (median, min-max)':>32} "
          f"{'tracker thread CPU ms/iter (median, min-max)':>46}")
    for name, row in rows.items():
        c, t = row["critical_us"], row["thread_cpu_ms"]
        print(f"{name:<12} {row['iterations']:>10} {c['median']:>14.1f} ({c['min']:.1f}-{c['max']:.1f})"
              f"{'':>8}{t['median']:>20.2f} ({t['min']:.2f}-{t['max']:.2f})")
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "tracker_overhead.json"
    out.write_text(json.dumps({"commit": git_commit(), "machine": machine(), "repeats": args.repeats,
                               "rows": rows}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
