"""The run's log file: the details of a run go there, so the terminal shows only what a person needs.

Ray writes to the process's stdout and stderr from places Python's ``logging`` does not reach: its
C++ threads, the error listener that prints every node's death (a 20-line "Raylet is terminated"
dump each time the runtime removes a spot node on purpose), and the node processes it starts, which
inherit the driver's file descriptors; so do the model libraries (transformers', diffusers' and
tokenizers' notices and progress bars print to stderr while a pipeline folder loads or saves).
`output_to_log` points descriptors 1 and 2 at the run's log
for the length of a run and hands back a stream on the original terminal for the command's own
progress and warnings; `log_to` sends Python's logging to the same file, with the ``spotlight``
package's warnings also shown on the terminal, one line each.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

__all__ = ["RUN_LOG_NAME", "log_to", "output_to_log"]

RUN_LOG_NAME = "spotlight.log"  # in the run directory
_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


@contextmanager
def output_to_log(log_path: Path) -> Iterator[TextIO]:
    """Send file descriptors 1 and 2 to ``log_path`` (appended) while the block runs; yields the terminal.

    The yielded stream writes to a duplicate of the original stderr, so progress bars and one-line
    warnings still reach the person while everything else written to stdout or stderr, by this
    process or by the processes it starts, lands in the log. Both descriptors are restored on exit.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = {fd: os.dup(fd) for fd in (1, 2)}
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    terminal = os.fdopen(os.dup(saved[2]), "w", buffering=1, encoding="utf-8", errors="replace")
    try:
        for fd in (1, 2):
            os.dup2(log_fd, fd)
        yield terminal
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, copy in saved.items():
            os.dup2(copy, fd)
            os.close(copy)
        os.close(log_fd)
        terminal.close()


class _OneLine(logging.Formatter):
    """``warning: <message>`` on one line (a person reads it; the log file keeps the details)."""

    def format(self, record: logging.LogRecord) -> str:
        return f"{record.levelname.lower()}: {' '.join(record.getMessage().split())}"


@contextmanager
def log_to(log_path: Path, terminal: TextIO | None = None) -> Iterator[None]:
    """Python logging of every library into ``log_path`` while the block runs; ``spotlight`` warnings
    also on ``terminal`` (one line each). The handlers are removed on exit."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    to_file = logging.FileHandler(log_path, encoding="utf-8")
    to_file.setFormatter(logging.Formatter(_FORMAT))
    root, package = logging.getLogger(), logging.getLogger("spotlight")
    to_terminal = None
    if terminal is not None:
        to_terminal = logging.StreamHandler(terminal)
        to_terminal.setLevel(logging.WARNING)
        to_terminal.setFormatter(_OneLine())
        package.addHandler(to_terminal)
    old_level = root.level
    root.addHandler(to_file)
    root.setLevel(min(old_level, logging.INFO) if old_level else logging.INFO)
    try:
        yield
    finally:
        root.removeHandler(to_file)
        root.setLevel(old_level)
        if to_terminal is not None:
            package.removeHandler(to_terminal)
        to_file.close()
