"""The one-page HTML report: a summary table, the comparison plots and the latest sample grid of each run.

The page is a single file with its images inlined as base64 PNGs, so it can be mailed, attached to an
issue or copied off a cluster without the run directories it came from.
"""

from __future__ import annotations

import base64
import datetime
import html
import os
from pathlib import Path

from spotlight.report.plots import NOT_LOGGED, Panel, all_panels, run_colour
from spotlight.report.run_data import Run, load_runs

STYLE = """
body { font-family: system-ui, sans-serif; margin: 24px; color: #222; max-width: 1400px; }
table { border-collapse: collapse; margin: 12px 0; }
th, td { border: 1px solid #ccc; padding: 4px 10px; text-align: right; }
th:first-child, td:first-child, td.mode { text-align: left; }
.swatch { display: inline-block; width: 10px; height: 10px; margin-right: 6px; }
.panels { display: flex; flex-wrap: wrap; gap: 16px; }
.panel { border: 1px solid #ddd; border-radius: 6px; padding: 8px 12px; flex: 1 1 640px; }
.panel h2 { font-size: 15px; margin: 4px 0 8px; }
.panel img { max-width: 100%; }
.not-logged { color: #888; font-style: italic; }
.note { color: #666; font-size: 12px; }
.grids { display: flex; flex-wrap: wrap; gap: 16px; }
.grids figure { margin: 0; }
.grids img { max-width: 100%; image-rendering: pixelated; }
"""


def _image(png: bytes, alt: str, mime: str = "image/png") -> str:
    return f'<img alt="{html.escape(alt)}" src="data:{mime};base64,{base64.b64encode(png).decode()}">'


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.2f} h"


def _summary_rows(runs: list[Run]) -> str:
    """One table row per run: the score that picks the best model, final and best (with their iterations), time,
    cost, and spot utilisation over the time the spot devices were held with the held fraction beside it."""
    rows = []
    for index, run in enumerate(runs):
        iterations, accuracies, score = run.validation_scores()
        spot_util = run.total("util/spot", "util/spot_to_date")
        spot_held = run.total("util/spot_held_fraction", "util/spot_held_fraction_to_date")
        if accuracies:
            best = max(range(len(accuracies)), key=lambda i: accuracies[i])
            final = f"{accuracies[-1]:.3f} (iter {iterations[-1]:.0f})"
            best_text = f"{accuracies[best]:.3f} (iter {iterations[best]:.0f})"
        else:
            final = best_text = NOT_LOGGED
        wall_s, cost = run.last("time/wall_s"), run.last("cost/usd")
        cells = [
            f'<td><span class="swatch" style="background:{run_colour(index)}"></span>{html.escape(run.name)}</td>',
            f'<td class="mode">{html.escape(run.mode)}</td>',
            f"<td>{run.iterations}</td>",
            f'<td class="score">{html.escape(score)}</td>',
            f'<td class="final-accuracy">{final}</td>',
            f'<td class="best-accuracy">{best_text}</td>',
            f"<td>{NOT_LOGGED if wall_s is None else _duration(wall_s)}</td>",
            f"<td>{NOT_LOGGED if cost is None else f'${cost:,.2f}'}</td>",
            f'<td class="spot-util">{NOT_LOGGED if spot_util is None else f"{spot_util:.2f}"}</td>',
            f'<td class="spot-held">{NOT_LOGGED if spot_held is None else f"{spot_held:.2f}"}</td>',
        ]
        rows.append(f'<tr class="run" data-run="{html.escape(run.name)}">{"".join(cells)}</tr>')
    return "\n".join(rows)


def _panel_html(panel: Panel) -> str:
    if panel.png is None:  # the note says what is not logged; it is the panel's whole content
        body, note = f'<p class="not-logged">{html.escape(panel.note)}</p>', ""
    else:
        body = _image(panel.png, panel.title)
        note = f'<p class="note">{html.escape(panel.note)}</p>' if panel.note else ""
    return f'<section class="panel" id="panel-{panel.key}"><h2>{html.escape(panel.title)}</h2>{body}{note}</section>'


def _grid_html(run: Run) -> str:
    """The run's latest sample grid, captioned with its file name (which carries the iteration)."""
    if run.latest_grid is None:
        content = '<p class="not-logged">no sample grid (samples/iter-*.png)</p>'
    elif (played := run.latest_grid.with_suffix(".gif")).is_file():  # a video run's grid, played (report/grid.py)
        content = _image(played.read_bytes(), f"{run.name} {played.name}", "image/gif")
    else:
        content = _image(run.latest_grid.read_bytes(), f"{run.name} {run.latest_grid.name}")
    caption = html.escape(run.name) + (f" — {run.latest_grid.name}" if run.latest_grid else "")
    name = html.escape(run.name)
    return f'<figure class="grid" data-run="{name}">{content}<figcaption>{caption}</figcaption></figure>'


def render_report(runs: list[Run]) -> str:
    """The report page as one HTML string."""
    sources = "".join(f"<li>{html.escape(run.name)}: <code>{html.escape(str(run.path))}</code>"
                      + (f" ({run.skipped_lines} unreadable lines skipped)" if run.skipped_lines else "") + "</li>"
                      for run in runs)
    header = "".join(f"<th>{name}</th>" for name in
                     ("run", "mode", "iterations", "val score (picks the best)", "final", "best", "wall time",
                      "cost", "spot util (busy / held)", "spot held / run"))
    generated = datetime.datetime.now().isoformat(timespec="seconds")
    title = html.escape(", ".join(run.name for run in runs))
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>Spotlight report: {title}</title>
<style>{STYLE}</style></head>
<body>
<h1>Spotlight report</h1>
<p class="note">generated {generated}</p>
<ul>{sources}</ul>
<h2>Summary</h2>
<table id="summary"><thead><tr>{header}</tr></thead><tbody>
{_summary_rows(runs)}
</tbody></table>
<div class="panels">
{chr(10).join(_panel_html(panel) for panel in all_panels(runs))}
</div>
<h2>Latest sample grids</h2>
<div class="grids">
{chr(10).join(_grid_html(run) for run in runs)}
</div>
</body></html>
"""


def write_report(run_dirs: list[Path], out_path: Path) -> Path:
    """Read the run directories and write the report to ``out_path``; returns ``out_path``.

    Raises ReportError (naming the path and the fix) for a run directory without metrics. The page is
    written to a temporary file and renamed, so a reader — or a report written at the end of every
    training run — never sees half a page.
    """
    page = render_report(load_runs(run_dirs))
    out_path.parent.mkdir(parents=True, exist_ok=True)
    partial = out_path.with_name(out_path.name + ".partial")
    partial.write_text(page, encoding="utf-8")
    os.replace(partial, out_path)
    return out_path
