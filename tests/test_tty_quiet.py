"""`spotlight train` in a real terminal: the screen holds Spotlight's lines only, Ray's go to RUN_DIR/spotlight.log.

Under a pipe Ray's output always reached the log, but on a terminal Ray's driver-side prints (the
"Raylet is terminated" dumps of removed spot nodes, "marked dead" notices, state dumps) reached the
screen. The test runs a spotlight-mode run whose spot node is preempted three times under a
pseudo-terminal (``os.openpty``, 80 columns) and reads the screen as a person would see it.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import psutil
import pytest
import yaml

COLUMNS = 80
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")
PROGRESS = re.compile(r"^spotlight  (\d+/\d+  )?.*\d+:\d\d elapsed  (\?|~[\d:]+) left  val ")
TABLE_CHARS = set("┏┓┗┛┃━┡┩│└┘─┴┬┼╇╈┳┻┠┨╭╮╰╯ ")
REMOVALS_AT_S = (2, 4, 6)
# Ray declares a removed node dead after 5 failed health checks, one every 3 s by default (~15 s); checked every
# 0.5 s it does so ~2.5 s after the removal. A check of a live node fails only at its timeout (10 s, kept), so a
# slow node still has to stall 50 s to be taken for dead. Ray reads RAY_<setting> in every process it starts.
RAY_HEALTH_CHECKS = {"RAY_health_check_period_ms": "500"}


def screen_lines(raw: str) -> list[str]:
    """What stays on the screen: each line's text after its last carriage return or line erase, no colours."""
    lines = []
    for line in raw.replace("\r\n", "\n").split("\n"):
        line = re.split(r"\r|\x1b\[2K", line)[-1]
        lines.append(ANSI.sub("", line).rstrip())
    return [line for line in lines if line]


def is_spotlights_own(line: str, run_dir: Path) -> bool:
    """The progress line, a one-line warning of Spotlight's, a table's rows and titles, the outcome and report
    lines (rich wraps the last two, and the table title, at a word when the run's path is long)."""
    wrapped = (f"spotlight train: {run_dir}", "runtime (spotlight)", f"report written to {run_dir}/report.html")
    return bool(PROGRESS.match(line) or line.startswith(("warning: ", "best: ", "guard: ", "report written to "))
                or set(line) <= TABLE_CHARS or line.startswith(("┃", "│"))
                or any(line.strip() in whole for whole in wrapped))


def run_in_terminal(argv: list[str], cwd: Path, timeout_s: float) -> tuple[int, str]:
    """Run ``argv`` with a pseudo-terminal of COLUMNS columns as its stdin, stdout and stderr; (exit code, screen)."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, COLUMNS, 0, 0))
    env = {key: value for key, value in os.environ.items() if key not in ("COLUMNS", "LINES")}
    env.update(TERM="xterm-256color", PYTHONPATH=str(Path(__file__).parents[1]), **RAY_HEALTH_CHECKS)
    process = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, cwd=cwd, env=env,
                               start_new_session=True)
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    try:
        while True:  # Ray's processes keep the terminal open as their stdin: the driver's exit ends the read
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: every holder of the terminal closed it
                    break
                if not chunk:
                    break
                chunks.append(chunk)
            elif process.poll() is not None:
                break
            assert time.monotonic() < deadline, f"spotlight train did not end within {timeout_s:.0f} s"
    finally:
        if process.poll() is None:
            for child in [psutil.Process(process.pid), *psutil.Process(process.pid).children(recursive=True)]:
                child.kill()
        process.wait(timeout=60)
        os.close(master)
    return process.returncode, b"".join(chunks).decode("utf-8", errors="replace")


@pytest.mark.slow
def test_a_preempted_spotlight_run_in_a_terminal_shows_only_spotlights_lines(tiny_base_model: Path,
                                                                             tmp_path: Path) -> None:
    # node0 goes at 2, 4 and 6 s of the run's clock and is back 1 s later. The run ends once its iterations'
    # own wall time (which never runs ahead of that clock) passes 10 s: the trace has played, and Ray's
    # health check (~2.5 s, RAY_HEALTH_CHECKS) has had time to declare the first removed node dead, however
    # fast the machine.
    trace = tmp_path / "trace.csv"
    trace.write_text("0,add,node0\n" + "".join(f"{at * 1000},remove,node0\n{(at + 1) * 1000},add,node0\n"
                                               for at in REMOVALS_AT_S))
    run_dir = tmp_path / "run"
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({
        "mode": "spotlight", "base_checkpoint": str(tiny_base_model), "run_dir": str(run_dir), "iterations": 100_000,
        "checkpoint_every": 100_000,
        "rollout": {"prompts_per_iteration": 2, "group_size": 3, "num_steps": 5},
        "train": {"num_minibatches": 1},
        "explore": {"monitor_prompts": 1},
        "eval": {"every": 40, "seeds_per_prompt": 1, "num_steps": 2, "grid_prompts": 2},
        "guard": {"enabled": False},  # a random tiny model's groups are often all zero: no guard stop
        "runtime": {"trace": str(trace), "time_scale": 1.0, "grace_s": 0.5, "max_wall_s": 10.0,
                    "explore_wait_s": 120.0, "node_timeout_s": 240.0},
    }))
    code, raw = run_in_terminal([sys.executable, "-m", "spotlight", "train", "-c", str(config)], tmp_path, 600)
    lines = screen_lines(raw)
    assert code == 0, "\n".join(lines[-30:])

    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    # The first removal always happens (node0 is up before the clock starts); on a loaded machine a node's
    # return can take longer than the trace's gaps, and the trace's later removals of a node not back are skipped.
    removals = sum(event["kind"] == "node_removed" for event in events)
    assert removals >= 1, "the spot node was never removed: the run saw no preemption, so the test proves nothing"
    assert removals <= len(REMOVALS_AT_S), f"{removals} removals from a trace of {len(REMOVALS_AT_S)}"
    others = [line for line in lines if not is_spotlights_own(line, run_dir)]
    assert not others, "lines on the screen that are not Spotlight's:\n" + "\n".join(others[:40])
    progress = [line for line in lines if PROGRESS.match(line)]
    assert progress and all(len(line) <= COLUMNS for line in progress), progress[-3:]
    assert any(line.startswith("report written to") for line in lines)
    ray_said = (run_dir / "spotlight.log").read_text(errors="replace")
    assert "Raylet is terminated" in ray_said or "marked dead" in ray_said  # Ray did speak: into the run's log
