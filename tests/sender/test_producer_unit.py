"""The sender's producer settings, and the compiled produce loop against a producer
that only satisfies `KafkaProducer`: no broker."""

from __future__ import annotations

import dataclasses

from confluent_kafka import KafkaError

from eventspool._core.native import AckTracker, Deliveries
from eventspool.config import SenderSettings
from eventspool.sender.producer import (
    DELIVERY_SETTINGS,
    ENVELOPE_OVERHEAD,
    FORCED_SETTINGS,
    TYPED_SETTINGS,
    ProducerCallbacks,
    producer_config,
)
from eventspool.sender.queuestate import KafkaRecord
from tests.sender.fake_producer import FakeProducer

CALLBACKS = ProducerCallbacks(on_error=lambda _error: None, on_statistics=lambda _text: None)


def test_the_delivery_settings_win_over_the_user_s() -> None:
    settings = SenderSettings(
        kafka={"enable.idempotence": False, "acks": "1", "message.timeout.ms": 30_000}
    )
    config = producer_config("b:9092", settings, 1024, CALLBACKS)
    assert {name: config[name] for name in DELIVERY_SETTINGS} == {
        "enable.idempotence": True,
        "acks": "all",
        "message.timeout.ms": 0,
    }


def test_the_user_s_settings_win_over_the_tuning_defaults() -> None:
    settings = SenderSettings(
        kafka={"queue.buffering.max.messages": 10, "security.protocol": "SSL"}
    )
    config = producer_config("b:9092", settings, 1024, CALLBACKS)
    assert config["queue.buffering.max.messages"] == 10
    assert config["security.protocol"] == "SSL"
    assert config["bootstrap.servers"] == "b:9092"


def test_the_largest_event_fits_in_a_message() -> None:
    small = producer_config("b:9092", SenderSettings(), 1024)
    assert small["message.max.bytes"] == 1_000_000
    large = producer_config("b:9092", SenderSettings(), 4_000_000)
    assert large["message.max.bytes"] == 4_000_000 + ENVELOPE_OVERHEAD


def test_the_typed_settings_come_from_the_sender_settings() -> None:
    settings = SenderSettings(compression="zstd", linger_ms=7, batch_size=123)
    config = producer_config("b:9092", settings, 1024)
    assert (config["compression.type"], config["linger.ms"], config["batch.size"]) == (
        "zstd",
        7,
        123,
    )
    typed = {"compression.type", "linger.ms", "batch.size", "bootstrap.servers"}
    assert typed <= TYPED_SETTINGS.keys()
    fields = {field.name for field in dataclasses.fields(SenderSettings)}
    assert set(TYPED_SETTINGS.values()) <= fields | {"bootstrap_servers"}


def test_every_setting_delivery_depends_on_is_refused_to_the_user() -> None:
    config = producer_config("b:9092", SenderSettings(), 1024, CALLBACKS)
    assert {*DELIVERY_SETTINGS, "error_cb", "logger"} <= FORCED_SETTINGS
    assert {"error_cb", "logger"} <= config.keys()


def test_statistics_are_asked_for_only_with_somewhere_to_report_them() -> None:
    settings = SenderSettings(statistics_interval_ms=500)
    bare = producer_config("b:9092", settings, 1024)
    assert not {"statistics.interval.ms", "stats_cb", "error_cb", "logger"} & bare.keys()
    hooked = producer_config("b:9092", settings, 1024, CALLBACKS)
    assert hooked["statistics.interval.ms"] == 500
    assert hooked["stats_cb"] is CALLBACKS.on_statistics
    assert hooked["error_cb"] is CALLBACKS.on_error
    off = producer_config("b:9092", SenderSettings(statistics_interval_ms=0), 1024, CALLBACKS)
    assert not {"statistics.interval.ms", "stats_cb"} & off.keys()


def _record(seq: int, headers: bool = True) -> KafkaRecord:
    return (seq, b"k%d" % seq, b"v%d" % seq, 1000 + seq, [("event_id", b"e")] if headers else None)


def test_the_compiled_loop_produces_each_record_to_its_partition_in_order() -> None:
    producer = FakeProducer()
    tracker = AckTracker(10)
    deliveries = Deliveries(tracker, lambda _seq, _error, _message: None)
    batch = [_record(seq) for seq in range(10, 13)]
    assert deliveries.produce_batch(producer.produce, "t", 3, batch, 0) == 3
    assert [(p.topic, p.partition, p.key, p.value, p.timestamp) for p in producer.produced] == [
        ("t", 3, b"k10", b"v10", 1010),
        ("t", 3, b"k11", b"v11", 1011),
        ("t", 3, b"k12", b"v12", 1012),
    ]
    assert producer.produced[0].headers == [("event_id", b"e")]
    assert tracker.in_flight == 3
    for produced in producer.produced:
        produced.report(None, None)  # type: ignore[arg-type]  # a success needs no message
    assert (tracker.acked_until, deliveries.delivered, deliveries.advanced) == (13, 3, True)


def test_the_compiled_loop_stops_at_an_undecodable_record_and_a_full_queue() -> None:
    producer = FakeProducer()
    deliveries = Deliveries(AckTracker(0), lambda _seq, _error, _message: None)
    batch = [_record(0), _record(1, headers=False), _record(2), _record(3)]
    assert deliveries.produce_batch(producer.produce, "t", 0, batch, 0) == 1
    producer.full_after = 2
    try:
        deliveries.produce_batch(producer.produce, "t", 0, batch, 2)
    except BufferError:
        pass
    else:
        raise AssertionError("a full queue must stop the loop")
    assert deliveries.stopped_at == 3
    assert [p.key for p in producer.produced] == [b"k0", b"k2"]


def test_a_failed_report_goes_to_the_failure_handler_with_its_sequence() -> None:
    producer = FakeProducer()
    failures: list[tuple[int, KafkaError]] = []
    tracker = AckTracker(0)
    deliveries = Deliveries(tracker, lambda seq, error, _message: failures.append((seq, error)))
    deliveries.produce_batch(producer.produce, "t", 0, [_record(0), _record(1)], 0)
    error = KafkaError(KafkaError.MSG_SIZE_TOO_LARGE)
    producer.produced[0].report(None, None)  # type: ignore[arg-type]
    producer.produced[1].report(error, None)  # type: ignore[arg-type]
    assert failures == [(1, error)]
    assert tracker.acked_until == 1
