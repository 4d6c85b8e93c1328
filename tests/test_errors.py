"""The failure handler's pieces: which errors are written for a person, and where a traceback goes."""

from __future__ import annotations

from pathlib import Path

from spotlight import errors
from spotlight.market.traces import TraceError
from spotlight.runtime.spot.pools import PoolError
from spotlight.schema import ConfigError


def test_the_packages_person_facing_errors_are_known_and_other_errors_are_not() -> None:
    assert errors.is_known(ConfigError("rollout.group_size: ...")) and errors.is_known(TraceError("t"))
    assert errors.is_known(PoolError("no spot node"))
    assert not errors.is_known(ValueError("a bug")) and not errors.is_known(KeyError("a bug"))


def test_a_message_over_several_lines_becomes_one_and_an_empty_one_names_the_type() -> None:
    assert errors.one_line(ValueError("first\n   second\tthird ")) == "first second third"
    assert errors.one_line(KeyError()) == "KeyError"


def test_the_traceback_goes_to_the_run_log_or_else_to_the_temporary_folder(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)  # read TMPDIR again
    try:
        raise ZeroDivisionError("division by zero")
    except ZeroDivisionError as error:
        caught = error
    run_log = tmp_path / "run" / "spotlight.log"
    assert errors.write_traceback(caught, errors.crash_log_path(run_log), ["train"]) == run_log
    assert "ZeroDivisionError: division by zero" in run_log.read_text()
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    written = errors.write_traceback(caught, blocked / "spotlight.log", ["eval", "m"])  # its parent is a file
    assert written.parent == tmp_path and written.name.startswith("spotlight-") and "eval m" in written.read_text()
