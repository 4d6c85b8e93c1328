"""SIGTERM and SIGINT as a request to stop: save, stop Ray, say how to continue.

Schedulers (Kubernetes, SLURM, spot managers) send SIGTERM and then SIGKILL after a grace period;
a person presses Ctrl-C. Either way the work since the last periodic checkpoint is worth keeping,
so the first signal does not kill the process but sets a `StopRequest`:

- the loop finishes the iteration in progress (the only point where the weights, optimizer and
  backend state agree), writes a checkpoint of it, closes the backend (Ray's processes) and ends
  with `RunStopped`, whose one line names the checkpoint, its iteration and the ``--resume`` command;
- an iteration that would not end in time is abandoned: ``runtime.stop_grace_s`` minus a reserve for
  closing after the signal, a timer raises `StopNow` inside the iteration (only there: validation and
  the checkpoint write are never cut), and the line names the last complete checkpoint instead; so
  does a stop whose checkpoint would take longer than the grace left (the last write's time), as the
  scheduler's SIGKILL would cut it (a 20 B full fine-tune's ~245 GB: `benchmarks/reliability/stop_grace.py`);
- a second signal exits at once (exit code 128 + the signal), with a line naming the last checkpoint.

Handlers can only be installed from the main thread; elsewhere (a test calling `train` from a
thread) the request is inert and signals keep their old meaning.
"""

from __future__ import annotations

import logging
import os
import shlex
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

__all__ = ["RunStopped", "Saved", "StopNow", "StopRequest", "last_checkpoint", "resume_command", "stop_on_signals",
           "stoppable"]

logger = logging.getLogger(__name__)
T = TypeVar("T")
R = TypeVar("R")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
MIN_RESERVE_S = 3.0  # kept back from the grace for closing Ray and printing, before any checkpoint is timed


class StopNow(BaseException):
    """Raised inside an iteration that cannot finish within the grace: abandon it (not an `Exception`, so no
    ``except Exception`` on the way swallows it)."""


class Saved(BaseException):
    """Raised at the safe point once the checkpoint is written: unwinds the loop (closing its backend) to
    `stoppable`, which turns it into `RunStopped`."""

    def __init__(self, iteration: int, checkpoint: Path, checkpoint_s: float) -> None:
        super().__init__(iteration)
        self.iteration, self.checkpoint, self.checkpoint_s = iteration, checkpoint, checkpoint_s


class RunStopped(Exception):
    """The run stopped on a signal, after saving what it could; ``line`` says what and how to go on."""

    def __init__(self, line: str, exit_code: int) -> None:
        super().__init__(line)
        self.line, self.exit_code = line, exit_code


