"""The one end-offsets probe, against the embedded broker whose high watermark lags."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from eventspool.broker import LocalBroker
from eventspool.endoffsets import EndOffsetsError, probe_config, scan, true_end_offsets


def _produce_one_batch(bootstrap: str, topic: str, partition: int, count: int) -> None:
    """`count` records that leave in one batch (a long linger, one flush)."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 500})
    for index in range(count):
        producer.produce(topic, b"%d" % index, partition=partition)
    assert producer.flush(30) == 0


def test_the_true_end_of_a_batch_the_watermark_reports_as_one(
    broker: LocalBroker, topic_factory: Callable[[int], str]
) -> None:
    topic = topic_factory(3)
    _produce_one_batch(broker.bootstrap_servers, topic, 0, 10)
    _produce_one_batch(broker.bootstrap_servers, topic, 1, 1)
    watermarks = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": "hw"})
    try:
        high = watermarks.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1]
    finally:
        watermarks.close()
    kafka = {"bootstrap.servers": broker.bootstrap_servers}
    ends = true_end_offsets(kafka, [(topic, 0), (topic, 1), (topic, 2)])
    assert ends == {(topic, 0): 10, (topic, 1): 1, (topic, 2): 0}
    assert high <= 10  # 1 on the embedded broker, 10 on Kafka: the probe agrees with both


def test_scan_stops_where_the_caller_says(
    broker: LocalBroker, topic_factory: Callable[[int], str]
) -> None:
    topic = topic_factory(1)
    _produce_one_batch(broker.bootstrap_servers, topic, 0, 10)
    kafka = {"bootstrap.servers": broker.bootstrap_servers}

    def at_five(_key: tuple[str, int], message: Any) -> bool:
        return bool(message.value() == b"5")

    assert scan(kafka, {(topic, 0): 0}, at_five) == {(topic, 0): 6}
    assert scan(kafka, {(topic, 0): 3}, lambda _key, _message: False) == {(topic, 0): 10}


def test_an_unreachable_broker_is_an_error_in_time() -> None:
    with pytest.raises(EndOffsetsError, match="no offsets for t/0"):
        true_end_offsets({"bootstrap.servers": "127.0.0.1:1"}, [("t", 0)], timeout=1.0)


def test_a_probe_keeps_only_how_to_reach_the_brokers() -> None:
    config = probe_config(
        {
            "bootstrap.servers": "b:9092",
            "security.protocol": "SSL",
            "ssl.ca.location": "ca.pem",
            "group.id": "theirs",
            "enable.auto.commit": True,
            "auto.offset.reset": "earliest",
        }
    )
    assert config["bootstrap.servers"] == "b:9092"
    assert config["security.protocol"] == "SSL"
    assert config["ssl.ca.location"] == "ca.pem"
    assert config["group.id"] != "theirs"
    assert config["enable.auto.commit"] is False
    assert config["enable.partition.eof"] is True
