"""The one line ``spotlight train`` keeps on the terminal: what a person looks for first, at any width.

Rich's stock progress columns crop from the left of whatever does not fit, so at 80 columns the
iteration counter and the elapsed time were the parts elided. Here the line is laid out by priority:
iteration/total, elapsed, remaining and the last validation score are always there; the mode, the
bar, the rollout reward, the dollars spent and the spot utilisation follow, and drop in reverse
order (utilisation first) when the terminal is narrow. The validation score is the one that picks
the best model: strict accuracy (``val 0.412``), or the mean reward of a reward without a strict
flag, named (``val reward 0.731``). Spot utilisation is the run's so far over the time the spot
devices were held, with the held fraction beside it, as the summary reports them at the end. The
layout is a pure function of the state, the width and the clock (`layout`), so it is tested without
a terminal.
"""

from __future__ import annotations

import io
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rich.console import Console, ConsoleOptions, RenderResult
from rich.text import Text

__all__ = ["AboveTheLine", "ProgressLine", "ProgressState", "clock_time", "layout"]

_GAP = "  "
_MIN_BAR = 8


def clock_time(seconds: float) -> str:
    """``m:ss`` under an hour, ``h:mm:ss`` from one."""
    seconds = max(0, int(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


@dataclass
class ProgressState:
    """What the line shows, updated once per iteration from the run's metrics record.

    ``max_wall_s``: the run stops after the iteration that passes it (``runtime.max_wall_s``), so the
    remaining time is the sooner of that and the iterations left at the pace so far.
    """

    label: str
    total: int
    max_wall_s: float | None = None
    iteration: int = 0
    run_s: float = 0.0  # the run's clock (time/wall_s) at the last record
    seen_at: float | None = None  # time.monotonic() when the last record came
    started_at: float | None = None  # time.monotonic() when the run's clock was 0, from the first record
    validation: float | None = None
    validation_name: str = ""  # "" for strict accuracy, "reward " for the mean reward of a reward without a strict flag
    reward: float | None = None
    usd: float | None = None
    spot_util: float | None = None
    spot_held: float | None = None

    def update(self, iteration: int, record: dict[str, Any], now: float) -> None:
        """Take one iteration's metrics record (``metrics.jsonl`` keys)."""
        self.iteration, self.seen_at = iteration, now
        self.run_s = float(record.get("time/wall_s", self.run_s))
        if self.started_at is None:
            self.started_at = now - self.run_s
        score = record.get("val/score", record.get("val/strict_accuracy"))
        if score is not None:  # the score that picks the best model (loop/evaluation.py, EvalResult.score)
            self.validation = float(score)
            self.validation_name = "" if record.get("val/score_is_strict", 1.0) else "reward "
        self.reward = record.get("rollout/reward_mean", self.reward)
        self.usd = record.get("cost/usd", self.usd)
        self.spot_util = record.get("util/spot_to_date", self.spot_util)
        self.spot_held = record.get("util/spot_held_fraction_to_date", self.spot_held)

    def elapsed_s(self, now: float) -> float:
        """Seconds since the run's clock started, as a watch on the wall reads them (it never runs backwards).

        The run's own clock (``time/wall_s``) leaves validation out, so it is used for the pace, not shown.
        """
        return 0.0 if self.started_at is None else now - self.started_at

    def remaining_s(self, now: float) -> float | None:
        """Seconds to the end (iterations left at the pace so far, or the wall limit if sooner); None before a pace."""
        if self.iteration <= 0 or self.run_s <= 0 or self.seen_at is None:
            return None
        by_iterations = self.run_s / self.iteration * (self.total - self.iteration)
        end = self.run_s + by_iterations
        if self.max_wall_s is not None:
            end = min(end, max(self.max_wall_s, self.run_s))
        return max(0.0, end - self.run_s - (now - self.seen_at))


def _number(value: float | None, fmt: str) -> str:
    return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, fmt)


def layout(state: ProgressState, width: int, now: float) -> str:
    """The line for a terminal ``width`` columns wide; never longer than ``width``.

    The essentials come first and always; each optional part is added in priority order while it fits
    (the first that does not fit ends the list, so a lower part never shows while a higher one is
    dropped), and the bar takes what room is left.
    """
    remaining = state.remaining_s(now)
    essentials = [
        f"{state.iteration}/{state.total}",
        f"{clock_time(state.elapsed_s(now))} elapsed",
        f"{'?' if remaining is None else '~' + clock_time(remaining)} left",
        f"val {state.validation_name}{_number(state.validation, '.3f')}",
    ]
    optional = [state.label, "BAR", f"reward {_number(state.reward, '.3f')}"]
    if state.usd is not None:
        optional.append(f"${state.usd:.4f}")
    if state.spot_util is not None:
        optional.append(f"spot util {_number(state.spot_util, '.2f')}")
    if state.spot_held is not None:
        optional.append(f"held {_number(state.spot_held, '.2f')}")
    used = len(_GAP.join(essentials))
    chosen: list[str] = []
    for part in optional:
        need = len(_GAP) + (_MIN_BAR if part == "BAR" else len(part))
        if used + need > width:
            break
        chosen.append(part)
        used += need
    bar_width = _MIN_BAR + (width - used) if "BAR" in chosen else 0
    parts = []
    if state.label in chosen:
        parts.append(state.label)
    parts.append(essentials[0])
    if bar_width:
        done = 0 if state.total <= 0 else round(bar_width * min(1.0, state.iteration / state.total))
        parts.append("━" * done + "─" * (bar_width - done))
    parts += essentials[1:]
    parts += [part for part in chosen if part not in (state.label, "BAR")]
    return _GAP.join(parts)[:width]


class ProgressLine:
    """A rich renderable (for ``rich.live.Live``) that lays the line out for the console's width at each refresh."""

    def __init__(self, state: ProgressState, clock: Callable[[], float] = time.monotonic) -> None:
        self.state, self.clock = state, clock

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield Text(layout(self.state, options.max_width, self.clock()), no_wrap=True, overflow="crop")


class AboveTheLine(io.TextIOBase):
    """A text stream (for a logging handler) whose lines print above the progress line, each kept one line.

    Writing to the terminal directly would tear the live line; rich's own FileProxy prints through the
    console but wraps at its width, which cut a one-line ``warning:`` into several when stderr is a pipe.
    """

    def __init__(self, console: Console) -> None:
        self.console, self._pending = console, ""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        *lines, self._pending = (self._pending + text).split("\n")
        for line in lines:
            self.console.print(line, markup=False, highlight=False, emoji=False, soft_wrap=True)
        return len(text)
