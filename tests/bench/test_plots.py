"""Every plot the report writes fits its figure: no title, label or number cut off at an edge.

Drawn from the published docs/benchmarks.json, whose labels are the real, long ones, and
measured after `draw_without_rendering()`, with the renderer the figure saves its PNG with.
"""

from __future__ import annotations

import struct
from pathlib import Path

from matplotlib.axis import Axis
from matplotlib.figure import Figure
from matplotlib.text import Text
from matplotlib.transforms import BboxBase

import report

# Extents are fractional pixels; a glyph touching the edge is not cut off.
SLACK_PX = 0.5


def png_size(path: Path) -> tuple[int, int]:
    """Width and height from the PNG's header (its IHDR chunk)."""
    width, height = struct.unpack(">II", path.read_bytes()[16:24])
    return width, height


def overflow(name: str, box: BboxBase, frame: BboxBase) -> list[str]:
    inside = (
        box.x0 >= frame.x0 - SLACK_PX
        and box.y0 >= frame.y0 - SLACK_PX
        and box.x1 <= frame.x1 + SLACK_PX
        and box.y1 <= frame.y1 + SLACK_PX
    )
    if inside:
        return []
    return [
        f"{name} spans x {box.x0:.0f}..{box.x1:.0f}, y {box.y0:.0f}..{box.y1:.0f} "
        f"of x {frame.x0:.0f}..{frame.x1:.0f}, y {frame.y0:.0f}..{frame.y1:.0f}"
    ]


def clipped(plot: Figure) -> list[str]:
    """What of a drawn figure lies outside it: texts, axes, each axis with its tick labels.

    Tick labels are measured through their axis, since matplotlib keeps labels for ticks
    outside the view that it never draws.
    """
    frame = plot.bbox
    shown = [axes for axes in plot.axes if axes.get_visible()]
    boxes: list[tuple[str, BboxBase | None]] = [
        (f"axes {axes.get_title()!r}", axes.get_window_extent()) for axes in shown
    ]
    boxes += [
        (f"{axis.axis_name}-axis of {axes.get_title()!r}", axis.get_tightbbox())
        for axes in shown
        for axis in (axes.xaxis, axes.yaxis)
    ]
    tick_labels = {
        id(label)
        for axes in plot.axes
        for axis in (axes.xaxis, axes.yaxis)
        for label in _tick_labels(axis)
    }
    texts = [
        text
        for text in plot.findobj(Text)
        if isinstance(text, Text)
        and id(text) not in tick_labels
        and text.get_visible()
        and text.get_text()
        and (text.axes is None or text.axes.get_visible())
    ]
    found = [line for name, box in boxes if box is not None for line in overflow(name, box, frame)]
    found += [
        line
        for text in texts
        for line in overflow(f"text {text.get_text()!r}", text.get_window_extent(), frame)
    ]
    whole = plot.get_tightbbox().transformed(plot.dpi_scale_trans)
    return found + overflow("everything drawn", whole, frame)


def _tick_labels(axis: Axis) -> list[Text]:
    ticks = [*axis.get_major_ticks(), *axis.get_minor_ticks()]
    return [label for tick in ticks for label in (tick.label1, tick.label2)]


def test_every_plot_the_report_writes_lies_inside_its_figure(tmp_path: Path) -> None:
    plots = report.write_plots(report.load_store(), tmp_path)
    assert sorted(plots) == sorted(tmp_path.glob("*.png"))
    assert len(plots) >= 3  # the per-bench plots, the soak timeline and the ratio overview
    problems: list[str] = []
    for path, plot in sorted(plots.items()):
        plot.draw_without_rendering()
        # The figure measured is the PNG written: same size in pixels, nothing cropped.
        # Agg sizes its canvas by truncating the figure's size in pixels, not rounding.
        measured = (int(plot.bbox.width), int(plot.bbox.height))
        if png_size(path) != measured:
            problems.append(f"{path.name}: saved {png_size(path)} px, measured {measured}")
        problems += [f"{path.name}: {line}" for line in clipped(plot)]
    assert not problems, "\n".join(problems)
