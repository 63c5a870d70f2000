"""The raw archive: deduplicated events as Parquet, partitioned by topic and UTC date.

Files are named after the batch that wrote them (``part-<tag>-NNNNN.parquet``). Spark
writes a batch into a staging directory first; the files are then renamed into place
after that batch's earlier files, if any, were removed. A replayed batch therefore
replaces its own files and never adds a second copy, and the archive holds no files of
failed attempts, so plain Parquet readers (pyarrow, DuckDB) read it correctly too.
Names starting with ``_`` are skipped by Spark and pyarrow readers alike.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from datetime import date
from pathlib import Path

from pyspark.sql import DataFrame

ARCHIVE_COLUMNS = (
    "event_id",
    "event_time",
    "topic",
    "partition",
    "offset",
    "key",
    "value",
    "event_type",
    "user_id",
    "amount_cents",
    "date",
)


def write_archive(
    events: DataFrame, archive: Path, tag: str, replace_days: Iterable[date] = ()
) -> set[tuple[str, str]]:
    """Write one batch's events; return the (topic, date) partitions it wrote to.

    `replace_days` (a backfill) are emptied first, once the new files are staged.
    """
    staging = archive / "_staging" / tag
    events.select(*ARCHIVE_COLUMNS).write.mode("overwrite").partitionBy("topic", "date").parquet(
        str(staging)
    )
    clear_days(archive, replace_days)
    written: set[tuple[str, str]] = set()
    for part in sorted(staging.glob("topic=*/date=*")):
        target = archive / part.relative_to(staging)
        target.mkdir(parents=True, exist_ok=True)
        for old in target.glob(f"part-{tag}-*.parquet"):
            old.unlink()
        for index, file in enumerate(sorted(part.glob("*.parquet"))):
            os.replace(file, target / f"part-{tag}-{index:05d}.parquet")
        written.add((part.parent.name.removeprefix("topic="), part.name.removeprefix("date=")))
    shutil.rmtree(staging, ignore_errors=True)
    return written


def clear_days(archive: Path, days: Iterable[date]) -> None:
    """Remove every topic's files of the given days (a backfill rewrites them whole)."""
    for day in days:
        for part in archive.glob(f"topic=*/date={day.isoformat()}"):
            shutil.rmtree(part)
