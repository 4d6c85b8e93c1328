"""Chaos: one spotlight training run on the Ray runtime through a seeded schedule of faults, against a fault-free run.

    .venv/bin/python benchmarks/reliability/chaos.py [--seed 0] [--iterations 30]

Both runs train the shipped shapes base model in mode spotlight with ``runtime.complete_rounds`` (one
planner arm, every round run whole, the on-demand device serving what the spot devices leave, so neither
the plan nor the explored seeds depend on which spot devices are up), with the reward served over HTTP
by `spotlight.rewards.server.supervisor.RewardSupervisor`, each driver a process of its own (`python
benchmarks/reliability/chaos.py driver ...`, which calls the same `spotlight.trainer.train` as `spotlight train`,
with an `HTTPReward`).

The fault-free run keeps its spot nodes (no trace). The faulty run gets:

- noticed spot-node losses: its spot trace (seeded) removes a node every ``--period`` seconds, each
  announced ``grace_s`` before (the devices commit and stop), and brings it back ``--down`` s later;
- unnoticed losses: a spot device's process SIGKILLed with no notice (its leases lapse or are released);
- kills of the queue actor (SIGKILL of its process: Ray restarts it, it replays its write-ahead log);
- kills of the reward server (SIGKILL: the supervisor restarts it, the client retries);
- one SIGKILL of the driver and everything it started, after a checkpoint, then ``--resume``.

It writes benchmarks/results/chaos.json: the faults that happened, the exploration requests (submitted,
done, stored twice, lost) read from every queue log of the run, every completed exploration result
compared bit for bit with the same request of the fault-free run, the per-iteration metrics that do not
depend on timing, and the final weights of both runs.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

NUM_NODES = 3
DETERMINISTIC = ("rollout/", "train/", "explore/", "staleness/", "planner/num_")


def settings(run_dir: Path, trace: str | None, iterations: int) -> dict[str, Any]:
    """The run's config: small, one prompt per iteration (the rollout stays on the on-demand device, so its
    batch never depends on how many spot devices are idle), one planner arm (12 candidates for a group of
    4, so the explored seeds matter) well inside a long training (8 epochs), so that it fits the training
    time whatever the timings and both runs explore alike (where one does not, the runs diverge from that
    iteration on: `compare` says where)."""
    return {
        "mode": "spotlight", "base_checkpoint": "shapes-base", "run_dir": str(run_dir), "iterations": iterations,
        "checkpoint_every": max(1, iterations // 4), "seed": 3,
        "rollout": {"prompts_per_iteration": 1, "group_size": 4, "num_steps": 8},
        "train": {"num_minibatches": 1, "num_epochs": 8},
        "explore": {"monitor_prompts": 1},
        "eval": {"every": 1000, "seeds_per_prompt": 1, "num_steps": 2, "grid_prompts": 1},
        "runtime": {"num_spot_devices": NUM_NODES, "trace": trace, "time_scale": 1.0, "grace_s": 0.5,
                    "max_wall_s": None, "explore_wait_s": 300.0, "node_timeout_s": 240.0, "lease_timeout_s": 5.0,
                    "worker_capacity": 16, "forward_batch": 8, "complete_rounds": True,
                    "compact_queue_log": False,  # the audit below reads every request's records from the log
                    "planner": {"num_candidates": [12], "num_steps": [3], "budget_fraction": 1.0}},
    }


def spot_trace(rng: random.Random, removals: int, period_s: float, down_s: float) -> str:
    """A trace (ms, kind, node) removing one of the nodes every ~period_s (jittered) and returning it down_s later."""
    lines = [f"0,add,node{k}" for k in range(NUM_NODES)]
    up_at = dict.fromkeys(range(NUM_NODES), 0.0)
    t = 2.0
    for _ in range(removals):
        t += period_s * rng.uniform(0.6, 1.4)
        node = rng.choice([k for k in range(NUM_NODES) if up_at[k] <= t])
        lines += [f"{int(t * 1000)},remove,node{node}", f"{int((t + down_s) * 1000)},add,node{node}"]
        up_at[node] = t + down_s + 0.5
    return "\n".join(lines) + "\n"


def driver(args: argparse.Namespace) -> None:
    """One driver: `spotlight.trainer.train` with the reward over HTTP (what `spotlight train` runs)."""
    from spotlight.config import TrainConfig, parse_config
    from spotlight.rewards.server.client import HTTPReward
    from spotlight.trainer import train

    config = parse_config(TrainConfig, json.loads(Path(args.config).read_text()))
    train(config, resume=args.resume, reward=HTTPReward(args.reward_url, timeout_s=20.0, retries=8, backoff_s=0.25))


def start_driver(config_file: Path, reward_url: str, resume: bool, log: Path) -> subprocess.Popen:
    command = [sys.executable, str(Path(__file__).resolve()), "driver", "--config", str(config_file),
               "--reward-url", reward_url, *(["--resume"] if resume else [])]
    with open(log, "ab") as output:
        return subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env={**os.environ, "PYTHONPATH": str(ROOT)})


def processes(root_pid: int, title: str) -> list[Any]:
    """The live descendants of ``root_pid`` whose command line contains ``title`` (Ray names actor processes)."""
    import psutil

    found = []
    for process in psutil.Process(root_pid).children(recursive=True):
        try:
            if title in " ".join(process.cmdline()):
                found.append(process)
        except psutil.Error:
            pass
    return found


def kill_tree(pid: int) -> None:
    import psutil

    family = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    for process in family:
        try:
            process.send_signal(signal.SIGKILL)
        except psutil.Error:
            pass
    psutil.wait_procs(family, timeout=30)


def run(run_dir: Path, trace: str | None, iterations: int, reward_url: str,
        schedule: list[tuple[float, str]] | None, supervisor: Any, rng: random.Random) -> dict[str, Any]:
    """Run to the end, applying ``schedule`` ((seconds after start, fault) sorted) if given; returns what happened."""
    from spotlight.components.checkpoint import latest_checkpoint

    run_dir.mkdir(parents=True)
    config_file = run_dir.parent / f"{run_dir.name}-config.json"
    config_file.write_text(json.dumps(settings(run_dir, trace, iterations)))
    log = run_dir.parent / f"{run_dir.name}-driver.log"
    started = time.monotonic()
    process = start_driver(config_file, reward_url, resume=False, log=log)
    done: dict[str, int] = {"unnoticed_loss": 0, "queue_kill": 0, "reward_kill": 0, "driver_kill": 0}
    missed: dict[str, int] = dict.fromkeys(done, 0)
    pending = list(schedule or [])
    resumed_at = None
    while process.poll() is None:
        now = time.monotonic() - started
        while pending and pending[0][0] <= now:
            _, fault = pending.pop(0)
            if fault in ("unnoticed_loss", "queue_kill"):
                title = "ray::SpotDevice" if fault == "unnoticed_loss" else "ray::DurableQueue"
                targets = processes(process.pid, title)
                if not targets:  # not started yet (or none left): try again in a second
                    missed[fault] += 1
                    pending.append((now + 1.0, fault))
                    pending.sort()
                    break
                rng.choice(targets).send_signal(signal.SIGKILL)
                done[fault] += 1
            elif fault == "reward_kill":
                os.kill(supervisor.pid(), signal.SIGKILL)
                done[fault] += 1
            elif fault == "driver_kill":
                if latest_checkpoint(run_dir) is None:  # not yet: try again in a second
                    pending.append((now + 1.0, fault))
                    pending.sort()
                    break
                kill_tree(process.pid)
                done[fault] += 1
                resumed_at = time.monotonic() - started
                process = start_driver(config_file, reward_url, resume=True, log=log)
        time.sleep(0.05)
    wall_s = time.monotonic() - started
    if process.returncode != 0:
        raise SystemExit(f"the driver of {run_dir} exited with {process.returncode}: see {log}")
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines() if line.strip()]
    return {"wall_s": round(wall_s, 1), "resumed_at_s": resumed_at, "faults": done,
            "faults_postponed": {k: v for k, v in missed.items() if v}, "left_in_schedule": pending,
            "preemption_notices": sum(e["kind"] == "preemption_notice" for e in events),
            "devices_lost_without_notice": sum(e["kind"] == "device_lost" for e in events),
            "reward_server_restarts": supervisor.restarts}


def queue_records(run_dir: Path) -> list[tuple[int, list[dict[str, Any]]]]:
    from spotlight.runtime.queue.log import read_log

    logs = sorted(run_dir.glob("queue-log-*.jsonl"), key=lambda p: int(p.stem.rpartition("-")[2]))
    return [(int(path.stem.rpartition("-")[2]), read_log(path)[0]) for path in logs]


def requests_summary(run_dir: Path) -> tuple[dict[str, Any], dict[tuple[int, str], Any]]:
    """Counts over every queue log of a run, and every stored result by (driver, request id) with its request."""
    from spotlight.runtime.queue.log import decode_tensor

    counts = {"submitted": 0, "done": 0, "stored_twice": 0, "cancelled": 0, "lost": 0,
              "abandoned_by_killed_driver": 0, "queue_restarts": 0}
    results: dict[tuple[int, str], Any] = {}
    logs = queue_records(run_dir)
    for generation, records in logs:
        requests, status, stored = {}, {}, {}
        for record in records:
            if "submit" in record:
                requests[record["submit"]["request_id"]] = record["submit"]
            elif "id" in record:
                status[record["id"]] = record["status"]
                if "result" in record:
                    stored[record["id"]] = stored.get(record["id"], 0) + 1
                    results[(generation, record["id"])] = (requests[record["id"]], decode_tensor(record["result"]))
        last = [r for r in records if "counts" in r]
        counts["queue_restarts"] += last[-1]["restarts"] if last else 0
        counts["submitted"] += len(requests)
        counts["done"] += len(stored)
        counts["stored_twice"] += sum(n > 1 for n in stored.values())
        counts["cancelled"] += sum(1 for rid, s in status.items() if s == "done" and rid not in stored)
        unfinished = sum(1 for rid in requests if status.get(rid, "pending") != "done")
        if generation == logs[-1][0]:
            counts["lost"] += unfinished
        else:
            counts["abandoned_by_killed_driver"] += unfinished  # its round is requested again after --resume
    return counts, results


def compare(clean_dir: Path, chaos_dir: Path) -> dict[str, Any]:
    import torch

    from spotlight.components.checkpoint import latest_checkpoint, load_model

    clean_counts, clean_results = requests_summary(clean_dir)
    chaos_counts, chaos_results = requests_summary(chaos_dir)
    reference = {rid: value for (_, rid), value in clean_results.items()}
    identical = differing = unmatched = 0
    differing_versions: set[int] = set()
    for (_, rid), (request, result) in chaos_results.items():
        if rid not in reference or reference[rid][0] != request:
            unmatched += 1
        elif torch.equal(reference[rid][1], result):
            identical += 1
        else:
            differing += 1
            differing_versions.add(request["weights_version"])

    def metrics(run_dir: Path) -> list[dict[str, Any]]:
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
        return [{k: v for k, v in row.items() if k == "iteration" or k.startswith(DETERMINISTIC)} for row in rows]

    clean_rows, chaos_rows = metrics(clean_dir), metrics(chaos_dir)
    diverged = next((a["iteration"] for a, b in zip(clean_rows, chaos_rows, strict=False) if a != b), None)
    final_clean = load_model(latest_checkpoint(clean_dir)).state_dict()
    final_chaos = load_model(latest_checkpoint(chaos_dir)).state_dict()
    max_diff = max(float((final_clean[k] - final_chaos[k]).abs().max()) for k in final_clean)
    return {
        "requests_fault_free": clean_counts, "requests_chaos": chaos_counts,
        "results_compared": identical + differing, "results_bit_identical": identical,
        "results_differing": differing, "weights_versions_of_differing_results": sorted(differing_versions),
        "results_without_a_fault_free_twin": unmatched,
        "metric_rows_equal": sum(a == b for a, b in zip(clean_rows, chaos_rows, strict=False)),
        "first_iteration_whose_metrics_differ": diverged,
        "metric_rows": len(clean_rows),
        "final_weights_bit_identical": all(torch.equal(final_clean[k], final_chaos[k]) for k in final_clean),
        "final_weights_max_abs_diff": max_diff,
    }


def fault_schedule(rng: random.Random, span_s: float, unnoticed: int) -> list[tuple[float, str]]:
    """Seeded fault times in [5 s, span_s]: the unnoticed losses, 2 queue kills, 2 reward kills, 1 driver kill."""
    faults = ["unnoticed_loss"] * unnoticed + ["queue_kill"] * 2 + ["reward_kill"] * 2
    schedule = [(rng.uniform(5.0, span_s), fault) for fault in faults]
    schedule.append((rng.uniform(0.3 * span_s, 0.5 * span_s), "driver_kill"))
    return sorted(schedule)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--iterations", type=int, default=60)
    parser.add_argument("--removals", type=int, default=70, help="noticed spot-node losses in the trace")
    parser.add_argument("--period", type=float, default=3.0, help="mean seconds between trace removals")
    parser.add_argument("--down", type=float, default=1.5, help="seconds a removed node stays away")
    parser.add_argument("--unnoticed", type=int, default=12, help="spot devices SIGKILLed without a notice")
    parser.add_argument("--work", type=Path, default=Path("/tmp/spotlight-chaos"))
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "chaos.json")
    args = parser.parse_args()

    from spotlight.rewards.server.supervisor import RewardSupervisor, free_port

    rng = random.Random(args.seed)
    work = args.work / f"run-{int(time.time())}"
    work.mkdir(parents=True)
    trace = work / "trace.csv"
    trace.write_text(spot_trace(rng, args.removals, args.period, args.down))
    supervisor = RewardSupervisor("shapes", free_port(), log_path=work / "reward-server.log")
    try:
        clean = run(work / "clean", None, args.iterations, supervisor.url, None, supervisor, rng)
        print(f"fault-free run: {clean['wall_s']} s", flush=True)
        schedule = fault_schedule(rng, 0.8 * clean["wall_s"], args.unnoticed)
        chaos = run(work / "chaos", str(trace), args.iterations, supervisor.url, schedule, supervisor, rng)
        chaos["reward_server_restarts"] -= clean["reward_server_restarts"]
        print(f"chaos run: {chaos['wall_s']} s", flush=True)
    finally:
        supervisor.close()
    result = {"command": "benchmarks/reliability/chaos.py " + " ".join(sys.argv[1:]), "seed": args.seed,
              "iterations": args.iterations, "config": settings(Path("run"), "trace.csv", args.iterations),
              "trace": {"removals": args.removals, "period_s": args.period, "down_s": args.down},
              "schedule": schedule, "fault_free": clean, "chaos": chaos, **compare(work / "clean", work / "chaos")}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(json.dumps({k: v for k, v in result.items() if k not in ("config", "schedule")}, indent=2))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "driver":
        parser = argparse.ArgumentParser()
        parser.add_argument("driver")
        parser.add_argument("--config", required=True)
        parser.add_argument("--reward-url", required=True)
        parser.add_argument("--resume", action="store_true")
        driver(parser.parse_args())
    else:
        main()
