"""Forwarding: dead letters and stale events go to their topics through one idempotent
producer, made when the first one is due, and each counts as finished only once the
broker acknowledged it, so a crash before that redelivers it. A write that failed is
tried again a second later; one of a partition let go meanwhile is not, since the
partition's next owner redelivers the event."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Producer

from eventspool.clock import Clock
from eventspool.consumer.assignment import PartitionState
from eventspool.consumer.handle import DeliveryCallback, ForwardProducer
from eventspool.consumer.messages import Failure
from eventspool.consumer.record import WireRecord
from eventspool.consumer.settings import ConsumerSettings
from eventspool.consumer.status import ConsumerCounters

log = logging.getLogger("eventspool.consumer")

DEAD_LETTER_HEADERS = (
    "dlq.error.type",
    "dlq.error.message",
    "dlq.error.traceback",
    "dlq.original.topic",
    "dlq.original.partition",
    "dlq.original.offset",
    "dlq.attempts",
)
_FORWARD_RETRY_S = 1.0


@dataclass(slots=True)
class Forward:
    """One event on its way to a stale or dead-letter topic; `counter` is the
    ConsumerCounters field its acknowledgement counts in."""

    state: PartitionState
    wire: WireRecord
    target: str
    headers: list[tuple[str, bytes]]
    counter: str
    done: Callable[[], None]
    not_before: float = 0.0


class Forwarder:
    """The queue of events to forward and the producer that writes them."""

    def __init__(
        self,
        group: str,
        settings: ConsumerSettings,
        bootstrap_servers: str,
        counters: ConsumerCounters,
        clock: Clock,
        *,
        make_producer: Callable[[dict[str, Any]], ForwardProducer] = Producer,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._group = group
        self._settings = settings
        self._bootstrap = bootstrap_servers
        self._counters = counters
        self._clock = clock
        self._make_producer = make_producer
        self._monotonic = monotonic
        self._queue: list[Forward] = []
        self._producer: ForwardProducer | None = None

    @property
    def pending(self) -> bool:
        """Events wait to be written or acknowledged."""
        return bool(self._queue)

    def is_stale(self, created_ms: int | None) -> bool:
        """An event created more than `max_age_s` ago is not handled."""
        max_age = self._settings.max_age_s
        return (
            max_age is not None
            and created_ms is not None
            and self._clock.now_ms() - created_ms > max_age * 1000
        )

    def dead_letter(
        self,
        state: PartitionState,
        wire: WireRecord,
        attempt: int,
        failure: Failure,
        done: Callable[[], None],
    ) -> None:
        """Forward the event to the dead-letter topic; `done` once the broker has it."""
        topic, partition, offset = wire[0], wire[1], wire[2]
        values = (*failure, topic, str(partition), str(offset), str(attempt))
        headers = [
            (name, value.encode()) for name, value in zip(DEAD_LETTER_HEADERS, values, strict=True)
        ]
        target = self._settings.dead_letter_topic.format(topic=topic)
        self._queue.append(Forward(state, wire, target, headers, "dead_lettered", done))

    def drop_stale(self, state: PartitionState, wire: WireRecord, done: Callable[[], None]) -> None:
        """Skip a stale event, forwarding it if there is a stale topic; `done` once it
        counts as finished."""
        template = self._settings.stale_topic
        if template is None:
            self._counters.stale += 1
            done()
            return
        created = wire[6] or 0
        headers = [
            ("stale.original.topic", wire[0].encode()),
            ("stale.original.partition", str(wire[1]).encode()),
            ("stale.original.offset", str(wire[2]).encode()),
            ("stale.age_ms", str(self._clock.now_ms() - created).encode()),
        ]
        target = template.format(topic=wire[0])
        self._queue.append(Forward(state, wire, target, headers, "stale", done))

    def service(self) -> None:
        """Produce the queued events that are due, and serve the acknowledgements."""
        if self._producer is not None:
            self._producer.poll(0)
        if not self._queue:
            return
        now = self._monotonic()
        due = [f for f in self._queue if f.not_before <= now]
        if not due:
            return
        self._queue = [f for f in self._queue if f.not_before > now]
        producer = self._producer_now()
        for forward in due:
            if not forward.state.active:
                continue
            wire = forward.wire
            producer.produce(
                forward.target,
                value=wire[4],
                key=wire[3],
                headers=[*(wire[5] or []), *forward.headers],
                timestamp=wire[6] or 0,
                on_delivery=self._delivery_callback(forward),
            )
        producer.poll(0)

    def forget_inactive(self) -> None:
        """Drop the queued events of partitions let go: their next owner redelivers them."""
        self._queue = [f for f in self._queue if f.state.active]

    def flush(self, timeout: float) -> None:
        """Wait up to `timeout` for the writes in flight (at a stop)."""
        if self._producer is not None:
            self._producer.flush(timeout)

    def _delivery_callback(self, forward: Forward) -> DeliveryCallback:
        def delivered(error: Any, _message: Any) -> None:
            if error is not None:
                log.warning(
                    "consumer group %s: cannot write to %s (%s); retrying",
                    self._group,
                    forward.target,
                    error,
                )
                forward.not_before = self._monotonic() + _FORWARD_RETRY_S
                self._queue.append(forward)
                return
            setattr(self._counters, forward.counter, getattr(self._counters, forward.counter) + 1)
            forward.done()

        return delivered

    def _producer_now(self) -> ForwardProducer:
        if self._producer is None:
            self._producer = self._make_producer(
                {
                    "bootstrap.servers": self._bootstrap,
                    "enable.idempotence": True,
                    "acks": "all",
                    **{
                        k: v
                        for k, v in self._settings.kafka.items()
                        if k.startswith(("security.", "sasl.", "ssl."))
                    },
                }
            )
        return self._producer
