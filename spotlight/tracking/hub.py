"""`TrackerHub`: the run's experiment trackers, fed off the critical path.

The loop hands each iteration's record (and a validation's grid) to `log` / `image`, which only put it on
a queue: one background thread opens the trackers, talks to their libraries (a W&B service, an MLflow
store, TensorBoard's event files) and keeps ``RUN_DIR/trackers.json`` (each tracker's run id and the last
step it holds). A dashboard never stops training: a library that is missing is one line at start naming the
fix (`check_trackers`), and a tracker that fails mid-run (a full disk, a server down) is one warning, then
switched off while the run goes on.
"""

from __future__ import annotations

import json
import logging
import math
import os
import platform
import queue
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from spotlight.tracking.section import LogSection
from spotlight.tracking.trackers import Tracker, TrackerStart, make_tracker, missing_library

__all__ = ["STATE_FILE", "TrackerHub", "check_trackers", "flatten", "scalars_of"]

logger = logging.getLogger(__name__)

STATE_FILE = "trackers.json"
_STOP = object()


def check_trackers(section: LogSection) -> str | None:
    """One line naming the fix for the first tracker whose library is missing; None when all are installed."""
    for name in section.trackers:
        problem = missing_library(name)
        if problem is not None:
            return problem
    return None


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"train": {"lr": 1e-4}}`` → ``{"train.lr": 1e-4}``: a nested config as a tracker's hyper-parameters."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = value if isinstance(value, int | float | str | bool) or value is None else json.dumps(value)
    return flat


def scalars_of(record: dict[str, Any]) -> dict[str, float]:
    """The numbers of a metrics record (``metrics.jsonl``'s keys; flags as 0/1, NaN and inf left out)."""
    out: dict[str, float] = {}
    for key, value in record.items():
        if key == "iteration" or isinstance(value, str) or value is None:
            continue
        if isinstance(value, bool | int | float) and math.isfinite(float(value)):
            out[key] = float(value)
    return out


def _provenance(device: str) -> dict[str, str]:
    """The commit and machine a run ran on: what makes a dashboard's curve traceable to code."""
    import torch

    here = Path(__file__).resolve().parents[2]
    try:
        commit = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=5).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        commit = "unknown"
    machine = f"{platform.node()} ({platform.machine()}, {os.cpu_count()} cores)"
    accelerator = torch.cuda.get_device_name(0) if device == "cuda" and torch.cuda.is_available() else "cpu"
    return {"commit": commit, "machine": machine, "torch": torch.__version__, "device": accelerator}


