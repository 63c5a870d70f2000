"""What the source asks the broker: partitions, offsets, and the records of one range.

Nothing is ever committed to Kafka and no consumer group is joined (partitions are
assigned): offsets live in Spark's checkpoint, and group joins are slow on some brokers.

Exact end offsets come from `eventspool.endoffsets`, the probe the consumer's lag and
`eventspool.verify` use too: the embedded broker's high watermark lags behind the last
record, so the end is read from the log itself.

Timestamps. ``offsets_for_times`` gives the first offset whose timestamp is at least the
one asked for; the embedded broker answers 0 for every timestamp. The answer is
therefore taken as a lower bound and the records from there are scanned for the first
one that really is late enough (on a correct broker, the first record read).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Iterator
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException
from confluent_kafka import TopicPartition as KafkaTopicPartition

from eventspool.endoffsets import (
    EndOffsetsError,
    offsets_for_time,
    scan,
    true_end_offsets,
    watermarks,
)
from eventspool.spark.extra import SparkExtraMissingError

try:
    import pyarrow as pa
except ModuleNotFoundError as missing:
    raise SparkExtraMissingError(missing.name) from missing

from eventspool.spark.offsets import OffsetRange, TopicPartition
from eventspool.spark.options import SourceOptions

_METADATA_TIMEOUT_S = 10.0
_SCAN_TIMEOUT_S = 30.0
_POLL_S = 0.2
ARROW_BATCH_ROWS = 50_000

# confluent-kafka's timestamp types, mapped to Kafka's (and Spark's) timestampType ids.
_TIMESTAMP_TYPES = {0: -1, 1: 0, 2: 1}

ARROW_SCHEMA = pa.schema(
    [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("timestampType", pa.int32()),
    ]
)
HEADERS_FIELD = pa.field(
    "headers",
    pa.list_(pa.field("element", pa.struct([("key", pa.string()), ("value", pa.binary())]))),
)
ARROW_SCHEMA_WITH_HEADERS = ARROW_SCHEMA.append(HEADERS_FIELD)


class KafkaSourceError(RuntimeError):
    """The broker did not answer, or the data asked for is not there (failOnDataLoss)."""


# Prefetch deeper than librdkafka's default of 100k messages (still bounded by
# queued.max.messages.kbytes, 64 MiB): it doubled the read rate from the embedded broker.
READ_DEFAULTS = {"queued.min.messages": 1_000_000}


def consumer_config(options: SourceOptions, **overrides: Any) -> dict[str, Any]:
    """librdkafka settings: the user's ``kafka.*`` options, then what the source needs."""
    config: dict[str, Any] = {
        "bootstrap.servers": options.bootstrap_servers,
        "group.id": f"eventspool-spark-{uuid.uuid4().hex[:12]}",
        **READ_DEFAULTS,
        **options.kafka,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "enable.partition.eof": True,
        "auto.offset.reset": "error",
    }
    config.update(overrides)
    return config


def _to_kafka(tp: TopicPartition, offset: int) -> KafkaTopicPartition:
    return KafkaTopicPartition(tp.topic, tp.partition, offset)


