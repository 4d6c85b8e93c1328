"""Spawn a gloo world of test ranks and wait for them, killing them if a collective hangs."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
import torch.multiprocessing as mp


def run_ranks(target: Callable[..., None], args: tuple, nprocs: int, timeout_s: float) -> None:
    """Run ``target(rank, *args)`` in ``nprocs`` spawned processes; fail the test after ``timeout_s``.

    A mismatched collective blocks forever rather than raising, so the deadline is the only way a
    broken sharding shows up as a failure instead of a hung suite.
    """
    context = mp.start_processes(target, args=args, nprocs=nprocs, join=False, start_method="spawn")
    deadline = time.monotonic() + timeout_s
    while not context.join(timeout=1):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail(f"{nprocs} spawned ranks did not finish within {timeout_s:.0f} s: a collective is "
                        "probably mismatched")
