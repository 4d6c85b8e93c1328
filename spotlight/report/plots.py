"""The report's plots: one PNG per panel, each comparing every run, and "not logged" where a run lacks a metric.

Runs of different modes log different metrics (a vanilla run has no planner, older runs no cost), so
every plot draws what each run has and names the runs it could not draw, instead of failing. Figures
are built with ``matplotlib.figure.Figure`` rather than pyplot, so no global figure state or GUI
backend is involved and the report can be written from any thread (e.g. at the end of training).
"""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass

from matplotlib.axes import Axes
from matplotlib.colors import to_hex
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from spotlight.report.run_data import Run

NOT_LOGGED = "not logged"
PREEMPTION_STYLE = {  # event kind -> (colour, line style, legend label)
    "preemption_notice": ("tab:orange", "--", "preemption notice"),
    "node_removed": ("tab:red", "-", "node removed"),
    "node_added": ("tab:green", ":", "node added"),
}
PHASE_COLOURS = {"train": "tab:blue", "explore": "tab:purple", "rollout": "tab:cyan", "eval": "tab:gray",
                 "broadcast": "tab:olive"}


@dataclass
class Panel:
    """One plot of the page: ``png`` is None when no run logs what the plot needs; ``note`` says what is missing."""

    key: str
    title: str
    png: bytes | None
    note: str = ""


def run_colour(index: int) -> str:
    """The colour (hex) of the run at ``index`` in every panel and in the table, so a run is one colour on the page."""
    return to_hex(f"C{index % 10}")


def _png(figure: Figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    return buffer.getvalue()


def _missing_note(runs: list[Run], drawn: set[str], what: str) -> str:
    missing = [run.name for run in runs if run.name not in drawn]
    return f"{NOT_LOGGED} for {', '.join(missing)} (no {what})" if missing else ""


def _time_unit(seconds: float) -> tuple[float, str]:
    """A divisor and unit that keep wall-time axes readable from a 2-minute local run to a multi-day cluster run."""
    if seconds < 120:
        return 1.0, "s"
    if seconds < 2 * 3600:
        return 60.0, "min"
    return 3600.0, "h"


def _overlay(ax: Axes, runs: list[Run], series: Callable[[Run], tuple[list[float], list[float]]],
             step: bool = False, x_scale: float = 1.0) -> set[str]:
    """Draw every run's series on ``ax``; returns the names of the runs that had points to draw."""
    drawn: set[str] = set()
    for index, run in enumerate(runs):
        xs, ys = series(run)
        if not xs:
            continue
        xs = [x / x_scale for x in xs]
        if step:
            ax.step(xs, ys, where="post", color=run_colour(index), label=run.name)
        else:
            ax.plot(xs, ys, marker="o", markersize=3, color=run_colour(index), label=run.name)
        drawn.add(run.name)
    if drawn:
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))  # outside: never hides a curve
        ax.grid(alpha=0.3)
    else:
        _not_logged(ax)
    return drawn


def _not_logged(ax: Axes) -> None:
    ax.text(0.5, 0.5, NOT_LOGGED, ha="center", va="center", transform=ax.transAxes, color="gray")
    ax.set_xticks([])
    ax.set_yticks([])


def _line_panel(key: str, title: str, runs: list[Run], metrics: list[tuple[str, str]], step: bool = False,
                integer_y: bool = False) -> Panel:
    """A panel of one axes per (metric, y label) against iteration, runs overlaid; "not logged" where nothing is."""
    if not any(run.has(metric) for run in runs for metric, _ in metrics):
        names = ", ".join(metric for metric, _ in metrics)
        return Panel(key, title, None, f"{NOT_LOGGED}: no run logs {names}")
    figure = Figure(figsize=(7.5, 2.6 * len(metrics)), layout="constrained")
    axes = figure.subplots(len(metrics), 1, squeeze=False)[:, 0]
    notes = []
    for ax, (metric, y_label) in zip(axes, metrics, strict=True):
        drawn = _overlay(ax, runs, lambda run, metric=metric: run.series(metric), step=step)
        ax.set_ylabel(y_label)
        if drawn:
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if drawn and integer_y:
            ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        notes.append(_missing_note(runs, drawn, metric))
    axes[-1].set_xlabel("iteration")
    return Panel(key, title, _png(figure), "; ".join(note for note in notes if note))


