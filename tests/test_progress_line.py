"""The progress line at 80, 60 and 160 columns: the essentials always, the rest dropped from the end."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from spotlight.components.progress_line import AboveTheLine, ProgressLine, ProgressState, clock_time, layout

RECORD = {"time/wall_s": 190.0, "rollout/reward_mean": 0.393, "cost/usd": 0.167, "util/spot_to_date": 0.82,
          "util/spot_held_fraction_to_date": 0.5, "util/spot_train_phase": 0.97, "val/strict_accuracy": 0.331}


def state_after_12_of_55(max_wall_s: float | None = 900.0) -> tuple[ProgressState, float]:
    """Iteration 12 of 55 came at t = 100 (monotonic) with the run clock at 190 s; the line is drawn at t = 112."""
    state = ProgressState(label="spotlight", total=55, max_wall_s=max_wall_s)
    state.update(12, RECORD, now=100.0)
    return state, 112.0


ESSENTIALS = ("12/55", "3:22 elapsed", "left", "val 0.331")  # 190 s + 12 s since the record


@pytest.mark.parametrize("width", [80, 60, 160])
def test_the_essentials_are_always_there_and_the_line_fits(width: int) -> None:
    state, now = state_after_12_of_55()
    line = layout(state, width, now)
    assert len(line) <= width
    assert all(part in line for part in ESSENTIALS), line


def test_at_160_columns_everything_shows_with_a_bar_filling_the_rest() -> None:
    state, now = state_after_12_of_55()
    line = layout(state, 160, now)
    assert len(line) == 160
    for part in ("spotlight", "reward 0.393", "$0.1670", "spot util 0.82", "held 0.50", "━"):
        assert part in line, line
    assert line.index("reward") < line.index("$") < line.index("spot util") < line.index("held")


def test_at_80_columns_utilisation_and_dollars_drop_before_reward_and_the_bar() -> None:
    state, now = state_after_12_of_55()
    line = layout(state, 80, now)
    assert "spot util" not in line and "$" not in line
    assert "spotlight" in line and "━" in line and "reward 0.393" in line, line


def test_at_60_columns_only_the_essentials_and_the_mode_remain() -> None:
    state, now = state_after_12_of_55()
    line = layout(state, 60, now)
    assert "reward" not in line and "$" not in line and "spot util" not in line and "━" not in line, line
    assert line.startswith("spotlight  12/55  3:22 elapsed"), line


def test_remaining_time_is_the_pace_so_far_or_the_wall_limit_if_sooner() -> None:
    state, now = state_after_12_of_55(max_wall_s=None)
    assert state.remaining_s(now) == pytest.approx(190 / 12 * 43 - 12)  # 43 iterations left at 15.8 s each
    assert "~11:08 left" in layout(state, 80, now)  # 190 + 681 s is before a 900 s limit: the pace decides
    state, now = state_after_12_of_55(max_wall_s=600.0)
    assert state.remaining_s(now) == pytest.approx(600 - 202)  # the run stops after 600 s of its clock
    assert "~6:38 left" in layout(state, 80, now)


def test_before_any_validation_and_pace_the_line_says_so() -> None:
    state = ProgressState(label="vanilla", total=10)
    assert layout(state, 80, now=0.0).startswith("vanilla  0/10")
    assert "? left" in layout(state, 80, 0.0) and "val –" in layout(state, 80, 0.0)
    state.update(1, {"time/wall_s": 5.0, "rollout/reward_mean": 0.2}, now=0.0)
    assert "val –" in layout(state, 80, 0.0) and "~0:45 left" in layout(state, 80, 0.0)
    state.update(2, {"time/wall_s": 10.0, "val/strict_accuracy": 0.25}, now=1.0)
    state.update(3, {"time/wall_s": 15.0}, now=2.0)
    assert "val 0.250" in layout(state, 80, 2.0)  # the last validation stays until the next


def test_a_reward_without_a_strict_flag_shows_its_mean_reward_named() -> None:
    """The score that picks the best model is the mean reward there, not a strict accuracy of 0.000 (issue 36)."""
    state = ProgressState(label="vanilla", total=10)
    state.update(1, {"time/wall_s": 5.0, "val/strict_accuracy": 0.0, "val/reward": 0.731, "val/score": 0.731,
                     "val/score_is_strict": 0.0}, now=0.0)
    line = layout(state, 80, 0.0)
    assert "val reward 0.731" in line and "0.000" not in line, line


def test_spot_utilisation_is_the_runs_over_held_time_not_the_train_phases() -> None:
    state, now = state_after_12_of_55()
    line = layout(state, 160, now)
    assert "spot util 0.82" in line and "0.97" not in line, line


def test_the_renderable_draws_the_layout_for_the_consoles_width() -> None:
    state, now = state_after_12_of_55()
    out = io.StringIO()
    Console(file=out, width=60, force_terminal=False).print(ProgressLine(state, clock=lambda: now))
    assert out.getvalue() == layout(state, 60, now) + "\n"


def test_clock_time_switches_to_hours_at_an_hour() -> None:
    assert clock_time(59) == "0:59" and clock_time(3599) == "59:59" and clock_time(3723) == "1:02:03"


def test_elapsed_never_runs_backwards_when_the_runs_clock_leaves_validation_out() -> None:
    state = ProgressState(label="vanilla", total=3)
    state.update(1, {"time/wall_s": 10.0}, now=100.0)
    before = state.elapsed_s(125.0)  # a 15 s validation after iteration 1: the wall goes on
    state.update(2, {"time/wall_s": 20.0}, now=125.0)  # the run's clock counted only the 10 s of training
    assert before == state.elapsed_s(125.0) == 35.0
    assert state.remaining_s(125.0) == pytest.approx(10.0)  # the pace is the run's: 10 s per iteration


def test_a_long_warning_printed_above_the_line_stays_one_line_at_any_width() -> None:
    out = io.StringIO()
    stream = AboveTheLine(Console(file=out, width=40, force_terminal=False))
    warning = "warning: guard: iteration 12: " + "the reward collapsed " * 5 + "[rolled back]"
    stream.write(warning[:30])
    stream.write(warning[30:] + "\n")
    assert out.getvalue() == warning + "\n"  # no wrap at 40 columns, no markup eaten
