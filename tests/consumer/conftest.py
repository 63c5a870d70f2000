"""Helpers for consumer tests against the real embedded broker."""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

# Short timeouts: the embedded broker takes about half of session.timeout.ms to form a group.
GROUP_KAFKA: dict[str, str | int | float | bool] = {
    "session.timeout.ms": 3000,
    "heartbeat.interval.ms": 300,
}


def produce(
    bootstrap: str,
    topic: str,
    values: Sequence[bytes],
    *,
    keys: Sequence[bytes | None] | None = None,
    partition: int | None = None,
    timestamp_ms: int = 0,
) -> list[str]:
    """Produce one event per value, each with a fresh `event_id` header; their ids in order."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    ids: list[str] = []
    for index, value in enumerate(values):
        event_id = uuid.uuid4().hex
        ids.append(event_id)
        extra: dict[str, Any] = {} if partition is None else {"partition": partition}
        while True:
            try:
                producer.produce(
                    topic,
                    value,
                    key=None if keys is None else keys[index],
                    headers=[("event_id", event_id)],
                    timestamp=timestamp_ms,
                    **extra,
                )
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(30) == 0
    return ids


def handled(path: Path) -> Counter[str]:
    """How often each event id was handled, from a handler's output file."""
    if not path.exists():
        return Counter()
    return Counter(line.split()[0] for line in path.read_text().splitlines())


def handled_attempts(path: Path) -> dict[str, list[int]]:
    attempts: dict[str, list[int]] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            event_id, _where, _pid, attempt = line.split()
            attempts.setdefault(event_id, []).append(int(attempt))
    return attempts


def committed(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    """The group's committed offsets, read without joining the group."""
    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        result = reader.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=10)
    finally:
        reader.close()
    return {tp.partition: tp.offset for tp in result}


def read_topic(bootstrap: str, topic: str, count: int, timeout: float = 30.0) -> list[Any]:
    """The first `count` records of `topic` (all partitions), waiting for it to appear."""
    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": f"read-{uuid.uuid4().hex}"})
    messages: list[Any] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            metadata = reader.list_topics(topic, timeout=10).topics.get(topic)
            if metadata is not None and metadata.partitions and metadata.error is None:
                break
            time.sleep(0.2)
        reader.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in metadata.partitions])
        while len(messages) < count and time.monotonic() < deadline:
            messages.extend(m for m in reader.consume(1000, 0.5) if not m.error())
    finally:
        reader.close()
    return messages


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)
