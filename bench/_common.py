"""Helpers shared by the bench scripts.

Every bench script follows the same contract:

* ``--quick`` runs a reduced version that finishes in well under a minute;
* progress lines and a human-readable table go to stderr;
* the LAST line on stdout is exactly one JSON object, printed by `emit_result`.

This module is also picked up by ``make bench`` (which runs ``bench/*.py --quick``); run
as a script it only prints the machine description to stderr and exits.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from eventspool.config import SenderSettings, SpoolSettings

QUICK_REPEATS = 3
FULL_REPEATS = 5

_START = time.perf_counter()


# ---- arguments -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BenchArgs:
    """The options every bench script understands, plus the script's own in `namespace`."""

    quick: bool
    repeats: int
    scratch_parent: Path | None
    keep: bool
    namespace: argparse.Namespace

    def make_scratch(self, prefix: str) -> Path:
        """A new scratch directory under `--dir` (created if missing) or the system's."""
        if self.scratch_parent is not None:
            self.scratch_parent.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=prefix, dir=self.scratch_parent))


def parse_args(
    description: str,
    argv: Sequence[str] | None = None,
    extra: Callable[[argparse.ArgumentParser], None] | None = None,
) -> BenchArgs:
    """Parse the common options (`--quick`, `--repeats`, `--dir`, `--keep`) and any extras.

    `extra` may add script-specific options; their values are in `BenchArgs.namespace`.
    """
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"reduced run (under a minute): {QUICK_REPEATS} repetitions, shorter passes",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=None,
        help=(
            "repetitions per figure; each figure is the median over them "
            f"(default {QUICK_REPEATS} with --quick, else {FULL_REPEATS})"
        ),
    )
    parser.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="parent directory for scratch files (default: the system temporary directory)",
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep the scratch directory instead of deleting it"
    )
    if extra is not None:
        extra(parser)
    ns = parser.parse_args(argv)
    quick = bool(ns.quick)
    repeats_arg: int | None = ns.repeats
    repeats = repeats_arg if repeats_arg is not None else (QUICK_REPEATS if quick else FULL_REPEATS)
    if repeats < 1:
        parser.error("--repeats must be at least 1")
    scratch_parent: Path | None = ns.dir
    return BenchArgs(
        quick=quick,
        repeats=repeats,
        scratch_parent=scratch_parent,
        keep=bool(ns.keep),
        namespace=ns,
    )


# ---- the anchor producer -----------------------------------------------------------

# Sender pads message.max.bytes by this much above max_event_bytes (its private constant).
SENDER_ENVELOPE_OVERHEAD = 4096
# What eventspool.sender.sender.Sender gives its producer besides the SenderSettings.
SENDER_PRODUCER_CONFIG: dict[str, object] = {
    "enable.idempotence": True,
    "acks": "all",
    "message.timeout.ms": 0,
    "queue.buffering.max.messages": 2_000_000,
    "queue.buffering.max.kbytes": 2_097_151,
}


def sender_producer_config(bootstrap: str) -> dict[str, object]:
    """The settings the sender gives its own producer (see eventspool.sender.sender), with
    the SenderSettings defaults: what an anchor's bare `confluent_kafka.Producer` uses."""
    sender = SenderSettings()
    spool = SpoolSettings()
    return {
        "bootstrap.servers": bootstrap,
        **SENDER_PRODUCER_CONFIG,
        "message.max.bytes": max(1_000_000, spool.max_event_bytes + SENDER_ENVELOPE_OVERHEAD),
        "linger.ms": sender.linger_ms,
        "batch.size": sender.batch_size,
        "compression.type": sender.compression,
    }


# ---- statistics ------------------------------------------------------------------


def median(values: Iterable[float]) -> float:
    """The median of `values` (the mean of the two middle ones for an even count)."""
    data = list(values)
    if not data:
        raise ValueError("median of no values")
    return float(statistics.median(data))


