"""Exact end offsets of partitions, also on brokers whose high watermark lags.

Kafka's high watermark is the last offset + 1. The embedded broker reports the base
offset of the last record batch + 1 instead, so a batch of ten records reads as one.
Fetching from `watermark - 1` returns that whole last batch, and the offset after its
last record is the true end. On a correct broker the same fetch returns one record and
changes nothing.
"""

from __future__ import annotations

import time
from typing import Any

from confluent_kafka import TopicPartition

TopicPartitionKey = tuple[str, int]


def true_end_offsets(
    probe: Any, partitions: list[TopicPartitionKey], timeout: float = 5.0
) -> dict[TopicPartitionKey, int]:
    """End offset per partition, read with `probe`: a confluent_kafka Consumer that is
    not subscribed to anything (this assigns it and unassigns it again)."""
    deadline = time.monotonic() + timeout
    ends: dict[TopicPartitionKey, int] = {}
    to_read: list[TopicPartition] = []
    for topic, partition in partitions:
        low, high = probe.get_watermark_offsets(
            TopicPartition(topic, partition), timeout=max(deadline - time.monotonic(), 0.1)
        )
        ends[(topic, partition)] = high
        if high > low:
            to_read.append(TopicPartition(topic, partition, high - 1))
    if not to_read:
        return ends
    probe.assign(to_read)
    try:
        _read_last_batches(probe, ends, {(tp.topic, tp.partition) for tp in to_read}, deadline)
    finally:
        probe.unassign()
    return ends


def _read_last_batches(
    probe: Any,
    ends: dict[TopicPartitionKey, int],
    unseen: set[TopicPartitionKey],
    deadline: float,
) -> None:
    # A fetch delivers a whole batch at once: once every partition has answered, one
    # empty poll means nothing of those batches is left to read.
    while time.monotonic() < deadline:
        messages = probe.consume(num_messages=10_000, timeout=0.05 if not unseen else 0.2)
        if not messages and not unseen:
            return
        for message in messages:
            if message.error():
                continue
            key = (message.topic(), message.partition())
            unseen.discard(key)
            ends[key] = max(ends[key], message.offset() + 1)
