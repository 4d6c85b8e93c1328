"""`exit_after`: the command's exit status, and everything a normal exit does outside the process, still happen."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

PROGRAM = """
import atexit, sys, threading, time
from pathlib import Path
from spotlight.components.process_exit import exit_after
out = Path(sys.argv[1])
def late_write():  # a non-daemon thread still working when the command returns: the exit waits for it
    time.sleep(0.3)
    (out / "thread").write_text("done")
threading.Thread(target=late_write).start()
atexit.register(lambda: (out / "atexit").write_text("ran"))
sys.stdout.write("buffered, no newline")  # still in the buffer at the end: it must be flushed
def command():
    {body}
exit_after(command)
"""


@pytest.mark.parametrize(("body", "status", "stderr"), [("sys.exit(3)", 3, ""), ("pass", 0, ""),
                                                        ("sys.exit(None)", 0, ""),
                                                        ("sys.exit('bad config')", 1, "bad config")])
def test_the_status_the_threads_the_atexit_handlers_and_the_buffered_output_all_survive(
        tmp_path: Path, body: str, status: int, stderr: str) -> None:
    done = subprocess.run([sys.executable, "-c", PROGRAM.replace("{body}", body), str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == status, done.stderr
    assert (tmp_path / "thread").read_text() == "done" and (tmp_path / "atexit").read_text() == "ran"
    assert done.stdout == "buffered, no newline"
    assert done.stderr.strip() == stderr
