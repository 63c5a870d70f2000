"""What a bench script prints: progress and a table of its figures on stderr, one JSON
line on stdout; and how numbers are written, there and on the report's page.
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
    return format_number(value) if isinstance(value, int | float) else str(value)


def format_number(value: float) -> str:
    """Thousands separators for large numbers, three significant digits for small ones."""
    if isinstance(value, bool):
        return str(value)
    if value == 0:
        return "0"
    if abs(value) >= 1000 or float(value).is_integer():
        return f"{value:,.0f}"
    return f"{value:.3g}"


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
    """The keys a result ends with: versions, file system, the 1-minute load average at the
    start and end (now, unless given) of the measurements, machine, run time."""
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
        "elapsed_s": round(time.perf_counter() - _START, 1),
    }


def emit_result(result: Mapping[str, object]) -> None:
    """Print the result as one JSON line on stdout, last and once (see `harness.figures`)."""
    keys = list(result)
    if keys[:4] != ["figure", "ours", "anchor", "ratio"]:
        raise ValueError(f"result must start with figure, ours, anchor, ratio; got {keys[:4]}")
    sys.stderr.flush()
    print(json.dumps(result, separators=(",", ":"), allow_nan=False), flush=True)
