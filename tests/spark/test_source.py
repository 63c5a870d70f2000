"""The source against the real broker on a multi-process Spark: Spark's Kafka schema and
column meanings, every startingOffsets form, the read limit, new partitions, exact ends."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer
from confluent_kafka import TopicPartition as KafkaTopicPartition
from confluent_kafka.admin import AdminClient
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.datasource import ReadAllAvailable
from pyspark.sql.streaming.query import StreamingQuery

from eventspool.broker import LocalBroker, create_topic
from eventspool.spark.kafka import KafkaSourceError, OffsetReader, read_range_rows
from eventspool.spark.offsets import TopicPartition
from eventspool.spark.options import parse_options
from eventspool.spark.source import FORMAT, KafkaInputPartition, KafkaStreamReader, kafka_schema
from tests.spark.conftest import SPARK_MARKS, produce, raise_failure, wait_for

pytestmark = SPARK_MARKS

SPARK_KAFKA_SCHEMA = (
    "struct<key:binary,value:binary,topic:string,partition:int,offset:bigint,"
    "timestamp:timestamp,timestampType:int,headers:array<struct<key:string,value:binary>>>"
)


def _batch(spark: SparkSession, bootstrap: str, **options: str) -> DataFrame:
    return (
        spark.read.format(FORMAT).option("kafka.bootstrap.servers", bootstrap).options(**options)
    ).load()


def _offsets(df: DataFrame) -> list[tuple[int, int]]:
    return sorted((r.partition, r.offset) for r in df.select("partition", "offset").collect())


def _stream_all(
    spark: SparkSession, bootstrap: str, tmp_path: Path, **options: str
) -> tuple[list[tuple[int, int]], StreamingQuery]:
    """Run an AvailableNow query into a memory table; its (partition, offset) pairs."""
    name = f"t_{uuid.uuid4().hex[:10]}"
    query = (
        spark.readStream.format(FORMAT)
        .option("kafka.bootstrap.servers", bootstrap)
        .options(**options)
        .load()
        .writeStream.format("memory")
        .queryName(name)
        .option("checkpointLocation", str(tmp_path / name))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    raise_failure(query)
    return _offsets(spark.table(name)), query


def test_schema_and_columns_mean_what_sparks_kafka_source_means(
    spark: SparkSession, broker: LocalBroker, topic_factory: Callable[[int], str]
) -> None:
    topic = topic_factory(2)
    stamp = 1_700_000_000_123
    sent = produce(
        broker.bootstrap_servers,
        topic,
        [(0, b"k0", b"v0"), (0, None, b"v1"), (1, b"k2", None)],
        timestamps=[stamp, stamp + 1, stamp + 2],
        headers=[[("event_id", b"e0"), ("trace", None)], None, [("a", b"1"), ("a", b"2")]],
    )
    with_headers = _batch(spark, broker.bootstrap_servers, subscribe=topic, includeHeaders="true")
    assert with_headers.schema == kafka_schema(True)
    assert with_headers.schema.simpleString() == SPARK_KAFKA_SCHEMA
    millis = with_headers.selectExpr("partition", "offset", "unix_millis(timestamp) AS ms")
    stamps = {(r.partition, r.offset): r.ms for r in millis.collect()}
    rows = sorted(with_headers.collect(), key=lambda r: (r.partition, r.offset))
    assert len(rows) == len(sent) == 3
    for row, record in zip(rows, sent, strict=True):
        assert (row.topic, row.partition, row.offset) == (topic, record.partition, record.offset)
        assert row.key == record.key
        assert row.value == record.value
        assert row.timestampType == 0  # CreateTime
        assert stamps[(row.partition, row.offset)] == record.timestamp_ms
        assert [(h.key, h.value) for h in row.headers or []] == (record.headers or [])
    without = _batch(spark, broker.bootstrap_servers, subscribe=topic)
    assert without.columns == [f.name for f in kafka_schema(False).fields]
    # The slower tuple path gives the same rows as the Arrow path.
    tuples = _batch(
        spark, broker.bootstrap_servers, subscribe=topic, includeHeaders="true", arrow="false"
    )
    assert sorted(tuples.collect(), key=lambda r: (r.partition, r.offset)) == rows


def test_exact_end_offsets_despite_the_brokers_high_watermark(
    spark: SparkSession, broker: LocalBroker, topic_factory: Callable[[int], str], tmp_path: Path
) -> None:
    """Ten records in one batch: the embedded broker's high watermark says 1."""
    topic = topic_factory(1)
    produce(
        broker.bootstrap_servers, topic, [(0, None, b"%d" % i) for i in range(10)], linger_ms=500
    )
    probe = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": "hw"})
    try:
        assert probe.get_watermark_offsets(KafkaTopicPartition(topic, 0), timeout=5) == (0, 1)
    finally:
        probe.close()
    options = parse_options(
        {"kafka.bootstrap.servers": broker.bootstrap_servers, "subscribe": topic},
        streaming=True,
    )
    reader = OffsetReader(options)
    try:
        assert reader.latest([TopicPartition(topic, 0)]) == {TopicPartition(topic, 0): 10}
    finally:
        reader.close()
    assert _batch(spark, broker.bootstrap_servers, subscribe=topic).count() == 10
    streamed, _ = _stream_all(
        spark, broker.bootstrap_servers, tmp_path, subscribe=topic, startingOffsets="earliest"
    )
    assert streamed == [(0, i) for i in range(10)]


