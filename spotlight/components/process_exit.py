"""Ending the ``spotlight`` process once its command is done, without the interpreter's slow finalization.

A process that imported torch, diffusers, peft and torch._dynamo (the first optimizer step imports it)
spends ~1.4 CPU-s and 1-3 s of wall time in Python's own finalization after its last line: tearing down
tens of thousands of module objects, none of which holds anything the kernel does not release at exit.
Measured on the 2-core machine (`python -c "import torch, spotlight.trainer, diffusers, peft; <one AdamW
step>"`): 9.3-10.8 s wall, 5.3 CPU-s, against 6.9-8.0 s and 3.9-4.0 CPU-s ending in ``os._exit``. A user
waits for that after every ``spotlight plan`` and ``train``, and the test suite's many CLI subprocesses
pay it each time.

Everything finalization does that matters runs first, in the interpreter's own order: the non-daemon
threads are joined, the ``atexit`` handlers run (Ray's shutdown, a LocalCluster's, multiprocessing's
joins, trackers' flushes), logging is shut down and the standard streams are flushed. Only then does the
process end with the command's exit status.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
from collections.abc import Callable
from typing import NoReturn

__all__ = ["exit_after"]


def exit_after(command: Callable[[], object]) -> NoReturn:
    """Run ``command`` (a click/typer entry point, which ends in SystemExit) and end the process with its status."""
    try:
        command()
        code: object = 0
    except SystemExit as done:
        code = done.code
    except KeyboardInterrupt:
        code = 130
    if code is None:
        code = 0
    elif not isinstance(code, int):  # sys.exit("message"): the interpreter prints it and exits 1
        print(code, file=sys.stderr)
        code = 1
    _finish()
    os._exit(code)


def _finish() -> None:
    """What the interpreter's exit does that has an effect outside this process, in its order."""
    main = threading.main_thread()
    for thread in threading.enumerate():
        if thread is not main and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()  # the documented atexit handlers, run exactly as at a normal exit
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe (`spotlight ... | head`): nothing left to write
            pass
