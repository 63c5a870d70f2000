"""Read topics back from Kafka and compare event ids with what was sent.

Reads by explicit assignment from the earliest offset, not through a consumer group:
nothing is committed, and a group rebalance cannot hide or repeat records.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from eventspool._core.native import EVENT_ID_HEADER
from eventspool.endoffsets import true_end_offsets

# librdkafka's own default: a longer poll needs no longer fetch.
_FETCH_WAIT_MAX_MS = 500


@dataclass(frozen=True, slots=True)
class Ledger:
    sent: int
    delivered: int
    lost: int
    duplicated: int

    @property
    def ok(self) -> bool:
        return self.lost == 0


def header_event_id(message: Any) -> str | None:
    """The `event_id` header of a consumed record, which every eventspool record carries."""
    raw = dict(message.headers() or []).get(EVENT_ID_HEADER)
    return raw.decode() if isinstance(raw, bytes) else None


def consume_event_ids(
    bootstrap_servers: str,
    topics: Collection[str],
    expected: Collection[str],
    timeout: float = 60.0,
    progress: Callable[[int], None] | None = None,
    *,
    id_of: Callable[[Any], str | None] = header_event_id,
    poll_timeout: float = 0.5,
    idle_timeout: float | None = None,
    to_end: bool = False,
) -> Counter[str]:
    """Count each event id found in `topics`, until every expected id is seen.

    Waits for topics that do not exist yet (created on first use). Stops at `timeout`
    too, so a loss shows up as missing ids rather than a hang; with `idle_timeout`, also
    once no record at all arrived for that long (the producer is done, the rest is lost).
    `id_of` reads a record's id (None: not one of ours); `poll_timeout` bounds how late
    the last record is noticed, since each poll waits that long unless 10,000 arrive, and
    so does each fetch: a broker that holds a fetch for `fetch.wait.max.ms` (500 by
    default) when no record is there yet would otherwise let the last records wait that
    long, whatever the poll.
    With `to_end`, also reads every partition up to its end as it was when the read began
    (exact on tansu too), so the duplicates and the records nobody expected behind the last
    expected one count.
    """
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap_servers,
            "group.id": f"eventspool-verify-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "enable.partition.eof": False,
            "fetch.wait.max.ms": min(max(1, round(poll_timeout * 1000)), _FETCH_WAIT_MAX_MS),
        }
    )
    seen: Counter[str] = Counter()
    missing = set(expected)
    deadline = time.monotonic() + timeout
    try:
        metadata = consumer.list_topics(timeout=10)
        while not all(t in metadata.topics for t in topics) and time.monotonic() < deadline:
            time.sleep(0.2)  # a topic created on first use may not exist yet
            metadata = consumer.list_topics(timeout=10)
        assignment = [
            TopicPartition(topic, partition, OFFSET_BEGINNING)
            for topic in topics
            if topic in metadata.topics
            for partition in metadata.topics[topic].partitions
        ]
        ends = (
            true_end_offsets(
                {"bootstrap.servers": bootstrap_servers},
                [(tp.topic, tp.partition) for tp in assignment],
            )
            if to_end
            else {}
        )
        positions: dict[tuple[str | None, int | None], int] = {}
        consumer.assign(assignment)
        last_record = time.monotonic()
        while (
            missing or any(positions.get(where, 0) < end for where, end in ends.items())
        ) and time.monotonic() < deadline:
            for message in consumer.consume(10_000, poll_timeout):
                if message.error():
                    continue
                last_record = time.monotonic()
                offset = message.offset()
                if offset is not None:
                    positions[(message.topic(), message.partition())] = offset + 1
                event_id = id_of(message)
                if event_id is not None:
                    seen[event_id] += 1
                    missing.discard(event_id)
            if progress is not None:
                progress(len(seen))
            if idle_timeout is not None and time.monotonic() - last_record > idle_timeout:
                break
    finally:
        consumer.close()
    return seen


def ledger(sent: Collection[str], seen: Counter[str]) -> Ledger:
    wanted = set(sent)
    delivered = sum(1 for event_id in wanted if seen[event_id])
    duplicated = sum(count - 1 for event_id, count in seen.items() if event_id in wanted)
    return Ledger(len(wanted), delivered, len(wanted) - delivered, duplicated)


def consume_topic(
    bootstrap_servers: str, topic: str, last_event_id: str, timeout: float = 60.0
) -> Counter[str]:
    """Every event_id of a one-partition topic, up to and including `last_event_id`.

    Within one partition records keep their order, so once the event sent last is seen,
    so is everything sent before it: this proves what a topic does not hold, too. Raises
    AssertionError when `last_event_id` does not arrive within `timeout`.
    """
    seen = consume_event_ids(bootstrap_servers, [topic], [last_event_id], timeout)
    if not seen[last_event_id]:
        raise AssertionError(f"{topic}: event {last_event_id} did not arrive in {timeout} s")
    return seen
