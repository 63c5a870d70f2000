"""The pipeline: Kafka -> deduplicated events -> raw archive, statistics and rewards.

``run`` is the streaming job (Trigger.AvailableNow with ``once``). Its plan is the source,
the envelope parse and ``dropDuplicatesWithinWatermark(event_id)`` (on arrival time),
whose state lives in the checkpoint; every micro-batch then goes to `PipelineSink`,
which writes it exactly once: archive files named by batch (replaced on replay),
PostgreSQL in one transaction fenced by (query id, batch id), and Parquet snapshots
rewritten from PostgreSQL.

``backfill`` is the batch job: it reads the records of whole UTC days (by timestamp),
deduplicates them and replaces those days in the archive and in the tables.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as sf

from eventspool.spark.jobs.aggregates import minute_stats, rule_totals
from eventspool.spark.jobs.parse import parse_events
from eventspool.spark.jobs.raw import write_archive
from eventspool.spark.jobs.rules import DEFAULT_RULES, RuleSet
from eventspool.spark.jobs.snapshots import write_snapshots
from eventspool.spark.postgres import apply_batch, connect, replace_days
from eventspool.spark.source import FORMAT

Progress = Callable[[str], None]

# Records are found by timestamp; read this far beyond the days so that records whose
# create time is slightly out of order in the log are not missed.
BACKFILL_SLACK = timedelta(minutes=10)


@dataclass(frozen=True)
class PipelineConfig:
    """Where to read, where to write, and how."""

    bootstrap_servers: str
    output: Path
    checkpoint: Path
    dsn: str
    topics: tuple[str, ...] = ()
    topic_pattern: str | None = None
    rules: RuleSet = DEFAULT_RULES
    watermark: str = "1 hour"
    starting_offsets: str = "earliest"
    max_offsets_per_trigger: int | None = None
    trigger_seconds: float = 5.0
    kafka: Mapping[str, str] = field(default_factory=dict)

    @property
    def archive(self) -> Path:
        return self.output / "archive"

    def source_options(self) -> dict[str, str]:
        """The options of the Kafka source, named as Spark's own Kafka source names them."""
        if bool(self.topics) == (self.topic_pattern is not None):
            raise ValueError("give either topics or a topic pattern")
        options = {
            "kafka.bootstrap.servers": self.bootstrap_servers,
            "includeHeaders": "true",
            **{f"kafka.{key}": value for key, value in self.kafka.items()},
        }
        if self.topics:
            options["subscribe"] = ",".join(self.topics)
        else:
            options["subscribePattern"] = str(self.topic_pattern)
        return options


@dataclass(frozen=True, slots=True)
class BatchReport:
    batch_id: int
    events: int
    stats_rows: int
    reward_keys: int
    replayed: bool
    seconds: float


@dataclass(frozen=True, slots=True)
class Totals:
    """What the outputs hold altogether (not just this run)."""

    archived_rows: int
    distinct_event_ids: int
    events_by_type: dict[str, int]
    amount_by_type: dict[str, int]
    reward_cents: int
    rewarded_users: int
    reward_days: int


@dataclass(frozen=True, slots=True)
class RunSummary:
    batches: int
    events: int
    replayed_batches: int
    seconds: float
    totals: Totals


def _days(parts: set[tuple[str, str]]) -> set[date]:
    return {date.fromisoformat(day) for _, day in parts}


class PipelineSink:
    """The foreachBatch function: one micro-batch of deduplicated events, exactly once."""

    def __init__(self, config: PipelineConfig, progress: Progress) -> None:
        self._config = config
        self._progress = progress
        self._conn: psycopg.Connection[tuple[object, ...]] | None = None
        self._query_id: str | None = None
        self.reports: list[BatchReport] = []

    def _connection(self) -> psycopg.Connection[tuple[object, ...]]:
        if self._conn is None or self._conn.closed:
            self._conn = connect(self._config.dsn)
        return self._conn

    def query_id(self) -> str:
        """Spark's id of this query, stable across restarts from the same checkpoint."""
        if self._query_id is None:
            metadata = self._config.checkpoint / "metadata"
            self._query_id = str(json.loads(metadata.read_text(encoding="utf-8"))["id"])
        return self._query_id

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        began = time.monotonic()
        events = batch.persist()
        try:
            count = events.count()
            if count == 0:
                return
            query_id = self.query_id()
            tag = f"{query_id[:8]}-b{batch_id:010d}"
            parts = write_archive(events, self._config.archive, tag)
            stats = minute_stats(events)
            totals = rule_totals(events, self._config.rules)
            conn = self._connection()
            applied = apply_batch(
                conn,
                query_id=query_id,
                batch_id=batch_id,
                stats=stats,
                totals=totals,
                rules=self._config.rules,
            )
            write_snapshots(conn, self._config.output, _days(parts))
        finally:
            events.unpersist()
        report = BatchReport(
            batch_id, count, len(stats), len(totals), not applied, time.monotonic() - began
        )
        self.reports.append(report)
        self._progress(
            f"batch {batch_id}: {count} events, {len(stats)} minute stats, "
            f"{len(totals)} reward totals{' (replay: tables unchanged)' if not applied else ''}"
            f" in {report.seconds:.1f}s"
        )

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()


def _events(records: DataFrame, rules: RuleSet) -> DataFrame:
    return parse_events(records, rules.fields())


