"""The `eventspool` command line."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import click

from eventspool.broker.cli import broker
from eventspool.spool.inspect import QueueReport, SpoolReport, inspect_spool


@click.group()
@click.version_option(package_name="eventspool")
def main() -> None:
    """eventspool: a durable local spool in front of Kafka."""


@main.group()
def spool() -> None:
    """Work with a spool directory."""


@spool.command()
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document instead of a table.")
def inspect(directory: Path, as_json: bool) -> None:
    """Show every queue of DIRECTORY: depth, bytes, oldest age, positions, damage found.

    Read-only: it scans each queue as a recovery would and changes nothing, so it is
    safe on the directory of a dead producer and, as a snapshot, of a live one.
    """
    try:
        report = inspect_spool(directory)
    except FileNotFoundError as exc:
        raise click.ClickException(str(exc)) from exc
    if as_json:
        click.echo(json.dumps(_report_json(report), indent=2))
        return
    _print_report(report)
    if any(q.error for q in report.queues):
        raise SystemExit(1)


def _report_json(report: SpoolReport) -> dict[str, object]:
    return {
        "directory": str(report.directory),
        "owner_pid": report.owner_pid,
        "partition_counts": report.partition_counts,
        "queues": [
            {
                "topic": q.topic,
                "partition": q.partition,
                "path": str(q.path),
                "error": q.error,
                "stats": asdict(q.stats) if q.stats else None,
                "recovery": asdict(q.recovery) if q.recovery else None,
            }
            for q in report.queues
        ],
    }


_COLUMNS = ("QUEUE", "DEPTH", "BYTES", "OLDEST", "HEAD", "NEXT", "DROPPED", "SKIPPED", "STATE")


def _row(q: QueueReport) -> tuple[str, ...]:
    name = f"{q.topic}/{'pending' if q.partition is None else q.partition}"
    if q.stats is None or q.recovery is None:
        return (name, "-", "-", "-", "-", "-", "-", "-", f"ERROR {q.error}")
    s, r = q.stats, q.recovery
    state = f"DAMAGED: {r.stop_reason}" if r.corrupt_tail else "ok"
    skipped = f"{r.skipped_records} ({s.skipped_total + r.skipped_records} total)"
    return (
        name,
        str(s.depth),
        _human_bytes(s.bytes),
        "-" if s.oldest_age_ms is None else f"{s.oldest_age_ms / 1000:.1f}s",
        str(s.head_seq),
        str(s.next_seq),
        str(s.dropped),
        skipped,
        state,
    )


def _print_report(report: SpoolReport) -> None:
    owner = (
        f"owned by live pid {report.owner_pid} (figures are a snapshot)"
        if report.owner_pid
        else "not in use"
    )
    click.echo(f"spool {report.directory}: {owner}")
    counts = ", ".join(f"{t}={n}" for t, n in sorted(report.partition_counts.items()))
    click.echo(f"partition counts: {counts or 'none known'}")
    if not report.queues:
        click.echo("no queues")
        return
    rows = [_COLUMNS, *(_row(q) for q in report.queues)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(_COLUMNS) - 1)]
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row[:-1], widths, strict=True)]
        click.echo("  ".join([*cells, row[-1]]))


def _human_bytes(count: int) -> str:
    size = float(count)
    for unit in ("B", "KiB", "MiB"):
        if size < 1024:
            return f"{size:.0f}{unit}" if unit == "B" else f"{size:.1f}{unit}"
        size /= 1024
    return f"{size:.1f}GiB"


main.add_command(broker)