def _score_label(runs: list[Run]) -> str:
    """What the runs' validation score is (the one that picks the best model): one name, or both."""
    names = sorted({run.validation_scores()[2] for run in runs})
    return "val " + " / ".join(names)


def accuracy_vs_wall_time(runs: list[Run]) -> Panel:
    label = _score_label(runs)
    title = f"Validation score ({label[4:]}) vs wall time"
    if not any(run.series(run.score_key, "time/wall_s")[0] for run in runs):
        return Panel("accuracy-wall", title, None, f"{NOT_LOGGED}: no run logs val/strict_accuracy with time/wall_s")
    scale, unit = _time_unit(max(run.last("time/wall_s") or 0.0 for run in runs))
    figure = Figure(figsize=(7.5, 3.6), layout="constrained")
    ax = figure.subplots()
    drawn = _overlay(ax, runs, lambda run: run.series(run.score_key, "time/wall_s"), x_scale=scale)
    ax.set_xlabel(f"wall time ({unit})")
    ax.set_ylabel(label)
    return Panel("accuracy-wall", title, _png(figure), _missing_note(runs, drawn, "val/strict_accuracy"))


def accuracy_vs_cost(runs: list[Run]) -> Panel:
    label = _score_label(runs)
    title = f"Validation score ({label[4:]}) vs cost"
    if not any(run.accuracy_vs_cost()[0] for run in runs):
        return Panel("accuracy-cost", title, None, f"{NOT_LOGGED}: no run logs cost/usd")
    figure = Figure(figsize=(7.5, 3.6), layout="constrained")
    ax = figure.subplots()
    drawn = _overlay(ax, runs, Run.accuracy_vs_cost)
    ax.set_xlabel("cumulative cost (USD)")
    ax.set_ylabel(label)
    return Panel("accuracy-cost", title, _png(figure), _missing_note(runs, drawn, "cost/usd"))


def reward_variance(runs: list[Run]) -> Panel:
    """Variance and std are drawn apart: the mean of group stds squared is not the mean group variance."""
    return _line_panel("reward-variance", "Group reward variance per iteration", runs,
                       [("rollout/group_reward_var", "mean group reward var"),
                        ("rollout/group_reward_std", "mean group reward std")])


def reward_terms(runs: list[Run]) -> Panel:
    """Each term of a composite reward (reward.weights) on its own axes: which term the policy moves."""
    title = "Reward terms per iteration (reward.weights)"
    terms = sorted({key for run in runs for row in run.rows for key in row if key.startswith("rollout/reward/")})
    if not terms:
        return Panel("reward-terms", title, None, f"{NOT_LOGGED}: no run has a composite reward (reward.weights)")
    return _line_panel("reward-terms", title, runs, [(term, term.removeprefix("rollout/reward/")) for term in terms])


def planner_decisions(runs: list[Run]) -> Panel:
    return _line_panel("planner", "Planner decisions per iteration", runs,
                       [("planner/num_candidates", "N candidates"), ("planner/num_steps", "S steps")], step=True,
                       integer_y=True)


def kendall_tau(runs: list[Run]) -> Panel:
    panel = _line_panel("kendall-tau", "Staleness: Kendall τ of seed rankings (θ_i vs θ_i-1) per iteration", runs,
                        [("staleness/kendall_tau", "Kendall τ")])
    floors = sorted({floor for run in runs if run.has("staleness/kendall_tau")
                     for floor in [_staleness_floor(run)] if floor is not None})
    if floors and panel.png is not None:
        panel.note = "; ".join(filter(None, [panel.note, "staleness floor: " + ", ".join(f"{f:g}" for f in floors)]))
    return panel


def _staleness_floor(run: Run) -> float | None:
    explore = run.config.get("explore")
    floor = explore.get("staleness_floor") if isinstance(explore, dict) else None
    return float(floor) if isinstance(floor, (int, float)) else None