def test_batch_offset_ranges(
    spark: SparkSession, broker: LocalBroker, topic_factory: Callable[[int], str]
) -> None:
    topic = topic_factory(2)
    produce(broker.bootstrap_servers, topic, [(p, None, b"x") for p in (0, 1) for _ in range(5)])
    ranged = _batch(
        spark,
        broker.bootstrap_servers,
        subscribe=topic,
        startingOffsets=json.dumps({topic: {"0": 2, "1": -2}}),
        endingOffsets=json.dumps({topic: {"0": -1, "1": 3}}),
    )
    assert _offsets(ranged) == [(0, 2), (0, 3), (0, 4), (1, 0), (1, 1), (1, 2)]
    assigned = _batch(
        spark, broker.bootstrap_servers, assign=json.dumps({topic: [1]}), minPartitions="4"
    )
    assert assigned.rdd.getNumPartitions() == 4
    assert _offsets(assigned) == [(1, i) for i in range(5)]
    with pytest.raises(Exception, match="must name every partition"):
        _batch(
            spark,
            broker.bootstrap_servers,
            subscribe=topic,
            startingOffsets=json.dumps({topic: {"0": 0}}),
        ).count()


def test_starting_offsets_earliest_json_and_timestamp(
    spark: SparkSession, broker: LocalBroker, topic_factory: Callable[[int], str], tmp_path: Path
) -> None:
    topic = topic_factory(3)
    base = 1_700_000_000_000
    records = [(p, None, b"%d" % i) for p in range(3) for i in range(4)]
    produce(
        broker.bootstrap_servers,
        topic,
        records,
        timestamps=[base + 1000 * i for _ in range(3) for i in range(4)],
    )
    everything = [(p, i) for p in range(3) for i in range(4)]
    earliest, _ = _stream_all(
        spark, broker.bootstrap_servers, tmp_path, subscribe=topic, startingOffsets="earliest"
    )
    assert earliest == everything
    specific, _ = _stream_all(
        spark,
        broker.bootstrap_servers,
        tmp_path,
        subscribe=topic,
        startingOffsets=json.dumps({topic: {"0": 3, "1": -2, "2": -1}}),
    )
    assert specific == [(0, 3), (1, 0), (1, 1), (1, 2), (1, 3)]
    by_time, _ = _stream_all(
        spark,
        broker.bootstrap_servers,
        tmp_path,
        subscribe=topic,
        startingTimestamp=str(base + 2500),
    )
    assert by_time == [(p, 3) for p in range(3)]
    with pytest.raises(Exception, match="no record at or after startingTimestamp"):
        _stream_all(
            spark,
            broker.bootstrap_servers,
            tmp_path,
            subscribe=topic,
            startingTimestamp=str(base + 10_000_000),
        )
    future, _ = _stream_all(
        spark,
        broker.bootstrap_servers,
        tmp_path,
        subscribe=topic,
        startingTimestamp=str(base + 10_000_000),
        startingOffsetsByTimestampStrategy="latest",
    )
    assert future == []


def test_starting_offsets_latest_and_a_new_topic_matched_mid_query(
    spark: SparkSession, broker: LocalBroker, tmp_path: Path
) -> None:
    """The broker cannot add partitions to a topic (no CreatePartitions), so partition
    discovery is shown by a second topic that the pattern matches once it exists."""
    prefix = f"grow-{uuid.uuid4().hex[:8]}"
    first = f"{prefix}-a"
    create_topic(broker.bootstrap_servers, first, 2)
    produce(broker.bootstrap_servers, first, [(0, None, b"old"), (1, None, b"old")])
    name = f"t_{uuid.uuid4().hex[:10]}"
    query = (
        spark.readStream.format(FORMAT)
        .option("kafka.bootstrap.servers", broker.bootstrap_servers)
        .option("subscribePattern", f"{prefix}-.*")
        .load()
        .writeStream.format("memory")
        .queryName(name)
        .option("checkpointLocation", str(tmp_path / name))
        .trigger(processingTime="500 milliseconds")
        .start()
    )
    try:
        wait_for(query, lambda: query.lastProgress is not None)
        produce(broker.bootstrap_servers, first, [(0, None, b"new")])
        second = f"{prefix}-b"
        create_topic(broker.bootstrap_servers, second, 2)
        produce(broker.bootstrap_servers, second, [(0, None, b"b0"), (1, None, b"b1")])

        def rows() -> list[tuple[Any, ...]]:
            table = spark.table(name).select("topic", "partition", "offset", "value")
            return sorted(tuple(r) for r in table.collect())

        wait_for(query, lambda: len(rows()) >= 3)
        time.sleep(2)
        assert rows() == [
            (first, 0, 1, b"new"),
            (second, 0, 0, b"b0"),
            (second, 1, 0, b"b1"),
        ]
    finally:
        query.stop()