class TrackerHub:
    """The configured trackers of one run, on one background thread; `close` drains and closes them."""

    def __init__(self, section: LogSection, run_dir: Path, config: dict[str, Any], config_yaml: str,
                 first_step: int, device: str = "cpu") -> None:
        self.section = section
        self.run_dir = Path(run_dir)
        self.state_path = self.run_dir / STATE_FILE
        saved = json.loads(self.state_path.read_text()) if first_step > 0 and self.state_path.is_file() else {}
        self.state: dict[str, dict[str, Any]] = saved
        self._start = dict(run_dir=self.run_dir, run_name=self.run_dir.resolve().name, config=flatten(config),
                           config_yaml=config_yaml, first_step=first_step)
        self._device = device
        self.trackers: list[Tracker] = [make_tracker(name, section) for name in section.trackers]
        self._queue: queue.Queue[Any] = queue.Queue()
        self.critical_s = 0.0  # time the loop spent handing records over
        self.worker_cpu_s = 0.0  # CPU time of the thread that talks to the libraries
        self.records = 0
        self.record_cpu_s: list[float] = []  # the thread's CPU time on each iteration's scalars, for benchmarks
        self._thread = threading.Thread(target=self._work, name="spotlight-trackers", daemon=True)
        self._thread.start()

    @property
    def active(self) -> bool:
        return bool(self.trackers)

    def log(self, step: int, record: dict[str, Any]) -> None:
        """Queue an iteration's scalars (keyed by ``step``, the iteration)."""
        started = time.perf_counter()
        self._queue.put(("scalars", step, scalars_of(record)))
        self.critical_s += time.perf_counter() - started
        self.records += 1

    def image(self, step: int, key: str, path: Path, caption: str) -> None:
        """Queue a saved image (a validation grid's PNG) with its caption; read from disk off the critical path."""
        if self.section.images:
            self._queue.put(("image", step, key, Path(path), caption))

    def finish(self, summary: dict[str, Any]) -> None:
        """Queue the run's final summary (best and final validation, summary.json's totals)."""
        self._queue.put(("finish", summary))

    def close(self, timeout_s: float = 60.0) -> None:
        """Drain the queue and close every tracker (a W&B run finished, an MLflow run terminated)."""
        self._queue.put(_STOP)
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            logger.warning(f"trackers: still busy after {timeout_s:.0f} s at close; what is queued may be lost")

    # --- the background thread ----------------------------------------------------------------------------

    def _work(self) -> None:
        cpu_started = time.thread_time()
        start_args = {**self._start, "provenance": _provenance(self._device)}
        for tracker in list(self.trackers):
            self._call(tracker, "open", lambda t=tracker: self.state.setdefault(t.name, {}).update(
                t.open(TrackerStart(**start_args, saved=self.state.get(t.name, {})))))
        self._write_state()
        while True:
            item = self._queue.get()
            if item is _STOP:
                break
            kind, *args = item
            if kind == "scalars":
                self._scalars(*args)
            elif kind == "image":
                self._image(*args)
            elif kind == "finish":
                for tracker in list(self.trackers):
                    self._call(tracker, "finish", lambda t=tracker, summary=args[0]: t.finish(summary))
        for tracker in list(self.trackers):
            self._call(tracker, "close", tracker.close)
        self.worker_cpu_s = time.thread_time() - cpu_started

    def _holds(self, tracker: Tracker, step: int) -> bool:
        """Whether an append-only tracker already holds ``step`` (logged before a stop that ``--resume`` redoes)."""
        return tracker.name != "tensorboard" and step <= self.state.get(tracker.name, {}).get("logged_through", -1)

    def _scalars(self, step: int, values: dict[str, float]) -> None:
        cpu_started = time.thread_time()
        for tracker in list(self.trackers):
            if not self._holds(tracker, step):
                self._call(tracker, f"iteration {step}", lambda t=tracker: t.scalars(step, values))
        for tracker in self.trackers:
            entry = self.state.setdefault(tracker.name, {})
            entry["logged_through"] = max(step, entry.get("logged_through", -1))
        self._write_state()
        self.record_cpu_s.append(time.thread_time() - cpu_started)

    def _image(self, step: int, key: str, path: Path, caption: str) -> None:
        from PIL import Image

        try:
            with Image.open(path) as image:
                pixels = np.asarray(image.convert("RGB"))
        except OSError as error:
            logger.warning(f"trackers: could not read {path} ({error}); its image is not logged")
            return
        for tracker in list(self.trackers):
            if not self._holds(tracker, step):
                self._call(tracker, f"image {step}", lambda t=tracker: t.image(step, key, pixels, caption))

    def _call(self, tracker: Tracker, what: str, call: Any) -> None:
        try:
            call()
        except Exception as error:  # a dashboard never stops training: warn once, switch the tracker off
            logger.warning(f"trackers: {tracker.name} failed ({what}: {type(error).__name__}: "
                           f"{str(error).splitlines()[0] if str(error) else ''}); it is switched off, training goes on")
            self.trackers.remove(tracker)
            if what != "close":
                try:
                    tracker.close()
                except Exception:  # already failing: its own close may fail too
                    pass

    def _write_state(self) -> None:
        temporary = self.state_path.with_suffix(".tmp")
        try:
            temporary.write_text(json.dumps(self.state, indent=1))
            os.replace(temporary, self.state_path)
        except OSError as error:  # the record of run ids only matters for --resume; training goes on
            logger.warning(f"trackers: could not write {self.state_path} ({error})")
