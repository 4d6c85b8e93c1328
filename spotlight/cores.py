"""One device = one core: pin a device's process to a core of its own, with one compute thread.

On a shared CPU box a "device" is otherwise whatever the scheduler gives it: a spot device's
exploration then slows the trainer (measured on this 2-core machine: the update went from 2.4-2.9 s
to 4.0 s), and a mode with more devices is not a mode with more hardware. Pinning each device to a
disjoint core makes "one on-demand + one spot device" mean two cores, and vanilla one, as when a user
rents accelerators.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager


class CoreError(ValueError):
    """A core list that this machine cannot honour; the message names the fix."""


def available_cores() -> list[int]:
    """The cores this process may run on (its affinity mask), sorted."""
    return sorted(os.sched_getaffinity(0))


def check_cores(cores: Sequence[int], field: str = "device_cores") -> None:
    """Raise :class:`CoreError` if a core is repeated or not on this machine (``field``: the list's config name)."""
    if len(set(cores)) != len(cores):
        raise CoreError(f"{field} {list(cores)} repeats a core: give each its own core")
    missing = sorted(set(cores) - set(range(os.cpu_count() or 1)))
    if missing:
        raise CoreError(f"{field} {list(cores)} names core(s) {missing} that this machine lacks "
                        f"(it has 0-{(os.cpu_count() or 1) - 1}); set {field} to fewer or null")


def pin_process(core: int | None, num_threads: int = 1) -> None:
    """Pin the calling process to ``core`` with one torch thread (None: unpinned, ``num_threads`` threads).

    Threads follow the process's mask, so one thread per pinned core: more would only contend.
    """
    import torch  # here, not at the top: the config imports this module, and `spotlight --help` needs no torch

    if core is not None:
        os.sched_setaffinity(0, {core})
        num_threads = 1
    torch.set_num_threads(num_threads)


@contextmanager
def pinned(core: int | None, num_threads: int = 1) -> Iterator[None]:
    """`pin_process` for the duration of a block, then the caller's mask and thread count again.

    A run pins the process that calls it (the CLI's, or a test's): without the restore, a library
    call would leave the caller on one core for good, and every process it starts after would inherit that.
    """
    import torch

    global _OUTER_MASK
    mask, threads, outer = os.sched_getaffinity(0), torch.get_num_threads(), _OUTER_MASK
    _OUTER_MASK = outer if outer is not None else mask
    pin_process(core, num_threads)
    try:
        yield
    finally:
        os.sched_setaffinity(0, mask)
        torch.set_num_threads(threads)
        _OUTER_MASK = outer


_OUTER_MASK: set[int] | None = None  # the mask before the outermost `pinned` block now open


def unpinned_cores() -> list[int]:
    """The cores this process may run on, as before a `pinned` block it is in (a run's trainer pins itself to
    one core, yet a config it loads, say for ``--resume``, places its other trainer ranks on the rest)."""
    return sorted(_OUTER_MASK) if _OUTER_MASK is not None else available_cores()


@contextmanager
def spawning_on(cores: Sequence[int] | None) -> Iterator[None]:
    """Processes and threads started by the calling thread in this block run on ``cores`` (None: unchanged).

    A child inherits the affinity of the thread that starts it, so Ray's head (GCS, raylet), the raylets
    of spot nodes, the queue actor's worker and the driver's own Ray threads, all started from the
    trainer, would otherwise share the trainer's one core: measured on this machine, the update took 6.5 s
    while a spot device explored against 5.2-5.4 s in vanilla. Only the calling thread's mask changes
    (Linux applies ``sched_setaffinity(0)`` per thread), so the trainer's compute is not moved meanwhile.
    """
    if not cores:
        yield
        return
    mask = os.sched_getaffinity(0)
    os.sched_setaffinity(0, set(cores))
    try:
        yield
    finally:
        os.sched_setaffinity(0, mask)
