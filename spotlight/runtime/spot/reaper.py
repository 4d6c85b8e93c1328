"""Nothing of a run left running: a small process that kills the run's Ray processes once the driver is gone.

A local cluster's head is started from the main thread with Ray's parent-death signal, but its spot
nodes are added later, by the controller thread, without it (Ray ties that signal to its exit hooks,
which only the main thread may install), and a raylet outlives a driver that was SIGKILLed: seen with
a spot node's raylet, its device actor (~590 MB) and four agents re-parented to PID 1 for ~140 s.

`Reaper` starts ``python -I reaper.py SESSION`` beside the cluster, with a pipe as its stdin that
only the driver holds. The reaper blocks reading it; end of file comes when the driver closes it
(`Reaper.finish`, after a normal shutdown) or when the kernel closes it because the driver died,
however (SIGKILL included). Until then it notes, every `WATCH_S`, the driver's children whose command
line names the cluster's Ray session (``session_<date>_<pid>``: GCS, raylets, dashboard) and their
descendants (agents and workers, which rename themselves ``ray::...``). At the end it SIGKILLs those
(checked by start time, so a reused pid is spared) and whatever names the session now, with their
descendants, and orphans re-parented to PID 1 that hold the session's files open, pass after pass until
none is left, removes the folder it was given (the run's Ray token, ray_auth.py), and exits: nothing
else on the machine is touched. It imports only the standard library
(``-I``: no site packages, no PYTHONPATH), so it starts in milliseconds, and it
ignores SIGINT and SIGTERM, which reach it with the driver's process group (Ctrl-C), so that it
outlives the driver it watches.
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["Reaper", "session_tree"]

WATCH_S = 1.0  # how often the reaper notes the session's processes while the driver lives
ROUNDS = 5  # kill passes at most: a raylet that dies can still have started a worker
PROC = Path("/proc")


def _processes() -> dict[int, tuple[int, int]]:
    """{pid: (parent pid, start time in clock ticks)} of every process (/proc/PID/stat)."""
    table = {}
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):  # it ended while we looked
                continue
            table[int(entry.name)] = (int(fields[1]), int(fields[19]))
    return table


def _names_session(pid: int, needle: bytes) -> bool:
    try:
        return needle in (PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return False


def _holds_session_files(pid: int, needle: str) -> bool:
    """Whether ``pid`` has a file of the session open (its logs): how an agent whose raylet died as it forked
    it is found, renamed ``ray::...`` and re-parented to PID 1 with nothing on its command line to name it."""
    try:
        descriptors = os.listdir(PROC / str(pid) / "fd")
    except OSError:
        return False
    for descriptor in descriptors:
        try:
            if needle in os.readlink(PROC / str(pid) / "fd" / descriptor):
                return True
        except OSError:
            continue
    return False


def session_tree(session_name: str, parent: int | None = None) -> dict[int, int]:
    """{pid: start time} of the session's processes and all their descendants.

    The session's own processes name it on their command line (GCS, raylets, dashboard, monitors);
    the workers and agents a raylet starts rename themselves (``ray::IDLE``) and are found as its
    descendants. With ``parent``, only session processes that are its children count as roots.
    """
    table = _processes()
    needle = session_name.encode()
    roots = [pid for pid, (ppid, _) in table.items() if (parent is None or ppid == parent)
             and pid != os.getpid() and _names_session(pid, needle)]
    if parent is None:  # at the end: orphans of the session too (module docstring), found by their open files
        roots += [pid for pid, (ppid, _) in table.items() if ppid == 1 and pid != os.getpid()
                  and pid not in roots and _holds_session_files(pid, session_name)]
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    tree, stack = {}, list(roots)
    while stack:
        pid = stack.pop()
        if pid not in tree:
            tree[pid] = table[pid][1]
            stack.extend(children.get(pid, ()))
    return tree


def kill_session(session_name: str, seen: dict[int, int]) -> int:
    """SIGKILL the session's processes now and those ``seen`` earlier (when still the same process: same start
    time), pass after pass until one finds none; returns how many were signalled."""
    killed = 0
    for _ in range(ROUNDS):
        now = _processes()
        still_seen = {pid for pid, started in seen.items() if pid in now and now[pid][1] == started}
        targets = (set(session_tree(session_name)) | still_seen) - {os.getpid()}
        for pid in targets:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except OSError:
                pass
        seen = {}
        if not targets:
            break
        time.sleep(0.2)
    return killed


class Reaper:
    """The reaper process of one local Ray cluster (module docstring); `finish` after the cluster shut down."""

    def __init__(self, session_name: str, leftover: Path | None = None) -> None:
        """``leftover``: a folder of the run to remove at the end (its Ray token), if the driver could not."""
        self.session_name = session_name
        self.process: subprocess.Popen | None = None
        if not PROC.is_dir():  # no /proc to find the session's processes in
            return
        self.process = subprocess.Popen([sys.executable, "-I", str(Path(__file__).resolve()), session_name,
                                         *([str(leftover)] if leftover is not None else [])],
                                        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def finish(self, timeout_s: float = 5.0) -> None:
        """Let the reaper sweep what the shutdown left of the session and end (idempotent)."""
        if self.process is None:
            return
        process, self.process = self.process, None
        try:
            process.stdin.close()  # type: ignore[union-attr]
            process.wait(timeout=timeout_s)
        except (OSError, subprocess.TimeoutExpired):
            process.kill()


def main() -> None:
    """``reaper.py SESSION [FOLDER]``: note the session's processes until stdin ends, kill them, remove FOLDER."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    session_name, driver = sys.argv[1], os.getppid()
    seen: dict[int, int] = {}
    while True:  # nothing is ever written: only the end of file counts
        readable, _, _ = select.select([sys.stdin], [], [], WATCH_S)
        if readable and not os.read(sys.stdin.fileno(), 4096):
            break
        seen = session_tree(session_name, parent=driver)  # the driver's Ray processes, while it lives
    kill_session(session_name, seen)
    if len(sys.argv) > 2:
        shutil.rmtree(sys.argv[2], ignore_errors=True)


if __name__ == "__main__":
    main()
