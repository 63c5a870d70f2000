"""Reading ids back from Kafka: the default `event_id` header, another id, and giving up early."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import Producer

from eventspool.broker import LocalBroker
from eventspool.verify import consume_event_ids, ledger


def produce(bootstrap: str, topic: str, records: list[tuple[bytes, str]]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for value, event_id in records:
        producer.produce(topic, value, headers=[("event_id", event_id.encode())])
    assert producer.flush(10) == 0


def test_ids_from_headers_by_default(
    broker: LocalBroker, topic_factory: Callable[[int], str]
) -> None:
    topic = topic_factory(2)
    produce(broker.bootstrap_servers, topic, [(b"a", "id-1"), (b"b", "id-2"), (b"c", "id-1")])
    seen = consume_event_ids(broker.bootstrap_servers, [topic], {"id-1", "id-2"}, timeout=30)
    assert seen == {"id-1": 2, "id-2": 1}


def test_ids_from_values_and_an_idle_stop(
    broker: LocalBroker, topic_factory: Callable[[int], str]
) -> None:
    """With a lost id, `idle_timeout` ends the wait long before `timeout`."""
    topic = topic_factory(1)
    produce(broker.bootstrap_servers, topic, [(b"v-1", "h"), (b"v-2", "h"), (b"other", "h")])

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