def resume_command(argv: list[str] | None = None) -> str:
    """The command line that continues this run: this one with ``--resume`` (added once)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if "--resume" not in args:
        args.append("--resume")
    return shlex.join(["spotlight", *args])


class StopRequest:
    """Whether a stop signal came, which, when, and how much of the grace is left.

    ``reserve_s`` is what the loop keeps back for after the iteration (a checkpoint write and closing
    the backend): the loop raises it to twice its last measured checkpoint time.
    """

    def __init__(self, grace_s: float) -> None:
        self.grace_s = grace_s
        self.signal_name: str | None = None
        self.exit_code = 0
        self.received_at: float | None = None
        self.reserve_s = min(MIN_RESERVE_S, grace_s / 2)
        self.checkpoint_s = 0.0  # the last checkpoint's write time
        self._abandonable = False
        self._handler: object | None = None  # the installed signal handler, for `reinstall`

    @property
    def requested(self) -> bool:
        return self.received_at is not None

    def elapsed_s(self) -> float:
        """Seconds since the signal (0 without one)."""
        return 0.0 if self.received_at is None else time.monotonic() - self.received_at

    def observe_checkpoint(self, seconds: float) -> None:
        """Keep enough of the grace for a checkpoint as slow as the last one (twice it, capped at half the grace)."""
        self.checkpoint_s = seconds
        self.reserve_s = min(max(MIN_RESERVE_S, 2.0 * seconds), self.grace_s / 2)

    @contextmanager
    def abandonable(self) -> Iterator[None]:
        """The block (one iteration) that the grace timer may cut with `StopNow`."""
        self._abandonable = True
        try:
            if self.requested and self.elapsed_s() >= self.grace_s - self.reserve_s:
                raise StopNow
            yield
        finally:
            self._abandonable = False

    def receive(self, signum: int) -> None:
        """The first signal: note it and arm the timer that abandons a late iteration."""
        self.signal_name = signal.Signals(signum).name
        self.exit_code = 128 + signum
        self.received_at = time.monotonic()
        budget = max(0.0, self.grace_s - self.reserve_s)
        logger.warning(f"{self.signal_name}: stopping after the iteration in progress (a checkpoint within "
                       f"runtime.stop_grace_s={self.grace_s:g} s; a second signal exits at once)")
        if threading.current_thread() is threading.main_thread():
            signal.setitimer(signal.ITIMER_REAL, max(budget, 0.01))

    def deadline_passed(self) -> None:
        """SIGALRM: cut the iteration if one runs; otherwise the loop is already past it."""
        if self._abandonable:
            self._abandonable = False
            raise StopNow

    def check(self, done: int, run_dir: Path, checkpoint: Callable[[int], None]) -> None:
        """The loop's safe point, before each iteration: after a stop signal, write the checkpoint of ``done``
        iterations (unless it is on disk), timed, and end the run (`Saved`, through the loop's clean-up)."""
        if not self.requested:
            return
        self.disarm()
        path = Path(run_dir) / "checkpoints" / f"iter-{done:06d}"
        started = time.perf_counter()
        if not path.is_dir():
            left = self.grace_s - self.elapsed_s()
            if self.checkpoint_s > left:  # the scheduler's SIGKILL would cut it: the last one stays whole
                raise StopNow(f"a checkpoint takes {self.checkpoint_s:.1f} s here, more than the {left:.1f} s of "
                              f"runtime.stop_grace_s={self.grace_s:g} s left, so none was written")
            checkpoint(done)
        seconds = time.perf_counter() - started
        logger.info(f"{self.signal_name}: checkpoint {path} written in {seconds:.2f} s, {self.elapsed_s():.2f} s "
                    "after the signal")
        raise Saved(done, path, seconds)

    def abandoned(self, run_dir: Path, go_on: str, why: str = "") -> RunStopped:
        """The end of a run whose iteration (or start-up) was cut at the grace, or whose checkpoint would not fit in
        what was left of it (``why``): the last checkpoint on disk stays."""
        last = last_checkpoint(run_dir)
        if last is None:
            kept = "no checkpoint was written yet; start it again without --resume in a new run_dir"
        else:
            kept = f"the last checkpoint is {last} (iteration {int(last.name[5:])}; later ones are redone); {go_on}"
        why = why or (f"the iteration in progress was abandoned, as it would not end within runtime.stop_grace_s="
                       f"{self.grace_s:g} s")
        line = f"stopped by {self.signal_name}: {why} (all stopped {self.elapsed_s():.1f} s after the signal); {kept}"
        logger.info(line)
        return RunStopped(line, self.exit_code)

    def reinstall(self) -> None:
        """Take SIGTERM and SIGINT back: starting a Ray head installs Ray's own SIGTERM handler (exit 15)."""
        if self._handler is not None and threading.current_thread() is threading.main_thread():
            for signum in STOP_SIGNALS:
                signal.signal(signum, self._handler)  # type: ignore[arg-type]

    def disarm(self) -> None:
        """The loop reached its safe point: no iteration to cut any more."""
        if threading.current_thread() is threading.main_thread():
            signal.setitimer(signal.ITIMER_REAL, 0)


def last_checkpoint(run_dir: Path | None) -> Path | None:
    """The newest ``checkpoints/iter-*`` by name, unverified: checksumming a large model's files would not fit
    the time a stopping process has (``--resume`` verifies it and falls back to an older one if needed)."""
    if run_dir is None:
        return None
    return max((path for path in (Path(run_dir) / "checkpoints").glob("iter-*") if path.is_dir()), default=None)


def _exit_now(signum: int, run_dir: Path | None) -> None:
    """A second signal: one line (through logging, so the CLI shows it on the terminal above its progress
    line), then exit without cleanup; Ray's processes die with this one (their parent-death signal)."""
    last = last_checkpoint(run_dir)
    kept = f"the last checkpoint is {last}" if last is not None else "no checkpoint was written"
    logger.error(f"second {signal.Signals(signum).name}: exited at once; {kept}; continue with: {resume_command()}")
    for handler in [*logging.getLogger("spotlight").handlers, *logging.getLogger().handlers]:
        handler.flush()
    os._exit(128 + signum)


@contextmanager
def stop_on_signals(grace_s: float, run_dir: Path | None = None) -> Iterator[StopRequest]:
    """Turn SIGTERM and SIGINT into a `StopRequest` for the block (see the module docstring).

    ``run_dir``: where a second signal looks for the last checkpoint to name. Handlers are restored
    afterwards; outside the main thread nothing is installed.
    """
    request = StopRequest(grace_s)
    if threading.current_thread() is not threading.main_thread():
        yield request
        return

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if request.requested:
            _exit_now(signum, run_dir)
        # the grace timer's alarm is taken only now, so a run without a stop leaves SIGALRM to others
        previous.setdefault(signal.SIGALRM, signal.signal(signal.SIGALRM, on_alarm))
        request.receive(signum)

    def on_alarm(signum: int, frame: FrameType | None) -> None:
        request.deadline_passed()

    previous = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    for signum in STOP_SIGNALS:
        signal.signal(signum, on_signal)
    request._handler = on_signal
    try:
        yield request
    finally:
        if signal.SIGALRM in previous:
            signal.setitimer(signal.ITIMER_REAL, 0)
        for signum, handler in previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)


