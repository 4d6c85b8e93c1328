"""The run directory as a record that can be trusted: one writer at a time, a resume that cannot change
what ran, and metrics that survive a kill mid-line.

- `RunDirLock`: an exclusive ``flock`` on ``RUN_DIR/.lock`` for the life of a run. The kernel drops
  it when the process dies (SIGKILL included), so a crashed run never blocks its own ``--resume``.
- `check_resume_config`: ``--resume`` continues the run ``config.yaml`` describes; a config that
  differs in a field that changes the numbers (seed, mode, learning rate, ...) is refused, so the
  record never lies about what produced the weights. `SAFE_TO_CHANGE` lists what may differ. Paths are
  compared as files, not strings: ``run_dir`` is where the run is now (it may have been moved or
  copied), two spellings of one path are equal, and the model folder is compared by its contents
  (`spotlight.components.fingerprint`), so a moved model passes and replaced weights do not.
- `read_metrics`: ``metrics.jsonl`` is appended line by line; a process killed mid-write leaves a torn
  last line, which is dropped with a warning (its iteration is redone after the checkpoint).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
from pathlib import Path
from typing import Any

import yaml

from spotlight.components.fingerprint import check_same_model
from spotlight.config import TrainConfig, parse_config
from spotlight.schema import ConfigError

__all__ = ["SAFE_TO_CHANGE", "RunDirError", "RunDirLock", "check_resume_config", "ensure_run_dir", "read_metrics",
           "write_failed"]

logger = logging.getLogger(__name__)

LOCK_FILE = ".lock"

# Fields a resumed run may change: how long it goes on, how it is measured and checkpointed, and where
# it runs (thread placement, the number of trainer ranks: results may differ in the last bits with
# another thread or rank count). A key ending in ".*" covers its whole section.
SAFE_TO_CHANGE = ("iterations", "runtime.max_wall_s", "runtime.stop_grace_s", "eval.*", "checkpoint_every",
                  "num_threads", "pin_devices", "device_cores", "control_cores", "trainer.*", "log.*")


class RunDirError(RuntimeError):
    """The run directory cannot be used as asked; the message is one line naming the cause and the fix."""


def ensure_run_dir(run_dir: Path) -> Path:
    """Create ``run_dir`` if needed and return it; a one-line `RunDirError` when it cannot hold a run.

    Called before anything is written there (the run's log included), so a run_dir that is a file,
    lies inside a file, or on a file system that refuses it fails with its cause, not a traceback.
    """
    run_dir = Path(run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise RunDirError(f"run_dir {run_dir} is a file: set run_dir to a directory path")
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise RunDirError(f"cannot use run_dir {run_dir} ({error.strerror or error}): choose a writable "
                          "directory") from None
    if not os.access(run_dir, os.W_OK | os.X_OK):
        raise RunDirError(f"cannot use run_dir {run_dir} (not writable): choose a writable directory")
    return run_dir


class RunDirLock:
    """An exclusive lock on a run directory, held until `release` (or until this process ends)."""

    def __init__(self, run_dir: Path) -> None:
        self._fd: int | None = None
        run_dir = ensure_run_dir(run_dir)
        try:
            self._fd = os.open(run_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as error:
            raise RunDirError(f"cannot use run_dir {run_dir} ({error.strerror or error}): choose a writable "
                              "directory") from None
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(self._fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(self._fd)
            self._fd = None
            raise RunDirError(f"run_dir {run_dir} is in use by another spotlight run (pid {holder}): wait for it to "
                              "end, or choose another run_dir") from None
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, f"{os.getpid()}\n".encode(), 0)

    def release(self) -> None:
        """Let another run use the directory (idempotent)."""
        if self._fd is not None:
            os.close(self._fd)  # closing the only descriptor drops the flock
            self._fd = None

    def __del__(self) -> None:
        self.release()


def write_failed(path: Path, error: OSError, run_dir: Path) -> RunDirError:
    """The one-line error for a write into the run directory that failed (disk full, read-only, too large).

    What was written before stays: metrics lines are appended whole and flushed one by one, and a
    checkpoint appears only by an atomic rename, so the message can promise that ``--resume`` continues
    from the last complete checkpoint.
    """
    checkpoints = sorted(path.name for path in (Path(run_dir) / "checkpoints").glob("iter-*"))
    last = checkpoints[-1] if checkpoints else "none yet"
    return RunDirError(f"cannot write {path} ({error.strerror or error}): free space on its disk or make it writable, "
                       f"then continue with --resume (last complete checkpoint: {last}; what was written stays)")


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _safe(field: str) -> bool:
    return any(field == safe or (safe.endswith(".*") and field.startswith(safe[:-1])) for safe in SAFE_TO_CHANGE)


def _same_path(before: Any, now: Any) -> bool:
    """Two spellings of one file or folder (relative and absolute, through a link), seen from here."""
    if not (isinstance(before, str) and isinstance(now, str)):
        return False
    return os.path.realpath(os.path.expanduser(before)) == os.path.realpath(os.path.expanduser(now))


def check_resume_config(saved_path: Path, config: TrainConfig) -> None:
    """Refuse (one-line `RunDirError`) a resume whose config differs from the run's in an unsafe field.

    Both sides go through the same validation, so a field the saved file leaves at its default
    compares equal to the same default given explicitly. ``run_dir`` never counts (the run is where its
    files are), paths count as the files they name, and the model folder by its contents: a folder with
    other weights is a one-line `ModelFilesError`, the same weights elsewhere pass.
    """
    if not saved_path.is_file():
        if not (saved_path.parent / "checkpoints").is_dir():
            return  # nothing ran here yet: the resume itself says there is no checkpoint
        raise RunDirError(f"--resume: {saved_path} is missing, so what ran cannot be checked: restore it, or start "
                          "a new run_dir")
    try:
        saved = parse_config(TrainConfig, yaml.safe_load(saved_path.read_text(encoding="utf-8")) or {},
                             str(saved_path))
    except (ConfigError, yaml.YAMLError, UnicodeDecodeError) as error:
        raise RunDirError(f"--resume: the run's own {saved_path} no longer loads ({' '.join(str(error).split())}); "
                          "start a new run_dir") from None
    same_model = check_same_model(saved_path.parent, config)  # its recorded fingerprint against the folder now
    moved = {"run_dir", *(("model.pretrained", "base_checkpoint") if same_model else ())}
    before, now = _flatten(saved.model_dump(mode="json")), _flatten(config.model_dump(mode="json"))
    changed = sorted(field for field in before.keys() | now.keys()
                     if before.get(field) != now.get(field) and not _safe(field) and field not in moved
                     and not _same_path(before.get(field), now.get(field)))
    if changed:
        shown = ", ".join(f"{field} {before.get(field)!r} -> {now.get(field)!r}" for field in changed[:4])
        more = f" (+{len(changed) - 4} more)" if len(changed) > 4 else ""
        raise RunDirError(f"--resume: the config differs from the run's {saved_path} in {shown}{more}: resume with "
                          f"the run's own config (only {', '.join(SAFE_TO_CHANGE)} may change), or start a new "
                          "run_dir")


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The records of ``metrics.jsonl``; a torn last line (a kill mid-write) is dropped with a warning.

    A bad line before the last is not a torn write but a damaged file: a one-line `RunDirError`.
    """
    if not path.is_file():
        return []
    lines = path.read_bytes().split(b"\n")
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            if not isinstance(record, dict) or "iteration" not in record:
                raise ValueError("not a metrics record")
        except ValueError:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            if any(rest.strip() for rest in lines[number:]):
                raise RunDirError(f"{path} line {number} is not a metrics record: repair or remove that line, "
                                  "or start a new run_dir") from None
            logger.warning("%s: dropped a torn last line (%d bytes), written when the run was stopped mid-write",
                           path, len(line))
            continue
        records.append(record)
    return records
