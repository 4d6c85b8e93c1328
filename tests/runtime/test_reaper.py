"""Nothing of a run outlives its driver: the reaper kills the session's processes when the driver is SIGKILLed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

TESTS = Path(__file__).parents[1]

# A driver that starts a Reaper for a made-up session, then two "raylets" naming it on their command line,
# each with a child that does not (as Ray's workers, which rename themselves), and a bystander naming none.
DRIVER = """
import subprocess, sys, time
from spotlight.runtime.spot.reaper import Reaper
session = sys.argv[1]
reaper = Reaper(session)
sleeper = [sys.executable, '-c', 'import time; time.sleep(300)']
raylet = f"import subprocess, time; subprocess.Popen({sleeper!r}); time.sleep(300)"
for _ in range(2):
    subprocess.Popen([sys.executable, '-c', raylet, '--session_name=' + session])
subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)', 'bystander'])
print('up', flush=True)
time.sleep(300)
"""


def alive(processes: list[psutil.Process]) -> list[psutil.Process]:
    return [p for p in processes if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def test_a_sigkilled_driver_leaves_no_process_of_its_session_and_spares_the_rest(tmp_path: Path) -> None:
    session = f"session_test_{os.getpid()}_{time.time_ns()}"
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, session], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(TESTS.parent)})
    assert driver.stdout.readline().strip() == "up"
    time.sleep(1.5)  # the grandchildren start, and the reaper notes the tree (every second)
    family = psutil.Process(driver.pid).children(recursive=True)
    bystander = [p for p in family if "bystander" in p.cmdline()]
    ray_like = [p for p in family if p not in bystander and "reaper.py" not in " ".join(p.cmdline())]
    assert len(ray_like) == 4 and len(bystander) == 1
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    deadline = time.monotonic() + 10
    while alive(ray_like) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(ray_like)  # the "raylets" and their renamed children, though re-parented to init
    assert alive(bystander)  # a process of the driver that is not the session's stays
    bystander[0].kill()


@pytest.mark.slow
def test_no_process_of_a_spotlight_run_is_alive_10_s_after_its_driver_is_sigkilled(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    config_file = tmp_path / "config.yaml"
    config_file.write_text(yaml.safe_dump({
        "mode": "spotlight", "run_dir": str(run_dir), "iterations": 50, "num_threads": 1,
        "reward": {"name": "paced_reward:paced"}, "explore": {"monitor_prompts": 1},
        "rollout": {"prompts_per_iteration": 2, "group_size": 2, "num_steps": 3},
        "eval": {"every": 100, "seeds_per_prompt": 1, "num_steps": 1, "grid_prompts": 1},
        "runtime": {"trace": None, "max_wall_s": None, "node_timeout_s": 240.0,
                    "planner": {"num_candidates": [4], "num_steps": [2]}}}))
    driver = subprocess.Popen([sys.executable, "-m", "spotlight", "train", "-c", str(config_file)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS.parent), str(TESTS)]),
                                   "PACE_S": "0.5"})
    deadline = time.monotonic() + 300
    while not (run_dir / "metrics.jsonl").is_file() or len((run_dir / "metrics.jsonl").read_text().splitlines()) < 2:
        assert driver.poll() is None and time.monotonic() < deadline, "the run did not reach iteration 1"
        time.sleep(0.1)
    family = psutil.Process(driver.pid).children(recursive=True)
    assert any("raylet" in " ".join(p.cmdline()) for p in family)  # a Ray run: head and spot node
    driver.send_signal(signal.SIGKILL)  # the driver alone, as the OOM killer or a scheduler does
    driver.wait()
    deadline = time.monotonic() + 10  # a process found dead stays dead: the test ends as soon as all are
    while alive(family) and time.monotonic() < deadline:
        time.sleep(0.1)
    survivors = alive(family)
    listing = subprocess.run(["ps", "-o", "pid,ppid,cmd", "-p", ",".join(str(p.pid) for p in family)],
                             capture_output=True, text=True).stdout
    assert not survivors, listing
