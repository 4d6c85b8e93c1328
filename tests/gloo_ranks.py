"""Start a gloo world of test ranks and wait for them, killing them if a collective hangs.

Every multi-rank test starts its ranks here, never by forking the test process: a fork of a process with
threads (Ray's, a reward thread, OpenMP's pool, left by an earlier test in the same xdist worker) can deadlock
in the child, and a forked child holds the worker's pipe to the xdist controller, so a worker that times out
leaves the controller waiting on it for ever (seen once: two forked ranks of test_data_parallel deadlocked in
``state_dict`` and the whole suite hung after the worker's timeout).
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable, Sequence

import pytest
import torch.multiprocessing as mp


def run_ranks(target: Callable[..., None], args: tuple, nprocs: int, timeout_s: float,
              preload: Sequence[str] = ()) -> None:
    """Run ``target(rank, *args)`` in ``nprocs`` fresh processes; fail the test after ``timeout_s``.

    A mismatched collective blocks forever rather than raising, so the deadline is the only way a
    broken sharding shows up as a failure instead of a hung suite. The ranks fork from a forkserver that
    imported ``target``'s module and ``preload`` (modules the ranks import lazily: peft and diffusers' model
    classes are seconds of CPU) once, instead of each spawned rank importing them again; the server is a fresh
    single-threaded process, so nothing of the test process (its threads, its OpenMP pool, a Ray client) is
    forked. The server lives as long as the test process: a later call's ranks import what it lacks.
    """
    multiprocessing.get_context("forkserver").set_forkserver_preload([target.__module__, *preload])  # pre-start
    context = mp.start_processes(target, args=args, nprocs=nprocs, join=False, start_method="forkserver")
    deadline = time.monotonic() + timeout_s
    while not context.join(timeout=1):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail(f"{nprocs} spawned ranks did not finish within {timeout_s:.0f} s: a collective is "
                        "probably mismatched")
