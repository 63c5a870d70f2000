"""Parquet copies of the statistics and rewards tables, one file per UTC day.

They are written from PostgreSQL after each batch commits, for the days the batch
touched: the file is a function of the committed tables, so rewriting it after a replay
or a crash gives the same file. Each file is written beside its final name and renamed
over it, so a reader sees the old day or the new one, never half a file.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from datetime import date
from pathlib import Path

import psycopg
import pyarrow as pa
import pyarrow.parquet as pq

from eventspool.spark.postgres import rewards_of_days, stats_of_days

STATS_SCHEMA = pa.schema(
    [
        ("minute", pa.timestamp("us", tz="UTC")),
        ("event_type", pa.string()),
        ("events", pa.int64()),
        ("amount_cents", pa.int64()),
    ]
)
REWARDS_SCHEMA = pa.schema(
    [
        ("user_id", pa.string()),
        ("day", pa.date32()),
        ("reward_cents", pa.int64()),
        ("qualifying_events", pa.int64()),
    ]
)


def _replace(table: pa.Table, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, path)


def write_snapshots(
    conn: psycopg.Connection[tuple[object, ...]], output: Path, days: Iterable[date]
) -> None:
    """Rewrite stats/date=D/ and rewards/date=D/ for each day from the tables."""
    for day in sorted(set(days)):
        stats = stats_of_days(conn, [day])
        _replace(
            pa.Table.from_pylist(
                [
                    {
                        "minute": s.minute,
                        "event_type": s.event_type,
                        "events": s.events,
                        "amount_cents": s.amount_cents,
                    }
                    for s in stats
                ],
                schema=STATS_SCHEMA,
            ),
            output / "stats" / f"date={day.isoformat()}" / "part-0.parquet",
        )
        rewards = rewards_of_days(conn, [day])
        _replace(
            pa.Table.from_pylist(
                [
                    {"user_id": u, "day": d, "reward_cents": r, "qualifying_events": q}
                    for u, d, r, q in rewards
                ],
                schema=REWARDS_SCHEMA,
            ),
            output / "rewards" / f"date={day.isoformat()}" / "part-0.parquet",
        )