def _busy_intervals(run: Run) -> dict[str, list[tuple[float, float, str]]]:
    """Device label -> [(start, end, phase)] from the run's "busy" events; malformed rows are left out."""
    devices: dict[str, list[tuple[float, float, str]]] = {}
    for event in run.events:
        start, end = event.get("start"), event.get("end")
        if event.get("kind") != "busy" or not isinstance(start, (int, float)) or not isinstance(end, (int, float)):
            continue
        label = str(event.get("device") or event.get("node") or "?")
        devices.setdefault(label, []).append((float(start), float(end), str(event.get("phase", "busy"))))
    return devices


def _draw_timeline(ax: Axes, run: Run) -> bool:
    """Busy bars per device, spot utilisation per iteration and preemption markers; False if none is logged."""
    devices = _busy_intervals(run)
    phase_colours = dict(PHASE_COLOURS)
    for row, device in enumerate(sorted(devices)):
        by_phase: dict[str, list[tuple[float, float]]] = {}
        for start, end, phase in devices[device]:
            by_phase.setdefault(phase, []).append((start, end - start))
        for phase, spans in by_phase.items():  # one collection per phase: a run has thousands of busy intervals
            colour = phase_colours.setdefault(phase, f"C{(len(phase_colours) + 3) % 10}")
            ax.broken_barh(spans, (row - 0.35, 0.7), color=colour, label=phase)
    ax.set_yticks(range(len(devices)), sorted(devices), fontsize=7)
    util_axes = ax.twinx() if devices else ax
    utilisation = [(metric, label) for metric, label in (("util/spot", "spot util"),
                                                         ("util/spot_train_phase", "spot util, train phases"))
                   if run.has(metric)]
    for metric, label in utilisation:
        xs, ys = run.series(metric, "time/wall_s")
        util_axes.step(xs, ys, where="post", label=label, linewidth=1.2,
                       linestyle="-" if metric == "util/spot" else "-.", color="black")
    if utilisation:
        util_axes.set_ylim(0, 1.05)
        util_axes.set_ylabel("utilisation", fontsize=8)
    markers = 0
    for event in run.events:
        style = PREEMPTION_STYLE.get(event.get("kind", ""))
        if style is not None and isinstance(event.get("t"), (int, float)):
            colour, line_style, label = style
            ax.axvline(float(event["t"]), color=colour, linestyle=line_style, linewidth=1, label=label)
            markers += 1
    if not devices and not utilisation and not markers:
        _not_logged(ax)
        return False
    handles, labels = [], []
    for axis in [ax] if util_axes is ax else [ax, util_axes]:
        for handle, label in zip(*axis.get_legend_handles_labels(), strict=True):
            if label not in labels:  # one legend entry per phase / event kind, not per bar
                handles.append(handle)
                labels.append(label)
    # below the axes: bars span the whole height, so any legend inside would hide some of them
    ax.legend(handles, labels, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.28), ncol=6, frameon=False)
    ax.set_xlabel("seconds since start")
    return True


def utilisation_timeline(runs: list[Run]) -> Panel:
    """One timeline per run, stacked: timelines of different runs cannot share one axes the way curves can."""
    title = "Spot utilisation timeline (device busy intervals, preemptions marked)"
    loggable = [run for run in runs if run.events or run.has("util/spot") or run.has("util/spot_train_phase")]
    if not loggable:
        return Panel("utilisation", title, None,
                     f"{NOT_LOGGED}: no run has events.jsonl or util/spot, util/spot_train_phase metrics")
    heights = [2.4 if run in loggable else 0.8 for run in runs]  # a "not logged" strip needs no room
    figure = Figure(figsize=(9, sum(heights) + 0.4), layout="constrained")
    axes = figure.subplots(len(runs), 1, squeeze=False, height_ratios=heights)[:, 0]
    drawn = set()
    for ax, run in zip(axes, runs, strict=True):
        subtitle = run.name
        spot, train_phase = run.last("util/spot"), run.last("util/spot_train_phase")
        if spot is not None or train_phase is not None:
            parts = [f"{label} {value:.0%}" for label, value in (("spot busy", spot), ("in training", train_phase))
                     if value is not None]
            subtitle += f" (last iteration: {', '.join(parts)})"
        ax.set_title(subtitle, fontsize=9, loc="left")
        if _draw_timeline(ax, run):
            drawn.add(run.name)
    return Panel("utilisation", title, _png(figure), _missing_note(runs, drawn, "events.jsonl or util/spot"))


