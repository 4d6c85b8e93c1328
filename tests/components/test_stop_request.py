"""The stop request's decisions at its safe point, with real signals sent to this process."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from spotlight.components.stop_signals import Saved, StopNow, resume_command, stop_on_signals


def test_at_the_safe_point_the_checkpoint_is_written_and_the_run_ends(tmp_path: Path) -> None:
    written: list[int] = []
    before = signal.getsignal(signal.SIGTERM)  # SIG_DFL, or Ray's if an earlier test in this process started Ray
    with stop_on_signals(25.0, tmp_path) as request:
        request.check(3, tmp_path, written.append)  # no signal yet: nothing happens
        os.kill(os.getpid(), signal.SIGTERM)  # handled at the next bytecode: a request, not an exit
        assert request.requested and request.exit_code == 143
        with pytest.raises(Saved) as saved:
            request.check(3, tmp_path, written.append)
    assert written == [3] and saved.value.iteration == 3 and saved.value.checkpoint == tmp_path / "checkpoints" / \
        "iter-000003"
    assert signal.getsignal(signal.SIGTERM) is before  # restored


def test_a_checkpoint_slower_than_the_grace_left_is_not_started(tmp_path: Path) -> None:
    written: list[int] = []
    with stop_on_signals(5.0, tmp_path) as request:
        request.observe_checkpoint(60.0)  # as a 20 B full fine-tune's ~245 GB on a 2 GB/s disk would
        os.kill(os.getpid(), signal.SIGINT)
        with pytest.raises(StopNow, match=r"a checkpoint takes 60.0 s here, more than the [0-9.]+ s of"):
            request.check(3, tmp_path, written.append)
    assert written == []  # the last checkpoint stays whole instead of a write that SIGKILL would cut


def test_the_grace_timer_cuts_only_an_abandonable_block(tmp_path: Path) -> None:
    import time

    with stop_on_signals(0.2, tmp_path) as request:
        os.kill(os.getpid(), signal.SIGTERM)  # the timer fires after 0.2 s minus the reserve (half the grace)
        time.sleep(0.3)  # outside an iteration: nothing is cut
        with pytest.raises(StopNow), request.abandonable():
            time.sleep(5)  # already past the grace: cut at once


def test_the_resume_command_is_this_one_with_resume_once() -> None:
    assert resume_command(["train", "-c", "my run.yaml"]) == "spotlight train -c 'my run.yaml' --resume"
    assert resume_command(["train", "--resume"]) == "spotlight train --resume"
