"""The run's log: what Ray and its node processes write to stdout/stderr lands there, not on the terminal."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
from pathlib import Path

from spotlight.components.run_log import log_to

# A run in miniature, in its own process so that its descriptors 1 and 2 are the test's to read: this
# process prints, a child it starts writes to both descriptors (as Ray's node processes do), and the
# command's own progress goes to the terminal stream.
RUN = textwrap.dedent("""
    import os, subprocess, sys
    from pathlib import Path
    from spotlight.components.run_log import output_to_log

    print("before the run")
    with output_to_log(Path(sys.argv[1])) as terminal:
        print("python stdout: Raylet is terminated", flush=True)
        os.write(2, b"C++ stderr: [state-dump] ...\\n")
        subprocess.run(["sh", "-c", "echo child stdout; echo child stderr >&2"], check=True)
        terminal.write("progress: iteration 1/2\\n")
    print("after the run")
""")


def test_output_of_the_process_and_its_children_goes_to_the_log_and_progress_to_the_terminal(tmp_path: Path) -> None:
    log = tmp_path / "run" / "spotlight.log"
    ran = subprocess.run([sys.executable, "-c", RUN, str(log)], capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == "before the run\nafter the run\n"
    assert ran.stderr == "progress: iteration 1/2\n"
    written = log.read_text()
    for line in ("python stdout: Raylet is terminated", "C++ stderr: [state-dump]", "child stdout", "child stderr"):
        assert line in written
    assert "progress" not in written and "after the run" not in written


def test_package_warnings_are_one_line_on_the_terminal_and_everything_is_in_the_log(tmp_path: Path) -> None:
    log, terminal = tmp_path / "spotlight.log", tmp_path / "terminal.txt"
    with terminal.open("w") as stream, log_to(log, stream):
        logging.getLogger("spotlight.runtime.spot.pools").warning("spot device %s died\n  without a notice", "spot-3")
        logging.getLogger("a_library").info("library details")  # (Ray's own logger writes to fd 2)
    assert terminal.read_text() == "warning: spot device spot-3 died without a notice\n"
    assert "spot-3 died" in log.read_text() and "library details" in log.read_text()
    logging.getLogger("spotlight").warning("after the run")  # the handlers are gone with the block
    assert "after the run" not in log.read_text() + terminal.read_text()
