"""The topics of a cluster and their exact end offsets, for `eventspool topics` and `tail`.

Ends come from the exact-end probe, not the high watermark, which the embedded broker
reports too low (see `eventspool.endoffsets`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException

from eventspool.endoffsets import probe_config, true_end_offsets
from eventspool.errors import EventspoolError
from eventspool.kafkalog import librdkafka_logger

#: How long a metadata request may take before the brokers count as unreachable.
METADATA_TIMEOUT_S = 10.0


class TopicError(EventspoolError):
    """The brokers did not answer, or the topic asked for is not there."""


def partitions_of(consumer: Any, servers: str, topic: str | None = None) -> dict[str, list[int]]:
    """Each topic's partition ids (only *topic*'s, when given), by a metadata request that
    never creates a topic; a missing topic or silent brokers are a TopicError at once."""
    try:
        metadata = consumer.list_topics(topic, timeout=METADATA_TIMEOUT_S)
    except KafkaException as exc:
        reason = exc.args[0].str() if exc.args and isinstance(exc.args[0], KafkaError) else exc
        raise TopicError(
            f"no answer from the brokers at {servers} within {METADATA_TIMEOUT_S:g} s "
            f"({reason}): is a broker running there?"
        ) from exc
    found: dict[str, list[int]] = {}
    for name, described in metadata.topics.items():
        error = described.error
        if error is not None and error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
            raise TopicError(f"topic {name!r} does not exist on {servers}")
        if error is not None:
            raise TopicError(f"topic {name!r} on {servers}: {error.str()}")
        found[name] = sorted(described.partitions)
    return found


def topic_ends(kafka: Mapping[str, Any]) -> dict[str, dict[int, int]]:
    """The exact end offset of every partition of every topic but the internal ones
    (names starting with "__"), by topic name and partition id."""
    consumer = Consumer(probe_config(kafka, logger=librdkafka_logger()))
    try:
        topics = partitions_of(consumer, kafka["bootstrap.servers"])
    finally:
        consumer.close()
    wanted = {name: ids for name, ids in topics.items() if not name.startswith("__")}
    ends = true_end_offsets(kafka, [(name, p) for name, ids in wanted.items() for p in ids])
    return {name: {p: ends[(name, p)] for p in ids} for name, ids in sorted(wanted.items())}