def run(
    spark: SparkSession,
    config: PipelineConfig,
    *,
    once: bool,
    progress: Progress,
    should_stop: Callable[[], bool] = lambda: False,
) -> RunSummary:
    """Run the streaming job until the backlog is done (`once`) or `should_stop()`."""
    began = time.monotonic()
    options = config.source_options()
    options["startingOffsets"] = config.starting_offsets
    options["initialOffsetsLocation"] = str(
        config.checkpoint / "eventspool-source" / "initial-offsets.json"
    )
    if config.max_offsets_per_trigger is not None:
        options["maxOffsetsPerTrigger"] = str(config.max_offsets_per_trigger)
    records = spark.readStream.format(FORMAT).options(**options).load()
    # The watermark runs on arrival (the batch's time, the same again on a replay), not
    # on the create time: an event that reaches Kafka hours late, as a spool that was cut
    # off delivers it, is a late arrival, and Spark drops rows behind an event-time
    # watermark. A duplicate is dropped if it arrives within `watermark` of the original.
    deduplicated = (
        _events(records, config.rules)
        .withColumn("arrival", sf.current_timestamp())
        .withWatermark("arrival", config.watermark)
        .dropDuplicatesWithinWatermark(["event_id"])
        .drop("arrival")
    )
    sink = PipelineSink(config, progress)
    writer = (
        deduplicated.writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(config.checkpoint))
        .queryName("eventspool-pipeline")
    )
    if once:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=f"{config.trigger_seconds} seconds")
    query = writer.start()
    try:
        while not query.awaitTermination(1):
            if should_stop():
                progress("stopping after the current batch ...")
                query.stop()
                break
        error = query.exception()
        if error is not None:
            raise error
    finally:
        if query.isActive:
            query.stop()
        sink.close()
    return RunSummary(
        batches=len(sink.reports),
        events=sum(r.events for r in sink.reports if not r.replayed),
        replayed_batches=sum(1 for r in sink.reports if r.replayed),
        seconds=time.monotonic() - began,
        totals=totals(spark, config),
    )


def _epoch_ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def backfill(
    spark: SparkSession, config: PipelineConfig, first: date, last: date, *, progress: Progress
) -> RunSummary:
    """Recompute the UTC days first..last (inclusive) from Kafka and replace them."""
    if last < first:
        raise ValueError(f"--to {last} is before --from {first}")
    began = time.monotonic()
    start = datetime(first.year, first.month, first.day, tzinfo=UTC)
    end = datetime(last.year, last.month, last.day, tzinfo=UTC) + timedelta(days=1)
    options = config.source_options()
    options["startingTimestamp"] = str(_epoch_ms(start - BACKFILL_SLACK))
    options["startingOffsetsByTimestampStrategy"] = "latest"
    options["endingTimestamp"] = str(_epoch_ms(end + BACKFILL_SLACK))
    records = spark.read.format(FORMAT).options(**options).load()
    days = [first + timedelta(days=n) for n in range((last - first).days + 1)]
    events = (
        _events(records, config.rules)
        .where(sf.col("date").between(sf.lit(first), sf.lit(last)))
        .dropDuplicates(["event_id"])
        .persist()
    )
    try:
        count = events.count()
        progress(f"backfill {first}..{last}: {count} distinct events")
        write_archive(events, config.archive, f"backfill-{first}-{last}", replace_days=days)
        stats = minute_stats(events)
        totals_rows = rule_totals(events, config.rules)
        with connect(config.dsn) as conn:
            replace_days(conn, days=days, stats=stats, totals=totals_rows, rules=config.rules)
            write_snapshots(conn, config.output, days)
    finally:
        events.unpersist()
    progress(f"replaced {len(days)} day(s): {len(stats)} minute stats, {len(totals_rows)} totals")
    return RunSummary(1, count, 0, time.monotonic() - began, totals(spark, config))


def totals(spark: SparkSession, config: PipelineConfig) -> Totals:
    """Count what the archive and the tables hold."""
    archived = distinct = 0
    if any(config.archive.glob("topic=*/date=*/*.parquet")):
        row = (
            spark.read.parquet(str(config.archive))
            .agg(sf.count(sf.lit(1)).alias("rows"), sf.count_distinct("event_id").alias("ids"))
            .first()
        )
        if row is not None:
            archived, distinct = int(row["rows"]), int(row["ids"])
    with connect(config.dsn) as conn:
        by_type: list[Any] = conn.execute(
            "SELECT event_type, SUM(events), SUM(amount_cents) FROM event_stats GROUP BY 1"
        ).fetchall()
        reward: Any = conn.execute(
            "SELECT COALESCE(SUM(reward_cents), 0), COUNT(DISTINCT user_id),"
            " COUNT(DISTINCT day) FROM rewards"
        ).fetchone()
    return Totals(
        archived_rows=archived,
        distinct_event_ids=distinct,
        events_by_type={str(t): int(n) for t, n, _ in by_type},
        amount_by_type={str(t): int(a) for t, _, a in by_type},
        reward_cents=int(reward[0]),
        rewarded_users=int(reward[1]),
        reward_days=int(reward[2]),
    )


def describe(summary: RunSummary) -> list[str]:
    """The end-of-run summary, as lines for the terminal."""
    t = summary.totals
    by_type = ", ".join(f"{k}={v}" for k, v in sorted(t.events_by_type.items())) or "none"
    return [
        f"this run: {summary.batches} batch(es), {summary.events} events, "
        f"{summary.replayed_batches} replayed, {summary.seconds:.1f}s",
        f"archive: {t.archived_rows} rows, {t.distinct_event_ids} distinct event ids",
        f"statistics: {sum(t.events_by_type.values())} events ({by_type})",
        f"rewards: {t.reward_cents} cents to {t.rewarded_users} users over {t.reward_days} day(s)",
    ]
