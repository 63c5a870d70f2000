"""The report's PNG plots, drawn on matplotlib figures of their own (no pyplot state).

Constrained layout keeps every text inside the figure; long labels are wrapped first,
since no layout fits a line wider than the figure. Each function returns the figure it
saved, so that a test can measure what was drawn.
"""

from __future__ import annotations

import math
import textwrap
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from matplotlib import ticker
from matplotlib.figure import Figure as Plot

from harness.figures import Figure
from harness.output import format_number

OURS_COLOUR = "#1f77b4"
ANCHOR_COLOUR = "#a0a0a0"
AHEAD_COLOUR = "#2ca02c"
BEHIND_COLOUR = "#d62728"
FAULT_COLOURS = ("#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22")
_DPI = 110
# No timestamp or version in the files, so that regenerating unchanged data changes nothing.
_PNG_METADATA = {"Software": None}


def ratio_overview(figures: Sequence[Figure], path: Path) -> Plot:
    """One horizontal bar per figure: its ratio on a log scale, with 1 (even) marked."""
    shown = [figure for figure in figures if figure.ratio is not None and figure.ratio > 0]
    # Whole half inches: 55 pixels each, exact in binary, so the PNG's height in pixels is
    # the figure's (0.38 inch a bar could make 2430.9999 of 2431 pixels).
    height = max(2.5, math.ceil((0.38 * len(shown) + 1.2) * 2) / 2)
    plot = _plot((9, height))
    axes = plot.subplots()
    repeated = Counter((figure.script, figure.title) for figure in shown)
    labels = [
        _wrap(
            f"{figure.script}: {figure.title}"
            + (f" (vs {figure.anchor_is})" if repeated[(figure.script, figure.title)] > 1 else ""),
            60,
        )
        for figure in shown
    ]
    ratios = [float(figure.ratio or 0.0) for figure in shown]
    colours = [AHEAD_COLOUR if ratio >= 1.0 else BEHIND_COLOUR for ratio in ratios]
    positions = range(len(shown))
    axes.barh(positions, ratios, color=colours)
    axes.set_yticks(list(positions), labels, fontsize=8)
    axes.invert_yaxis()
    axes.set_xscale("log")
    axes.margins(x=0.12)  # room for the number beyond the longest bar
    axes.axvline(1.0, color="black", linewidth=1)
    for position, ratio in zip(positions, ratios, strict=True):
        axes.annotate(
            format_number(ratio),
            (ratio, position),
            xytext=(3, 0),
            textcoords="offset points",
            va="center",
            fontsize=8,
        )
    axes.set_xlabel("ratio: above 1 eventspool is ahead of its anchor (log scale)")
    axes.set_title("Every figure against its anchor, same run, same machine", fontsize=10)
    return _save(plot, path)


def ours_against_anchor(figures: Sequence[Figure], title: str, path: Path) -> Plot:
    """Small multiples: for each figure, our bar beside the anchor's, in the figure's unit."""
    columns = min(3, len(figures))
    rows = math.ceil(len(figures) / columns)
    plot = _plot((3.6 * columns, 3.3 * rows))
    grid = plot.subplots(rows, columns, squeeze=False)
    for index, axes in enumerate(grid.flat):
        if index >= len(figures):
            axes.set_visible(False)
            continue
        figure = figures[index]
        values = [figure.ours, figure.anchor]
        names = ["eventspool", _wrap(figure.anchor_is or "anchor", 24)]
        bars = axes.bar(names, values, color=[OURS_COLOUR, ANCHOR_COLOUR])
        axes.yaxis.set_major_formatter(ticker.FuncFormatter(lambda value, _: format_number(value)))
        axes.bar_label(bars, labels=[format_number(value) for value in values], fontsize=8)
        axes.set_title(_wrap(figure.title, 34), fontsize=9)
        better = "higher" if figure.higher_is_better else "lower"
        axes.set_ylabel(_wrap(f"{figure.unit} ({better} is better)", 40), fontsize=8)
        axes.tick_params(labelsize=7)
        axes.margins(y=0.15)
    plot.suptitle(title, fontsize=11)
    return _save(plot, path)


def soak_timeline(result: Mapping[str, Any], path: Path) -> Plot:
    """Acknowledged events over the soak's time, with each injected fault as a band."""
    timeline = result.get("timeline", [])
    faults = result.get("faults", [])
    plot = _plot((10, 4))
    axes = plot.subplots()
    times = [float(point["t"]) for point in timeline]
    for series, label, colour in (
        ("acked", "acknowledged to the producers", OURS_COLOUR),
        ("handled", "handled by the consumer", AHEAD_COLOUR),
    ):
        if timeline and series in timeline[0]:
            axes.plot(times, [point[series] for point in timeline], label=label, color=colour)
    kinds = sorted({str(fault["kind"]) for fault in faults})
    colour_of = {kind: FAULT_COLOURS[i % len(FAULT_COLOURS)] for i, kind in enumerate(kinds)}
    labelled: set[str] = set()
    for fault in faults:
        kind = str(fault["kind"])
        start = float(fault["t"])
        width = max(float(fault.get("duration_s", 0.0)), 0.5)
        axes.axvspan(
            start,
            start + width,
            color=colour_of[kind],
            alpha=0.35,
            label=None if kind in labelled else kind.replace("_", " "),
        )
        labelled.add(kind)
    axes.set_xlabel("seconds since the soak started")
    axes.set_ylabel("events")
    axes.set_title("Soak: the workload under a fault schedule")
    axes.legend(fontsize=8, loc="upper left")
    return _save(plot, path)


def _plot(size: tuple[float, float]) -> Plot:
    """At the PNG's own resolution, so what is measured on it is what is saved."""
    return Plot(figsize=size, dpi=_DPI, layout="constrained")


def _save(plot: Plot, path: Path) -> Plot:
    path.parent.mkdir(parents=True, exist_ok=True)
    plot.savefig(path, dpi=_DPI, metadata=_PNG_METADATA)
    return plot


def _wrap(text: str, width: int) -> str:
    return textwrap.fill(text, width, break_long_words=False, break_on_hyphens=False)