def percentile(values: Sequence[float], q: float, *, presorted: bool = False) -> float:
    """The `q`-th percentile (0..100) of `values`, interpolating linearly between ranks.

    Matches numpy's default ("linear") method. Pass `presorted=True` to skip the sort
    when asking for several percentiles of one large sample.
    """
    if not values:
        raise ValueError("percentile of no values")
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile {q} is outside 0..100")
    data = values if presorted else sorted(values)
    rank = (len(data) - 1) * q / 100.0
    low = math.floor(rank)
    high = math.ceil(rank)
    if low == high:
        return float(data[low])
    return float(data[low] + (data[high] - data[low]) * (rank - low))


def latency_summary_us(samples_ns: Iterable[int]) -> dict[str, float]:
    """p50, p99, p99.9 and max of nanosecond samples, in microseconds, plus the count."""
    data = sorted(samples_ns)
    if not data:
        raise ValueError("latency summary of no samples")
    return {
        "p50_us": round(percentile(data, 50.0, presorted=True) / 1000.0, 3),
        "p99_us": round(percentile(data, 99.0, presorted=True) / 1000.0, 3),
        "p999_us": round(percentile(data, 99.9, presorted=True) / 1000.0, 3),
        "max_us": round(data[-1] / 1000.0, 3),
        "samples": len(data),
    }


def safe_ratio(numerator: float, denominator: float, digits: int = 4) -> float | None:
    """`numerator / denominator` rounded, or None when the denominator is not positive."""
    if denominator <= 0:
        return None
    return round(numerator / denominator, digits)


def figure(
    name: str,
    ours: float,
    anchor: float,
    *,
    unit: str,
    title: str,
    anchor_is: str,
    higher_is_better: bool = True,
) -> dict[str, object]:
    """One entry of a result's "figures" list; its ratio is above 1 when we are ahead.

    For a figure where lower is better (a latency, a cost) the ratio is anchor / ours.
    """
    return {
        "figure": name,
        "ours": ours,
        "anchor": anchor,
        "ratio": safe_ratio(ours, anchor) if higher_is_better else safe_ratio(anchor, ours),
        "unit": unit,
        "higher_is_better": higher_is_better,
        "title": title,
        "anchor_is": anchor_is,
    }


# ---- machine description ---------------------------------------------------------


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                name, _, value = line.partition(":")
                if name.strip() in ("model name", "Hardware", "cpu model"):
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def _memory_gib() -> float | None:
    try:
        with open("/proc/meminfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / (1024 * 1024), 1)
    except (OSError, ValueError, IndexError):
        pass
    return None


def filesystem_type(path: Path) -> str:
    """The type of the file system holding `path` (ext4, xfs, tmpfs...), or "unknown"."""
    try:
        target = path.resolve()
        best_mount = ""
        best_type = "unknown"
        with open("/proc/mounts", encoding="utf-8") as handle:
            for line in handle:
                fields = line.split()
                if len(fields) < 3:
                    continue
                mount = fields[1].replace("\\040", " ")
                if (target == Path(mount) or Path(mount) in target.parents) and len(mount) >= len(
                    best_mount
                ):
                    best_mount, best_type = mount, fields[2]
        return best_type
    except OSError:
        return "unknown"


def load_average_1m() -> float | None:
    """The 1-minute load average: how busy the machine was besides the benchmark."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def machine() -> dict[str, object]:
    """What the numbers were measured on: CPU model, cores, memory, OS and Python."""
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = os.cpu_count() or 0
    return {
        "cpu_model": _cpu_model(),
        "logical_cores": os.cpu_count(),
        "usable_cores": usable,
        "memory_gib": _memory_gib(),
        "os": f"{platform.system()} {platform.release()}",
        "arch": platform.machine(),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
    }


# ---- output ----------------------------------------------------------------------


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


def print_table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> None:
    print(format_table(headers, rows), file=sys.stderr, flush=True)


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
