"""Exact end offsets of partitions, also on brokers whose high watermark lags.

Kafka's high watermark is the last offset + 1. The embedded broker reports the base
offset of the last record batch + 1 instead, so a batch of ten records reads as one.
Reading from `watermark - 1` up to the end of the log (librdkafka's partition EOF)
returns the rest of that last batch, and the offset after its last record is the true
end. On a correct broker the same read returns one record and changes nothing.

One probe for every reader of ends: the consumer's lag, `eventspool.verify`, the soak
and the Spark source's `latestOffset`. Nothing is cached: a topic deleted and recreated
between two looks can show the same watermarks with a different end.

The offset lookups every reader makes (watermarks, offsets for a time) are here too, so
that each is asked again while a partition's leader moves, in one place.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from eventspool.errors import EventspoolError

TopicPartitionKey = tuple[str, int]
#: Says, for a record read by `scan`, that its partition has been read far enough.
StopAt = Callable[[TopicPartitionKey, Any], bool]
_Answer = TypeVar("_Answer")

_POLL_S = 0.1
# Answers that mean the partition's leader is moving or briefly out of reach: asked again,
# waiting 50 ms, then twice as long each time up to a second, until the caller's deadline.
# `_DESTROY_BROKER` fails a request queued on a broker handle librdkafka let go of while a
# broker went down or left the metadata; the next ask goes to the leader it knows now.
# A partition unknown for a moment (librdkafka's metadata while a broker is down, or a
# broker that does not lead it) is asked again too: one that does not exist fails at the
# deadline, with the same error.
_LEADER_MOVING = frozenset(
    {
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.FENCED_LEADER_EPOCH,
        KafkaError.UNKNOWN_LEADER_EPOCH,
        KafkaError.OFFSET_NOT_AVAILABLE,
        KafkaError.REPLICA_NOT_AVAILABLE,
        KafkaError.BROKER_NOT_AVAILABLE,
        KafkaError.NETWORK_EXCEPTION,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError._TRANSPORT,
        KafkaError._DESTROY_BROKER,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError._UNKNOWN_PARTITION,
    }
)
_FIRST_RETRY_S = 0.05
_LAST_RETRY_S = 1.0
# Settings a probe copies from the caller's: where the brokers are and how to reach them.
_CONNECTION_PREFIXES = ("bootstrap.servers", "security.", "sasl.", "ssl.", "client.")


class EndOffsetsError(EventspoolError):
    """The broker did not give the offsets in time, or failed a read."""


def probe_config(kafka: Mapping[str, Any], **overrides: Any) -> dict[str, Any]:
    """A probe's librdkafka settings: the caller's connection settings and no group."""
    config: dict[str, Any] = {
        key: value for key, value in kafka.items() if key.startswith(_CONNECTION_PREFIXES)
    }
    config.update(
        {
            "group.id": f"eventspool-probe-{uuid.uuid4().hex[:12]}",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "error",
            "fetch.wait.max.ms": 10,
        }
    )
    config.update(overrides)
    return config


def true_end_offsets(
    kafka: Mapping[str, Any], partitions: Iterable[TopicPartitionKey], timeout: float = 10.0
) -> dict[TopicPartitionKey, int]:
    """The next offset after the last record of each partition.

    `kafka` holds librdkafka settings (at least `bootstrap.servers`); the probe is a
    consumer of its own, assigned and closed within the call.
    """
    deadline = time.monotonic() + timeout
    consumer: Any = Consumer(probe_config(kafka))
    try:
        ends: dict[TopicPartitionKey, int] = {}
        starts: dict[TopicPartitionKey, int] = {}
        for topic, partition in partitions:
            low, high = watermarks(consumer, topic, partition, deadline)
            ends[(topic, partition)] = high
            if high > low:
                starts[(topic, partition)] = high - 1
        if starts:
            reached = _read(consumer, starts, lambda _tp, _message: False, deadline)
            for key, end in reached.items():
                ends[key] = max(ends[key], end)
        return ends
    finally:
        consumer.close()


def scan(
    kafka: Mapping[str, Any],
    starts: Mapping[TopicPartitionKey, int],
    stop: StopAt,
    timeout: float = 10.0,
) -> dict[TopicPartitionKey, int]:
    """Read each partition from its start until `stop` says so or the log ends; the next
    offset reached per partition (the log's end where it ended)."""
    deadline = time.monotonic() + timeout
    consumer: Any = Consumer(probe_config(kafka))
    try:
        return _read(consumer, starts, stop, deadline)
    finally:
        # A consumer of its own, closed at once: librdkafka (2.x) was seen to crash in a
        # consumer that had fetched from a topic when that topic was deleted later.
        consumer.close()


def watermarks(consumer: Any, topic: str, partition: int, deadline: float) -> tuple[int, int]:
    """The partition's low and high watermarks, asked again while its leader is moving."""

    def ask(timeout: float) -> tuple[int, int]:
        low, high = consumer.get_watermark_offsets(
            TopicPartition(topic, partition), timeout=timeout
        )
        return int(low), int(high)

    return _while_leaders_move(ask, f"{topic}/{partition}", deadline)


def offsets_for_time(
    consumer: Any, partitions: Iterable[TopicPartitionKey], timestamp_ms: int, deadline: float
) -> dict[TopicPartitionKey, int]:
    """Per partition, the first offset whose timestamp is at least `timestamp_ms`, or a
    negative offset where every record is older; asked again while a leader is moving.

    librdkafka fails the whole call, or reports one partition's failed lookup inside its
    answer; read as an offset, such an error would say "every record is older" and a
    query would skip the data.
    """
    wanted = [TopicPartition(topic, partition, timestamp_ms) for topic, partition in partitions]

    def ask(timeout: float) -> dict[TopicPartitionKey, int]:
        answers = consumer.offsets_for_times(wanted, timeout=timeout)
        for answer in answers:
            if answer.error is not None:
                raise KafkaException(answer.error)
        return {(answer.topic, answer.partition): int(answer.offset) for answer in answers}

    return _while_leaders_move(ask, f"timestamp {timestamp_ms}", deadline)


def _while_leaders_move(ask: Callable[[float], _Answer], what: str, deadline: float) -> _Answer:
    """`ask(timeout)`, again while the answer says a leader is moving, until `deadline`.

    librdkafka sends ListOffsets to the leader it knows and fails the call with the
    broker's "not leader" instead of asking the new one, so a leader move or a broker
    down would fail a caller for what is a normal case on a cluster.
    """
    pause = _FIRST_RETRY_S
    while True:
        try:
            return ask(max(deadline - time.monotonic(), 0.1))
        except KafkaException as exc:
            error = exc.args[0]
            moving = isinstance(error, KafkaError) and error.code() in _LEADER_MOVING
            if not moving or time.monotonic() + pause > deadline:
                raise EndOffsetsError(f"no offsets for {what}: {exc}") from exc
        time.sleep(pause)
        pause = min(pause * 2, _LAST_RETRY_S)


def _read(
    consumer: Any, starts: Mapping[TopicPartitionKey, int], stop: StopAt, deadline: float
) -> dict[TopicPartitionKey, int]:
    reached = dict(starts)
    pending = set(starts)
    if not pending:
        return reached
    consumer.assign(
        [TopicPartition(topic, partition, offset) for (topic, partition), offset in starts.items()]
    )
    while pending:
        if time.monotonic() > deadline:
            names = ", ".join(f"{topic}/{partition}" for topic, partition in sorted(pending))
            raise EndOffsetsError(f"the ends of {names} were not reached in time")
        for message in consumer.consume(10_000, _POLL_S):
            key = (message.topic(), message.partition())
            if key not in pending:
                continue
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    reached[key] = max(reached[key], message.offset())
                    pending.discard(key)
                    continue
                raise EndOffsetsError(f"reading {key[0]}/{key[1]}: {error}")
            reached[key] = message.offset() + 1
            if stop(key, message):
                pending.discard(key)
    return reached
