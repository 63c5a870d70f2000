"""Forwarding without a broker: where dead letters and stale events go, with which
headers, and that each counts as finished only once the broker acknowledged it."""

from __future__ import annotations

from typing import Any

from confluent_kafka import KafkaError

from eventspool.clock import ManualClock
from eventspool.consumer.assignment import PartitionState
from eventspool.consumer.forwarding import DEAD_LETTER_HEADERS, Forwarder
from eventspool.consumer.offsets import PartitionOffsets
from eventspool.consumer.record import WireRecord
from eventspool.consumer.settings import ConsumerSettings
from eventspool.consumer.status import ConsumerCounters
from tests.consumer.fake_kafka import FakeProducer

CREATED_MS = 1_700_000_000_000
WIRE: WireRecord = ("orders", 3, 42, b"k", b"v", [("event_id", b"e1")], CREATED_MS, "e1")
FAILURE = ("ValueError", "bad input", "Traceback ...")


class _Rig:
    """A Forwarder with a fake producer and clocks, and what it finished."""

    def __init__(self, **settings: Any) -> None:
        self.clock = ManualClock(start_ms=CREATED_MS + 5_000)
        self.now = 0.0
        self.counters = ConsumerCounters()
        self.producers: list[FakeProducer] = []
        self.finished: list[str] = []
        self.state = PartitionState(PartitionOffsets())
        self.forwarder = Forwarder(
            "g",
            ConsumerSettings(**settings),
            "host:9092",
            self.counters,
            self.clock,
            make_producer=self._make_producer,
            monotonic=lambda: self.now,
        )

    def _make_producer(self, config: dict[str, Any]) -> FakeProducer:
        producer = FakeProducer(config)
        self.producers.append(producer)
        return producer

    def done(self, name: str) -> Any:
        return lambda: self.finished.append(name)

    @property
    def producer(self) -> FakeProducer:
        (producer,) = self.producers
        return producer


def test_a_dead_letter_goes_to_its_topic_with_the_failure_in_headers() -> None:
    rig = _Rig()
    rig.forwarder.dead_letter(rig.state, WIRE, 4, FAILURE, rig.done("e1"))
    assert rig.forwarder.pending
    rig.forwarder.service()
    (sent,) = rig.producer.produced
    assert (sent.topic, sent.key, sent.value, sent.timestamp) == (
        "orders.dlq",
        b"k",
        b"v",
        CREATED_MS,
    )
    assert sent.headers[0] == ("event_id", b"e1"), "the event's own headers come first"
    assert dict(sent.headers[1:]) == dict(
        zip(
            DEAD_LETTER_HEADERS,
            [b"ValueError", b"bad input", b"Traceback ...", b"orders", b"3", b"42", b"4"],
            strict=True,
        )
    )
    assert rig.finished == [], "not finished before the broker acknowledged it"
    sent.on_delivery(None, None)
    assert rig.finished == ["e1"]
    assert rig.counters.dead_lettered == 1
    assert not rig.forwarder.pending


def test_the_dead_letter_topic_template_names_the_source_topic() -> None:
    rig = _Rig(dead_letter_topic="dead.{topic}.letters")
    rig.forwarder.dead_letter(rig.state, WIRE, 1, FAILURE, rig.done("e1"))
    rig.forwarder.service()
    assert rig.producer.produced[0].topic == "dead.orders.letters"


def test_a_failed_write_is_tried_again_a_second_later_and_counts_only_then() -> None:
    rig = _Rig()
    rig.forwarder.dead_letter(rig.state, WIRE, 4, FAILURE, rig.done("e1"))
    rig.forwarder.service()
    rig.producer.produced[0].on_delivery(KafkaError(KafkaError._MSG_TIMED_OUT), None)
    assert (rig.finished, rig.counters.dead_lettered) == ([], 0)
    assert rig.forwarder.pending
    rig.now += 0.9
    rig.forwarder.service()
    assert len(rig.producer.produced) == 1, "not again before the retry interval"
    rig.now += 0.1
    rig.forwarder.service()
    assert len(rig.producer.produced) == 2
    rig.producer.produced[1].on_delivery(None, None)
    assert (rig.finished, rig.counters.dead_lettered) == (["e1"], 1)


def test_events_of_a_partition_let_go_are_not_written() -> None:
    rig = _Rig()
    rig.forwarder.dead_letter(rig.state, WIRE, 4, FAILURE, rig.done("e1"))
    rig.state.active = False
    rig.forwarder.forget_inactive()
    assert not rig.forwarder.pending
    rig.forwarder.dead_letter(rig.state, WIRE, 4, FAILURE, rig.done("e1"))
    rig.forwarder.service()
    assert rig.producer.produced == [], "queued before the revoke, written after: skipped"


def test_without_a_stale_topic_a_stale_event_is_counted_and_finished_at_once() -> None:
    rig = _Rig(max_age_s=1.0)
    rig.forwarder.drop_stale(rig.state, WIRE, rig.done("e1"))
    assert (rig.finished, rig.counters.stale) == (["e1"], 1)
    assert not rig.forwarder.pending
    rig.forwarder.service()
    assert rig.producers == [], "no producer is made for nothing to forward"


def test_a_stale_event_goes_to_the_stale_topic_with_its_age() -> None:
    rig = _Rig(max_age_s=1.0, stale_topic="{topic}.stale")
    rig.forwarder.drop_stale(rig.state, WIRE, rig.done("e1"))
    assert rig.finished == []
    rig.forwarder.service()
    (sent,) = rig.producer.produced
    assert sent.topic == "orders.stale"
    assert dict(sent.headers[1:]) == {
        "stale.original.topic": b"orders",
        "stale.original.partition": b"3",
        "stale.original.offset": b"42",
        "stale.age_ms": b"5000",
    }
    sent.on_delivery(None, None)
    assert (rig.finished, rig.counters.stale) == (["e1"], 1)


def test_staleness_is_an_age_above_max_age_of_an_event_with_a_create_time() -> None:
    rig = _Rig(max_age_s=5.0)
    now_ms = rig.clock.now_ms()
    assert rig.forwarder.is_stale(now_ms - 5_001)
    assert not rig.forwarder.is_stale(now_ms - 5_000)
    assert not rig.forwarder.is_stale(None), "no create time: never stale"
    assert not _Rig().forwarder.is_stale(0), "no max_age_s: nothing is stale"


def test_the_producer_is_idempotent_and_takes_only_the_security_settings() -> None:
    rig = _Rig(kafka={"sasl.mechanism": "PLAIN", "session.timeout.ms": 3000})
    rig.forwarder.dead_letter(rig.state, WIRE, 4, FAILURE, rig.done("e1"))
    rig.forwarder.service()
    rig.forwarder.service()
    assert rig.producer.config == {
        "bootstrap.servers": "host:9092",
        "enable.idempotence": True,
        "acks": "all",
        "sasl.mechanism": "PLAIN",
    }
