"""How a ``spotlight`` command fails in front of a person: one line on the terminal, details in a log.

- A known error (a malformed config, a missing checkpoint, a reward that always fails, a cluster that
  cannot host the run, ...) carries a message that already names the cause and the fix: it prints as
  ``error: <message>`` and the command exits 2.
- Anything else is a bug or a library failing: one line naming the exception and the log file that
  keeps its traceback, exit 1. ``spotlight --debug ...`` prints the traceback as well.
- Ctrl-C prints one line and exits 130; what the run wrote stays readable. ``spotlight train`` turns
  SIGTERM and SIGINT into a stop that saves a checkpoint first (`spotlight.components.stop_signals`):
  its one line names the checkpoint and the ``--resume`` command, exit 128 + the signal (143, 130).

The known error types are looked up by name in the modules already imported, so this module imports
none of them (the CLI stays fast to start, and an error type can only match if its module ran).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

__all__ = ["EXIT_INTERRUPTED", "EXIT_KNOWN", "EXIT_UNEXPECTED", "crash_log_path", "is_known", "one_line",
           "stopped_by_signal", "write_traceback"]

EXIT_KNOWN = 2
EXIT_UNEXPECTED = 1
EXIT_INTERRUPTED = 130

# (module, class) of every error whose message is written for a person.
KNOWN_ERRORS = (
    ("spotlight.schema", "ConfigError"),
    ("spotlight.components.checkpoint", "CheckpointError"),
    ("spotlight.rewards.base", "RewardError"),
    ("spotlight.trainer", "RunError"),
    ("spotlight.components.run_dir", "RunDirError"),
    ("spotlight.components.fingerprint", "ModelFilesError"),
    ("spotlight.market.traces", "TraceError"),
    ("spotlight.market.prices", "PriceError"),
    ("spotlight.runtime.spot.pools", "PoolError"),
    ("spotlight.cores", "CoreError"),
    ("spotlight.runtime.spot.worker", "WorkerConfigError"),
    ("spotlight.runtime.sp.reconfigure", "ReconfigureError"),
    ("spotlight.report.run_data", "ReportError"),
    ("spotlight.models.pipelines.loading", "DiffusersLoadError"),
    ("spotlight.models.editing.condition", "EditRowError"),
)


def is_known(error: BaseException) -> bool:
    """Whether ``error`` is one of the package's errors written for a person (see KNOWN_ERRORS)."""
    for module_name, class_name in KNOWN_ERRORS:
        error_type = getattr(sys.modules.get(module_name), class_name, None)
        if isinstance(error_type, type) and isinstance(error, error_type):
            return True
    return False


def stopped_by_signal(error: BaseException) -> tuple[str, int] | None:
    """(its line, its exit code) if ``error`` is a run that a signal stopped after saving, else None."""
    stopped = getattr(sys.modules.get("spotlight.components.stop_signals"), "RunStopped", None)
    if isinstance(stopped, type) and isinstance(error, stopped):
        return error.line, error.exit_code  # type: ignore[attr-defined]
    return None


def one_line(error: BaseException) -> str:
    """The error's message on one line (a message that spans lines is joined, never cut)."""
    return " ".join(str(error).split()) or type(error).__name__


def crash_log_path(run_log: Path | None) -> Path:
    """Where an unexpected error's traceback goes: the run's log if the command has one, else a new
    file in the temporary folder (``spotlight-<UTC time>-<pid>.log``)."""
    if run_log is not None:
        return run_log
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    return Path(tempfile.gettempdir()) / f"spotlight-{stamp}-{os.getpid()}.log"


def write_traceback(error: BaseException, path: Path, argv: list[str]) -> Path:
    """Append the command line and ``error``'s full traceback to ``path``; returns the path written.

    Falls back to the temporary folder when ``path`` cannot be written (a read-only run directory),
    so the one line on the terminal always names a file that exists.
    """
    text = (f"--- {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())} spotlight {' '.join(argv)}\n"
            + "".join(traceback.format_exception(type(error), error, error.__traceback__)))
    for target in (path, crash_log_path(None)):
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            with target.open("a", encoding="utf-8") as log:
                log.write(text)
            return target
        except OSError:
            continue
    return path