# What a held spot device did (spotlight/runtime/spot/usage.py SPOT_ACTIVITIES, IDLE_WHILE), as the report names it.
SPOT_ACTIVITY_LABELS = {"rollout": "rollout share", "explore": "exploring", "eval": "validation share",
                        "weights": "loading weights", "starting": "starting", "idle": "waiting for work"}
SPOT_ACTIVITY_COLOURS = {"rollout": "tab:cyan", "explore": "tab:purple", "eval": "tab:gray", "weights": "tab:olive",
                         "starting": "tab:orange", "idle": "whitesmoke"}
IDLE_WHILE_LABELS = {"validation": "validation, checkpoints", "seeds": "handing out weights, seeds",
                     "rollout": "rollout, scoring", "train": "training", "close": "closing the round"}
IDLE_WHILE_COLOURS = ("tab:blue", "tab:green", "tab:red", "tab:brown", "tab:pink")


def _weighted(run: Run, key: str) -> float | None:
    """The run's share of spot held time in ``key`` from its iterations, each weighed by its held device-seconds."""
    pairs = [(row.get(key), row.get("util/spot_window_held_s")) for row in run.rows]
    pairs = [(float(v), float(w)) for v, w in pairs if isinstance(v, (int, float)) and isinstance(w, (int, float))
             and w > 0 and v == v]
    held = sum(w for _, w in pairs)
    return sum(v * w for v, w in pairs) / held if held > 0 else None


def _total(run: Run, key: str) -> float | None:
    """The run's total from summary.json; a run without one (still going) from its iterations."""
    value = run.totals.get(key)
    return float(value) if isinstance(value, (int, float)) and value == value else _weighted(run, key)


def spot_time(runs: list[Run]) -> Panel:
    """Per run, the spot devices' held time by activity (summary.json, else the iterations), and its waiting for
    work split by what the trainer was doing meanwhile (the iterations, weighed by held time)."""
    title = "Spot held time by activity, and waiting for work by what the trainer did"
    shares = {run.name: {activity: _total(run, f"util/spot_{activity}") for activity in SPOT_ACTIVITY_LABELS}
              for run in runs}
    drawn = [run for run in runs if any(v is not None for v in shares[run.name].values())]
    if not drawn:
        return Panel("spot-time", title, None, f"{NOT_LOGGED}: no run logs util/spot_<activity> (Ray runs do)")
    figure = Figure(figsize=(9, 0.9 + 0.9 * len(drawn)), layout="constrained")
    ax = figure.subplots()
    labels, seen = [], set()
    for row, run in enumerate(drawn):
        bars = [(f"{SPOT_ACTIVITY_LABELS[a]}", shares[run.name][a] or 0.0, SPOT_ACTIVITY_COLOURS[a])
                for a in SPOT_ACTIVITY_LABELS]
        idle = [(f"waiting: {label}", _weighted(run, f"util/spot_idle_{phase}") or 0.0, colour)
                for (phase, label), colour in zip(IDLE_WHILE_LABELS.items(), IDLE_WHILE_COLOURS, strict=True)]
        for y, segments in ((2 * row, bars), (2 * row + 1, idle)):
            left = 0.0
            for label, width, colour in segments:
                ax.barh(y, width, left=left, color=colour, edgecolor="black", linewidth=0.4,
                        label=None if label in seen else label)
                seen.add(label)
                if width >= 0.06:
                    ax.text(left + width / 2, y, f"{width:.2f}", ha="center", va="center", fontsize=7)
                left += width
        labels += [f"{run.name}: held time", f"{run.name}: waiting, by trainer phase"]
    ax.set_yticks(range(len(labels)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlim(0, 1)
    ax.set_xlabel("share of spot held device-seconds")
    figure.legend(fontsize=7, loc="outside lower center", ncol=4, frameon=False)
    return Panel("spot-time", title, _png(figure), _missing_note(runs, {run.name for run in drawn},
                                                                 "util/spot_<activity>"))


def all_panels(runs: list[Run]) -> list[Panel]:
    """Every plot of the report, in page order."""
    return [accuracy_vs_wall_time(runs), accuracy_vs_cost(runs), reward_variance(runs), reward_terms(runs),
            utilisation_timeline(runs), spot_time(runs),
            planner_decisions(runs), kendall_tau(runs)]