class OffsetReader:
    """The driver's view of the broker: partitions, earliest and exact latest offsets.

    Holds one consumer, made on first use, that only reads metadata and probes the ends
    of partitions; it is never pickled (Spark ships the stream reader to its workers).
    """

    def __init__(self, options: SourceOptions) -> None:
        self._options = options
        self._consumer: Any = None

    def _client(self) -> Any:
        """The metadata consumer: it is never assigned partitions (see `_scan`)."""
        if self._consumer is None:
            self._consumer = Consumer(consumer_config(self._options))
        return self._consumer

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    def partitions(self) -> list[TopicPartition]:
        """The partitions the subscription names now (assign: the assigned ones)."""
        subscription = self._options.subscription
        if subscription.assign:
            return list(subscription.assign)
        try:
            metadata = self._client().list_topics(timeout=_METADATA_TIMEOUT_S)
        except KafkaException as exc:
            raise KafkaSourceError(
                f"no metadata from {self._options.bootstrap_servers}: {exc}"
            ) from exc
        return sorted(
            TopicPartition(name, number)
            for name, topic in metadata.topics.items()
            if topic.error is None and subscription.matches(name)
            for number in topic.partitions
        )

    def earliest(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: _low(self._client(), tp) for tp in tps}

    def latest(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """The exact next offset after the last record of each partition."""
        wanted = list(tps)
        try:
            ends = true_end_offsets(
                consumer_config(self._options),
                [(tp.topic, tp.partition) for tp in wanted],
                _SCAN_TIMEOUT_S,
            )
        except (EndOffsetsError, KafkaException) as exc:
            raise KafkaSourceError(str(exc)) from exc
        return {tp: ends[(tp.topic, tp.partition)] for tp in wanted}

    def offsets_for_timestamp(
        self, tps: Iterable[TopicPartition], timestamp_ms: int
    ) -> dict[TopicPartition, int | None]:
        """The first offset whose record timestamp is at least `timestamp_ms`, per
        partition; None where every record is older."""
        wanted = [(tp.topic, tp.partition) for tp in tps]
        if not wanted:
            return {}
        deadline = time.monotonic() + _METADATA_TIMEOUT_S
        try:
            answers = offsets_for_time(self._client(), wanted, timestamp_ms, deadline)
        except EndOffsetsError as exc:
            raise KafkaSourceError(str(exc)) from exc
        result: dict[TopicPartition, int | None] = {}
        starts: dict[TopicPartition, int] = {}
        for key, offset in answers.items():
            tp = TopicPartition(*key)
            if offset < 0:
                result[tp] = None
            else:
                starts[tp] = max(offset, _low(self._client(), tp))
        found: dict[TopicPartition, int] = {}

        def late_enough(tp: TopicPartition, message: Any) -> bool:
            if message.timestamp()[1] >= timestamp_ms:
                found[tp] = message.offset()
                return True
            return False

        try:
            scan(
                consumer_config(self._options),
                {(tp.topic, tp.partition): offset for tp, offset in starts.items()},
                lambda key, message: late_enough(TopicPartition(*key), message),
                _SCAN_TIMEOUT_S,
            )
        except (EndOffsetsError, KafkaException) as exc:
            raise KafkaSourceError(str(exc)) from exc
        for tp in starts:
            result[tp] = found.get(tp)
        return result


def _low(consumer: Any, tp: TopicPartition) -> int:
    """The partition's first offset, asked again while its leader moves."""
    try:
        return watermarks(consumer, tp.topic, tp.partition, time.monotonic() + _METADATA_TIMEOUT_S)[
            0
        ]
    except EndOffsetsError as exc:
        raise KafkaSourceError(str(exc)) from exc


def read_range(options: SourceOptions, offset_range: OffsetRange) -> Iterator[pa.RecordBatch]:
    """The records of one range as Arrow record batches in Spark's Kafka schema."""
    schema = ARROW_SCHEMA_WITH_HEADERS if options.include_headers else ARROW_SCHEMA
    columns: dict[str, list[Any]] = {name: [] for name in schema.names}
    tp = offset_range.tp

    def flush() -> pa.RecordBatch:
        count = len(columns["offset"])
        arrays = [
            pa.array(columns["key"], pa.binary()),
            pa.array(columns["value"], pa.binary()),
            pa.array([tp.topic] * count, pa.string()),
            pa.array([tp.partition] * count, pa.int32()),
            pa.array(columns["offset"], pa.int64()),
            pa.array(columns["timestamp"], pa.int64()).cast(schema.field("timestamp").type),
            pa.array(columns["timestampType"], pa.int32()),
        ]
        if options.include_headers:
            arrays.append(pa.array(columns["headers"], HEADERS_FIELD.type))
        for values in columns.values():
            values.clear()
        return pa.RecordBatch.from_arrays(arrays, schema=schema)

    keys, values, offsets = columns["key"], columns["value"], columns["offset"]
    timestamps, types = columns["timestamp"], columns["timestampType"]
    headers = columns.get("headers")
    for batch in _messages(options, offset_range):
        for message in batch:
            keys.append(message.key())
            values.append(message.value())
            offsets.append(message.offset())
            kind, stamp = message.timestamp()
            timestamps.append(stamp * 1000)
            types.append(_TIMESTAMP_TYPES.get(kind, -1))
            if headers is not None:
                headers.append(
                    [{"key": name, "value": value} for name, value in message.headers() or ()]
                )
        if len(offsets) >= ARROW_BATCH_ROWS:
            yield flush()
    if offsets:
        yield flush()


def read_range_rows(options: SourceOptions, offset_range: OffsetRange) -> Iterator[tuple[Any, ...]]:
    """The same records as plain tuples: Spark converts them itself, more slowly."""
    from datetime import UTC, datetime, timedelta  # noqa: PLC0415 - only the slow path

    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    tp = offset_range.tp
    for batch in _messages(options, offset_range):
        for message in batch:
            kind, stamp = message.timestamp()
            row: tuple[Any, ...] = (
                message.key(),
                message.value(),
                tp.topic,
                tp.partition,
                message.offset(),
                epoch + timedelta(milliseconds=stamp),
                _TIMESTAMP_TYPES.get(kind, -1),
            )
            if options.include_headers:
                row += ([(name, value) for name, value in message.headers() or ()],)
            yield row


def _messages(options: SourceOptions, offset_range: OffsetRange) -> Iterator[list[Any]]:
    """Lists of records of the range, in offset order, without errors or records past it.

    A range that starts below the partition's earliest offset (deleted by retention) or
    that the log no longer reaches is lost data: an error with failOnDataLoss, else the
    records that remain are returned.
    """
    tp = offset_range.tp
    until = offset_range.until_offset
    if offset_range.size <= 0:
        return
    consumer: Any = Consumer(consumer_config(options))
    try:
        low = _low(consumer, tp)
        begin = offset_range.from_offset
        if begin < low:
            _data_loss(options, f"{tp}: offsets {begin}..{min(low, until)} were deleted")
            begin = low
            if begin >= until:
                return
        consumer.assign([_to_kafka(tp, begin)])
        next_offset = begin
        deadline = time.monotonic() + options.poll_timeout_ms / 1000
        while next_offset < until:
            messages = consumer.consume(min(until - next_offset, 10_000), _POLL_S)
            batch: list[Any] = []
            for message in messages:
                error = message.error()
                if error is not None:
                    if error.code() != KafkaError._PARTITION_EOF:
                        raise KafkaSourceError(f"reading {tp}: {error}")
                    if message.offset() >= until:
                        next_offset = until
                    continue
                offset = message.offset()
                if offset >= until:
                    next_offset = until
                    break
                batch.append(message)
                next_offset = offset + 1
            if batch:
                deadline = time.monotonic() + options.poll_timeout_ms / 1000
                yield batch
            elif time.monotonic() > deadline:
                _data_loss(
                    options,
                    f"{tp}: offsets {next_offset}..{until} did not arrive within "
                    f"{options.poll_timeout_ms} ms",
                )
                return
    finally:
        consumer.close()


def _data_loss(options: SourceOptions, message: str) -> None:
    if options.fail_on_data_loss:
        raise KafkaSourceError(
            f"{message}. Some data may have been lost; set failOnDataLoss=false to go on "
            "with what remains"
        )
