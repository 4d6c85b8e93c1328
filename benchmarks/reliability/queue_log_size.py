"""The queue's write-ahead log over a 200-iteration run, with and without compaction at each checkpoint (issue 43).

Replays the default run's exploration traffic through the real `DurableQueue`: per iteration one round of
16 prompts x ``--candidates`` seeds for the toy policy's latents (4x16x16 float32), each request leased,
committed at a mid step (a preemption-safe checkpoint) and completed, the results read and forgotten by the
driver, as `spotlight.backends.ray` does. One log is never compacted (the old behaviour); the other is
compacted at every checkpoint (``checkpoint_every``, 10 by default) as the Ray backend now does. Prints the
log size every 20 iterations and writes JSON with the commit and machine.

    .venv/bin/python benchmarks/reliability/queue_log_size.py [--iterations 200] [--candidates 16]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

from spotlight.diffusion.sampler import SamplingPlan
from spotlight.runtime.queue.durable import DurableQueue
from spotlight.runtime.queue.request_queue import Request

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `benchmarks.*` imports

from benchmarks.provenance import RESULTS, git_commit, machine

PLAN = SamplingPlan(num_steps=7)
LATENT = (4, 16, 16)
FORWARD_BATCH = 16  # runtime.forward_batch


def exploration_round(queue: DurableQueue, iteration: int, prompts: int, candidates: int) -> None:
    ids = [f"x{iteration}-{p}-{c}" for p in range(prompts) for c in range(candidates)]
    queue.submit([Request(rid, f"prompt {k % prompts}", k, PLAN, iteration) for k, rid in enumerate(ids)])
    leases = queue.pull("spot-0", len(ids), iteration)
    for first in range(0, len(leases), FORWARD_BATCH):  # a worker's forward batch: checkpointed, then completed
        batch = [(lease.request.request_id, torch.randn(LATENT)) for lease in leases[first:first + FORWARD_BATCH]]
        for request_id, latent in batch:
            queue.commit("spot-0", request_id, latent, 3, iteration, keep_lease=True)
        queue.complete_many("spot-0", batch, iteration)
    queue.results_of(ids)
    queue.forget(ids)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--candidates", type=int, default=16)
    parser.add_argument("--checkpoint-every", type=int, default=10)
    args = parser.parse_args()
    rows = []
    started = time.perf_counter()
    # in memory where there is a /dev/shm: the log's size does not depend on the disk, its ~10^5 fsyncs' time does
    shm = Path("/dev/shm")
    with tempfile.TemporaryDirectory(dir=shm if shm.is_dir() else None) as scratch:
        plain, compacted = DurableQueue(Path(scratch) / "plain.jsonl"), DurableQueue(Path(scratch) / "compacted.jsonl")
        for iteration in range(args.iterations):
            for queue in (plain, compacted):
                exploration_round(queue, iteration, args.prompts, args.candidates)
            before_compaction = compacted.log_path.stat().st_size
            if (iteration + 1) % args.checkpoint_every == 0:
                compacted.compact()
            if (iteration + 1) % 20 == 0:
                rows.append({"iteration": iteration + 1, "never_compacted_bytes": plain.log_path.stat().st_size,
                             "before_compaction_bytes": before_compaction,
                             "after_compaction_bytes": compacted.log_path.stat().st_size})
        requests = compacted.stats().submitted
    print(f"{'iteration':>9} {'never compacted':>16} {'before compaction':>18} {'after compaction':>17}")
    for row in rows:
        print(f"{row['iteration']:>9} {row['never_compacted_bytes'] / 2**20:>13.1f} MB "
              f"{row['before_compaction_bytes'] / 2**20:>15.2f} MB {row['after_compaction_bytes']:>11,} B")
    print(f"{requests:,} requests in {time.perf_counter() - started:.0f} s")
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "queue_log_size.json"
    out.write_text(json.dumps({"commit": git_commit(), "machine": machine(), "args": vars(args), "requests": requests,
                               "rows": rows}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