def test_max_offsets_per_trigger_bounds_every_batch(
    spark: SparkSession, broker: LocalBroker, topic_factory: Callable[[int], str], tmp_path: Path
) -> None:
    topic = topic_factory(3)
    sizes = {0: 120, 1: 60, 2: 15}
    produce(
        broker.bootstrap_servers,
        topic,
        [(p, None, b"x") for p, n in sizes.items() for _ in range(n)],
    )
    offsets, query = _stream_all(
        spark,
        broker.bootstrap_servers,
        tmp_path,
        subscribe=topic,
        startingOffsets="earliest",
        maxOffsetsPerTrigger="40",
    )
    assert offsets == [(p, i) for p, n in sizes.items() for i in range(n)]
    batches = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert batches == [40, 40, 40, 40, 35]


def test_initial_offsets_survive_a_restart_before_the_first_batch(
    broker: LocalBroker, topic_factory: Callable[[int], str], tmp_path: Path
) -> None:
    topic = topic_factory(2)
    produce(broker.bootstrap_servers, topic, [(0, None, b"a"), (1, None, b"b")])
    raw = {
        "kafka.bootstrap.servers": broker.bootstrap_servers,
        "subscribe": topic,
        "startingOffsets": "latest",
        "initialOffsetsLocation": str(tmp_path / "initial.json"),
    }
    first = KafkaStreamReader(parse_options(raw, streaming=True))
    assert first.initialOffset() == {topic: {"0": 1, "1": 1}}
    first.stop()
    produce(broker.bootstrap_servers, topic, [(0, None, b"c"), (1, None, b"d")])
    restarted = KafkaStreamReader(parse_options(raw, streaming=True))
    assert restarted.initialOffset() == {topic: {"0": 1, "1": 1}}
    restarted.stop()
    del raw["initialOffsetsLocation"]
    unpersisted = KafkaStreamReader(parse_options(raw, streaming=True))
    assert unpersisted.initialOffset() == {topic: {"0": 2, "1": 2}}
    unpersisted.stop()


def _delete_topic(bootstrap: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.delete_topics([topic])[topic].result(10)


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_a_recreated_topic_is_data_loss(
    broker: LocalBroker, tmp_path: Path, fail_on_data_loss: bool
) -> None:
    """The broker cannot delete records, but it can delete a topic: offsets then go back.

    Driven through the stream reader's calls, in the order Spark makes them, rather than
    a running query: librdkafka was seen to crash when a topic is deleted while one of
    its consumers is fetching from it.
    """
    topic = f"recreated-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap_servers, topic, 1)
    produce(broker.bootstrap_servers, topic, [(0, None, b"old-%d" % i) for i in range(5)])
    options = {
        "kafka.bootstrap.servers": broker.bootstrap_servers,
        "subscribe": topic,
        "startingOffsets": "earliest",
        "failOnDataLoss": str(fail_on_data_loss).lower(),
    }
    reader = KafkaStreamReader(parse_options(options, streaming=True))
    try:
        start = reader.initialOffset()
        end = reader.latestOffset(start, ReadAllAvailable())
        assert end == {topic: {"0": 5}}
        assert len(reader.partitions(start, end)) == 1
        _delete_topic(broker.bootstrap_servers, topic)
        create_topic(broker.bootstrap_servers, topic, 1)
        produce(broker.bootstrap_servers, topic, [(0, None, b"new-%d" % i) for i in range(2)])
        lower = reader.latestOffset(end, ReadAllAvailable())
        assert lower == {topic: {"0": 2}}
        if fail_on_data_loss:
            with pytest.raises(KafkaSourceError, match="below the start offset 5"):
                reader.partitions(end, lower)
            return
        assert reader.partitions(end, lower) == []
        produce(broker.bootstrap_servers, topic, [(0, None, b"later-%d" % i) for i in range(3)])
        later = reader.latestOffset(lower, ReadAllAvailable())
        (partition,) = reader.partitions(lower, later)
        assert isinstance(partition, KafkaInputPartition)
        rows = list(read_range_rows(parse_options(options, streaming=True), partition.range))
        assert [row[1] for row in rows] == [b"later-0", b"later-1", b"later-2"]
    finally:
        reader.stop()