def stoppable(config: Any, start: Callable[[], T], run: Callable[[T], R]) -> R:
    """``run(start())`` with SIGTERM and SIGINT as a stop (module docstring); `RunStopped` ends a stopped run.

    ``config``: the run's `TrainConfig` (its grace, run directory, iteration count and whether its mode
    can resume). ``start`` builds the trainer (a Ray head started there installs its own SIGTERM
    handler, so the handlers are installed again after it); ``run`` runs it, calling
    `StopRequest.check` before each iteration and holding `StopRequest.abandonable` around it.
    """
    grace_s, run_dir = config.runtime.stop_grace_s, Path(config.run_dir)
    with stop_on_signals(grace_s, run_dir) as request:
        try:
            trainer = start()
            request.reinstall()
            trainer.stop = request  # type: ignore[attr-defined]
            return run(trainer)
        except Saved as saved:  # the loop closed its backend on the way out
            line = (f"stopped by {request.signal_name}: saved {saved.checkpoint} (iteration {saved.iteration} of "
                    f"{config.iterations}; written in {saved.checkpoint_s:.2f} s, all stopped "
                    f"{request.elapsed_s():.1f} s after the signal, grace {grace_s:g} s); {_how_to_go_on(config)}")
            logger.info(line)
            raise RunStopped(line, request.exit_code) from None
        except StopNow as cut:  # the grace ran out inside an iteration (or the start): the last checkpoint stays
            raise request.abandoned(run_dir, _how_to_go_on(config), str(cut)) from None


def _how_to_go_on(config: Any) -> str:
    """The ``--resume`` command (every mode resumes)."""
    return f"continue with: {resume_command()}"
