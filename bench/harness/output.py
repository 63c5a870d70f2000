"""What a bench script prints: progress and a table on stderr, one JSON line on stdout.

The table is drawn from the result's figures (see `harness.figures`), so a figure is
written once and read the same way by a person and by bench/report.py.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from importlib import metadata
from typing import TYPE_CHECKING, Any

from harness.machine import load_average_1m, machine

if TYPE_CHECKING:
    from harness.cli import BenchArgs

_START = time.perf_counter()


def progress(message: str) -> None:
    """One progress line on stderr, stamped with the seconds since the script started."""
    print(f"[{time.perf_counter() - _START:7.1f}s] {message}", file=sys.stderr, flush=True)


def elapsed_s() -> float:
    """Seconds since this module was imported (about when the script started)."""
    return time.perf_counter() - _START


def format_table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """A plain text table: first column left-aligned, the others right-aligned."""
    cells = [[str(h) for h in headers], *[[_cell(v) for v in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]

    def line(row: Sequence[str]) -> str:
        parts = [
            row[i].ljust(widths[i]) if i == 0 else row[i].rjust(widths[i]) for i in range(len(row))
        ]
        return "  ".join(parts).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(cells[0]), rule, *(line(row) for row in cells[1:])])


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if value >= 1000:
            return f"{value:,.0f}"
        return f"{value:.3g}" if value < 10 else f"{value:.1f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def print_figures(result: Mapping[str, Any]) -> None:
    """The headline and every listed figure of `result`: ours, the anchor's, the ratio."""
    entries = [result, *result.get("figures", [])]
    rows = [[e["figure"], e["ours"], e["anchor"], e["ratio"], e.get("unit", "")] for e in entries]
    table = format_table(["figure", "eventspool", "anchor", "ratio", "unit"], rows)
    print(f"\n{table}", file=sys.stderr, flush=True)


def provenance(
    args: BenchArgs,
    *,
    load_start: float | None,
    load_end: float | None = None,
    filesystem: str | None = None,
    versions: Mapping[str, object] | None = None,
) -> dict[str, object]:
    """The keys a result ends with: versions, the file system, the load, the machine and
    how long the run took; the 1-minute load average at the start of the measurements and
    at their end (now, unless given)."""
    return {
        "versions": {"eventspool": metadata.version("eventspool"), **(versions or {})},
        **({} if filesystem is None else {"filesystem": filesystem}),
        "load_average_1m": {
            "start": load_start,
            "end": load_average_1m() if load_end is None else load_end,
        },
        "repetitions": args.repeats,
        "quick": args.quick,
        "machine": machine(),
        "elapsed_s": round(elapsed_s(), 1),
    }


def emit_result(result: Mapping[str, object]) -> None:
    """Print the result as one JSON line on stdout; call it last, exactly once.

    `result` must start with "figure", "ours", "anchor" and "ratio" (ratio = ours /
    anchor, above 1 when we are ahead).
    """
    keys = list(result)
    if keys[:4] != ["figure", "ours", "anchor", "ratio"]:
        raise ValueError(f"result must start with figure, ours, anchor, ratio; got {keys[:4]}")
    sys.stderr.flush()
    print(json.dumps(result, separators=(",", ":"), allow_nan=False), flush=True)
