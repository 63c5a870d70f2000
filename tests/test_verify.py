"""Reading ids back from Kafka: the default `event_id` header, another id, giving up early,
and reading to the end, which a ledger relies on to count what it did not expect."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import Producer

from eventspool.broker import LocalBroker
from eventspool.verify import consume_event_ids, ledger
from tests.consumer.conftest import produce


def produce_with_ids(bootstrap: str, topic: str, records: list[tuple[bytes, str]]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for value, event_id in records:
        producer.produce(topic, value, headers=[("event_id", event_id.encode())])
    assert producer.flush(10) == 0


def test_ids_from_headers_by_default(
    broker: LocalBroker, topic_factory: Callable[[int], str]
) -> None:
    topic = topic_factory(2)
    produce_with_ids(
        broker.bootstrap_servers, topic, [(b"a", "id-1"), (b"b", "id-2"), (b"c", "id-1")]
    )
    seen = consume_event_ids(broker.bootstrap_servers, [topic], {"id-1", "id-2"}, timeout=30)
    assert seen == {"id-1": 2, "id-2": 1}


def test_ids_from_values_and_an_idle_stop(
    broker: LocalBroker, topic_factory: Callable[[int], str]
) -> None:
    """With a lost id, `idle_timeout` ends the wait long before `timeout`."""
    topic = topic_factory(1)
    produce_with_ids(
        broker.bootstrap_servers, topic, [(b"v-1", "h"), (b"v-2", "h"), (b"other", "h")]
    )

    def value_id(message: Any) -> str | None:
        value: bytes = message.value()
        return value.decode() if value.startswith(b"v-") else None

    started = time.monotonic()
    seen = consume_event_ids(
        broker.bootstrap_servers,
        [topic],
        {"v-1", "v-2", "v-3"},
        timeout=60,
        id_of=value_id,
        poll_timeout=0.05,
        idle_timeout=1.0,
    )
    assert time.monotonic() - started < 20
    assert seen == {"v-1": 1, "v-2": 1}
    assert ledger({"v-1", "v-2", "v-3"}, seen).lost == 1


def test_to_end_counts_what_lies_behind_the_last_expected_event(
    broker: LocalBroker, topic_factory: Callable[[int], str]
) -> None:
    """Records after the expected ones (duplicates, unacknowledged events) count too,
    also on tansu, whose high watermark is the base offset of the last batch + 1."""
    topic = topic_factory(2)
    first = produce(broker.bootstrap_servers, topic, [b"first"], partition=0)
    # More than one consume() call returns: a reader that stops once `first` is seen
    # leaves most of these unread.
    later = produce(broker.bootstrap_servers, topic, [b"later"] * 15_000, partition=0)
    other = produce(broker.bootstrap_servers, topic, [b"other"] * 300, partition=1)

    seen = consume_event_ids(broker.bootstrap_servers, [topic], first, to_end=True)

    assert set(seen) == {*first, *later, *other}
    assert ledger(first, seen).lost == 0
