"""The pipeline end to end: events through the spool, ``run(once=True)`` on a multi-process
Spark, and the archive, statistics and rewards checked against a plain-Python computation
over the same events; replays and backfills change nothing."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession

from eventspool.broker import LocalBroker
from eventspool.spark.jobs.parse import parse_events
from eventspool.spark.jobs.rules import load_rules
from eventspool.spark.jobs.runner import PipelineConfig, PipelineSink, backfill, run
from eventspool.spark.source import FORMAT
from tests.spark.conftest import SPARK_MARKS, produce
from tests.spark.pipeline_data import (
    RULES_TOML,
    Expected,
    archive_ids,
    duplicate_some,
    expected,
    parquet_rewards,
    send_events,
    table_rewards,
    table_stats,
)

pytestmark = SPARK_MARKS

EVENTS = 3_000
DUPLICATES = 25


@dataclass(frozen=True)
class Sent:
    topics: list[str]
    ids: list[str]
    expected: Expected


@pytest.fixture(scope="module")
def sent(broker: LocalBroker, tmp_path_factory: pytest.TempPathFactory) -> Sent:
    stem = f"pipe-{uuid.uuid4().hex[:8]}"
    names = {name: f"{stem}-{name}" for name in ("orders", "payments", "page_views")}
    ids = send_events(
        tmp_path_factory.mktemp("spool"), broker.bootstrap_servers, names, EVENTS, seed=11
    )
    duplicate_some(broker.bootstrap_servers, names["orders"], DUPLICATES)
    topics = sorted(names.values())
    return Sent(topics, ids, expected(broker.bootstrap_servers, topics, EVENTS + DUPLICATES))


@pytest.fixture
def config(
    broker: LocalBroker, sent: Sent, database: str, tmp_path: Path
) -> Iterator[PipelineConfig]:
    rules = tmp_path / "rules.toml"
    rules.write_text(RULES_TOML)
    yield PipelineConfig(
        bootstrap_servers=broker.bootstrap_servers,
        output=tmp_path / "out",
        checkpoint=tmp_path / "checkpoint",
        dsn=database,
        topics=tuple(sent.topics),
        rules=load_rules(rules),
        max_offsets_per_trigger=1_200,
    )


def _check_outputs(config: PipelineConfig, sent: Sent) -> None:
    ids = archive_ids(config.output)
    assert len(ids) == EVENTS
    assert set(ids) == set(sent.ids) == sent.expected.event_ids
    assert table_stats(config.dsn) == sent.expected.stats
    assert table_rewards(config.dsn) == sent.expected.rewards
    assert parquet_rewards(config.output) == sent.expected.rewards


def test_run_once_archives_each_event_once_and_aggregates_match(
    spark: SparkSession, sent: Sent, config: PipelineConfig
) -> None:
    lines: list[str] = []
    summary = run(spark, config, once=True, progress=lines.append)
    _check_outputs(config, sent)
    assert summary.batches >= 3  # the read limit split the backlog
    assert summary.events == EVENTS
    assert summary.totals.distinct_event_ids == summary.totals.archived_rows == EVENTS
    assert sum(summary.totals.events_by_type.values()) == EVENTS
    assert summary.totals.reward_cents == sum(sent.expected.rewards.values())
    assert any(line.startswith("batch 0: ") for line in lines)
    # Nothing new: a second run reads nothing and changes nothing.
    again = run(spark, config, once=True, progress=lines.append)
    assert again.events == 0
    _check_outputs(config, sent)


def _snapshot(config: PipelineConfig) -> tuple[object, ...]:
    with psycopg.connect(config.dsn) as conn:
        tables = tuple(
            sorted(conn.execute(f"SELECT * FROM {table}").fetchall())
            for table in ("event_stats", "reward_totals", "rewards")
        )
    # Row order inside a file may differ between two runs of the same batch.
    files = sorted(
        (str(p.relative_to(config.output)), sorted(map(str, pq.read_table(p).to_pylist())))
        for p in config.output.rglob("*.parquet")
    )
    return (*tables, files)


def test_a_replayed_batch_changes_nothing(
    spark: SparkSession, sent: Sent, config: PipelineConfig
) -> None:
    """What Spark does after a crash between our commit and its own: the same batch id
    with the same events, handed to the sink again."""
    config.checkpoint.mkdir(parents=True)
    (config.checkpoint / "metadata").write_text(json.dumps({"id": str(uuid.uuid4())}))
    records = (
        spark.read.format(FORMAT).options(**config.source_options()).load().where("partition = 0")
    )
    batch = parse_events(records, config.rules.fields()).dropDuplicates(["event_id"])
    lines: list[str] = []
    sink = PipelineSink(config, lines.append)
    try:
        sink(batch, 0)
        first = _snapshot(config)
        sink(batch, 0)
        assert _snapshot(config) == first
        assert [r.replayed for r in sink.reports] == [False, True]
        sink(batch.limit(0), 1)
        assert _snapshot(config) == first
    finally:
        sink.close()


def test_backfill_of_the_days_gives_the_same_outputs_and_is_idempotent(
    spark: SparkSession, sent: Sent, config: PipelineConfig
) -> None:
    days = sorted({day for _, day in sent.expected.rewards})
    summary = backfill(spark, config, days[0], days[-1], progress=lambda _line: None)
    assert summary.events == EVENTS
    _check_outputs(config, sent)
    # After the stream processed the same days again, a backfill replaces, never adds.
    streamed = replace(config, checkpoint=config.checkpoint.with_name("stream"))
    run(spark, streamed, once=True, progress=lambda _line: None)
    backfill(spark, config, days[0], days[-1], progress=lambda _line: None)
    _check_outputs(config, sent)


def test_late_events_are_kept_and_later_duplicates_dropped(
    spark: SparkSession,
    broker: LocalBroker,
    database: str,
    topic_factory: Callable[[int], str],
    tmp_path: Path,
) -> None:
    """An event created days before the events already processed (a spool cut off from
    Kafka delivers it late) is archived and counted; a duplicate of an archived event in
    a later micro-batch is not."""
    topic = topic_factory(2)
    now = int(time.time() * 1000)
    day = 86_400_000

    def order(event_id: str, stamp: int, partition: int) -> tuple[Any, ...]:
        body = {
            "type": "order_created",
            "user_id": event_id,
            "status": "paid",
            "amount_cents": 1_000,
        }
        return (
            partition,
            b"k",
            json.dumps(body).encode(),
            stamp,
            [("event_id", event_id.encode())],
        )

    def send(rows: list[tuple[Any, ...]]) -> None:
        produce(
            broker.bootstrap_servers,
            topic,
            [(p, k, v) for p, k, v, _, _ in rows],
            timestamps=[stamp for *_, stamp, _ in rows],
            headers=[h for *_, h in rows],
        )

    current = [order(f"now-{n}", now, n % 2) for n in range(20)]
    late = [order(f"late-{n}", now - 3 * day, n % 2) for n in range(5)]
    config = PipelineConfig(
        bootstrap_servers=broker.bootstrap_servers,
        output=tmp_path / "out",
        checkpoint=tmp_path / "checkpoint",
        dsn=database,
        topics=(topic,),
    )
    send(current)
    assert run(spark, config, once=True, progress=lambda _line: None).events == 20
    send(current[:10] + late)
    second = run(spark, config, once=True, progress=lambda _line: None)
    assert second.events == 5
    ids = archive_ids(config.output)
    assert sorted(ids) == sorted([f"now-{n}" for n in range(20)] + [f"late-{n}" for n in range(5)])
    late_day = datetime.fromtimestamp((now - 3 * day) / 1000, UTC).date()
    assert (config.output / "archive" / f"topic={topic}" / f"date={late_day}").is_dir()
    assert sum(n for n, _ in table_stats(database).values()) == 25
    rewards = table_rewards(database)
    assert rewards[("late-0", late_day)] == 20  # 2% of 1000 cents, the default rule
    assert len(rewards) == 25
