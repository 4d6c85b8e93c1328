"""The reward server and client under hostile peers, with numbers: is the service still answering, and
at what cost, while 1,000 connections stall and a slowloris client drips its headers; does a client
return within its deadline from an endpoint that drips its answer?

The server is a real `spotlight serve-reward --task shapes` process (its memory is read from /proc);
every peer is a real socket on 127.0.0.1. Prints a table, writes JSON to benchmarks/results/.

    .venv/bin/python benchmarks/reliability/reward_server_probes.py [--stalled 1000]
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `benchmarks.*` imports

from benchmarks.provenance import RESULTS, git_commit, machine

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from drip_server import dripping_server  # noqa: E402 (a test helper: the same hostile peer the tests use)

from spotlight.http_fetch import fetch  # noqa: E402
from spotlight.rewards.server.client import HTTPReward  # noqa: E402
from spotlight.tasks.render import render_batch  # noqa: E402
from spotlight.tasks.shapes import train_val_split  # noqa: E402


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def threads(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/task").iterdir()))


def health_s(url: str) -> float:
    started = time.monotonic()
    assert fetch(f"{url}/health", deadline_s=10, max_body_bytes=1000).status == 200
    return time.monotonic() - started


def score_s(url: str) -> float:
    prompts = train_val_split()[1][:8]
    images = ((render_batch(prompts, seed=3) + 1) / 2 * 255).round() / 255
    started = time.monotonic()
    out = HTTPReward(url, timeout_s=10, retries=0).score(images, prompts)
    assert out.valid.all(), out.errors
    return time.monotonic() - started


def start_server(port: int) -> subprocess.Popen:
    server = subprocess.Popen([sys.executable, "-m", "spotlight", "serve-reward", "--task", "shapes", "--port",
                               str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            health_s(f"http://127.0.0.1:{port}")
            return server
        except (OSError, AssertionError):
            time.sleep(0.2)
    server.kill()
    raise SystemExit("serve-reward did not start within 60 s")


def slowloris_cut_s(port: int) -> float:
    """Seconds until the server drops a client that sends one header byte every 0.2 s."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
        started = time.monotonic()
        try:
            for byte in b"POST /score HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 1000:
                conn.sendall(bytes([byte]))
                time.sleep(0.2)
        except OSError:
            pass
        return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--stalled", type=int, default=1000)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    server = start_server(port)
    stalled: list[socket.socket] = []
    results: dict[str, float] = {}
    try:
        idle = {"rss_mib": rss_mib(server.pid), "threads": threads(server.pid), "health_s": health_s(url),
                "score_s": score_s(url)}
        for index in range(args.stalled):  # half send nothing, half an unfinished request
            conn = socket.create_connection(("127.0.0.1", port), timeout=10)
            if index % 2:
                conn.sendall(b"POST /score HTTP/1.1\r\nContent-Length: 100000\r\n\r\n{")
            stalled.append(conn)
        time.sleep(1.0)
        loaded = {"rss_mib": rss_mib(server.pid), "threads": threads(server.pid), "health_s": health_s(url),
                  "score_s": score_s(url)}
        loris = threading.Thread(target=lambda: results.__setitem__("slowloris_cut_s", slowloris_cut_s(port)))
        loris.start()
        loris.join(timeout=60)
    finally:
        for conn in stalled:
            conn.close()
        server.terminate()
        server.wait(timeout=10)
    with dripping_server(interval_s=0.5) as drip_url:
        started = time.monotonic()
        HTTPReward(drip_url, timeout_s=2.0, retries=0).score(torch.rand(1, 3, 32, 32), ["a"])
        drip_s = time.monotonic() - started

    rows = [("idle", idle), (f"{args.stalled} stalled connections", loaded)]
    print(f"{'server state':32} {'RSS MiB':>8} {'threads':>8} {'/health s':>10} {'score 8 s':>10}")
    for name, row in rows:
        print(f"{name:32} {row['rss_mib']:8.1f} {row['threads']:8d} {row['health_s']:10.3f} {row['score_s']:10.3f}")
    print(f"slowloris client (1 byte / 0.2 s) cut off after {results.get('slowloris_cut_s', float('nan')):.1f} s "
          "(read deadline 10 s)")
    print(f"HTTPReward(timeout_s=2) against an endpoint dripping 1 byte / 0.5 s returned after {drip_s:.2f} s")
    out = {"benchmark": "reward_server_probes", "commit": git_commit(), "machine": machine(),
           "config": {"stalled": args.stalled, "server": "spotlight serve-reward --task shapes (default limits)"},
           "idle": idle, "stalled": loaded, "slowloris_cut_s": results.get("slowloris_cut_s"),
           "dripping_endpoint_client_s": drip_s}
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / "reward_server_probes.json"
    path.write_text(json.dumps(out, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
