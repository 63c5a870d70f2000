"""The drain loop: one thread serving every queue of a spool.

Per queue it reads a batch after what is in flight, produces each record to its explicit
partition through librdkafka (idempotent, acks=all), and moves the queue's read position
to the end of the longest prefix the broker acknowledged. librdkafka retries transient
errors itself; `message.timeout.ms=0` means it never gives up on an event silently. A
transient failure that does surface rewinds the queue once its in-flight records have
settled, and the queue resends after a backoff: at-least-once, duplicates removable by
event_id. A permanent failure sends that event to the dead-letter file and moves on.

Delivery reports of one partition arrive in produce order (librdkafka keeps it, and the
idempotent producer guarantees it), so each queue's compiled callback (Deliveries) takes
the oldest sequence in flight, accounts a success itself and hands a failure to
`_on_failure`. The produce loop over a drained batch is compiled too; what to do when
produce() raises stays here.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from eventspool._core.native import AckTracker, Deliveries
from eventspool.clock import Clock
from eventspool.config import KafkaConfigValue, SenderSettings
from eventspool.sender.deadletter import DeadLetter, DeadLetterFile
from eventspool.sender.errors import is_permanent
from eventspool.sender.metadata import MetadataClient
from eventspool.spool.registry import QueueRef, QueueRegistry
from eventspool.spool.ring import RingQueue

log = logging.getLogger(__name__)

_IDLE_POLL_S = 0.01
_UNKNOWN_TOPIC_RETRY_S = 1.0
_ENVELOPE_OVERHEAD = 4096
_READ_BATCH_BYTES = 1 << 20

# (sequence, key, value, create time ms, headers); headers None: undecodable payload.
KafkaRecord = tuple[
    int, bytes | None, bytes | None, int, list[tuple[str, str | bytes | None]] | None
]


FailureHandler = Callable[["_QueueState", int, KafkaError, Message], None]


class _QueueState:
    """One queue as the sender sees it; `deliveries` is its delivery-report callback."""

    __slots__ = ("backoff_s", "deliveries", "partition", "ref", "retry_at", "tracker")

    def __init__(self, ref: QueueRef, partition: int, on_failure: FailureHandler) -> None:
        self.ref = ref
        self.partition = partition
        self.tracker = AckTracker(ref.ring.head_seq)
        self.deliveries = Deliveries(self.tracker, functools.partial(on_failure, self))
        self.retry_at = 0.0
        self.backoff_s = 0.0


@dataclass(slots=True)
class SenderCounters:
    delivered: int = 0
    retried_batches: int = 0
    dead_letters: int = 0
    broker_errors: int = 0
    reconnects: int = 0
    produce_requests: int = 0
    last_error: str | None = None


class Sender:
    def __init__(
        self,
        registry: QueueRegistry,
        bootstrap_servers: str,
        settings: SenderSettings,
        directory: Path,
        clock: Clock,
    ) -> None:
        self._registry = registry
        self._settings = settings
        self._clock = clock
        base: dict[str, KafkaConfigValue] = {
            "bootstrap.servers": bootstrap_servers,
            **settings.kafka,
        }
        statistics: dict[str, object] = {}
        if settings.statistics_interval_ms:
            statistics = {
                "statistics.interval.ms": settings.statistics_interval_ms,
                "stats_cb": self._on_statistics,
            }
        self._producer = Producer(
            {
                **statistics,
                "linger.ms": settings.linger_ms,
                "batch.size": settings.batch_size,
                "compression.type": settings.compression,
                "queue.buffering.max.messages": 2_000_000,
                "queue.buffering.max.kbytes": 2_097_151,
                "message.max.bytes": max(
                    1_000_000, registry.settings.max_event_bytes + _ENVELOPE_OVERHEAD
                ),
                **base,
                "enable.idempotence": True,
                "acks": "all",
                "message.timeout.ms": 0,
                "error_cb": self._on_error,
                "logger": logging.getLogger("eventspool.librdkafka"),
            }
        )
        self._metadata = MetadataClient(self._producer, base, settings)
        self.dead_letters = DeadLetterFile(directory)
        self.counters = SenderCounters()
        self._queues: dict[RingQueue, _QueueState] = {}
        self._advanced: set[_QueueState] = set()
        self._next_refresh = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="eventspool-sender", daemon=True)
        self.connected = False
        self._ever_connected = False

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop the loop; whatever is still unacknowledged stays queued for the next run.

        Waits for the thread itself, however long its current metadata request takes
        (bounded by `metadata_timeout_s`): the caller closes the queue files next, and
        the producer must not be used from two threads.
        """
        self._stop.set()
        self._thread.join()
        self._producer.purge()
        self._producer.poll(0)
        self._apply_acks()

    def request_metadata_refresh(self) -> None:
        self._next_refresh = 0.0

    # ---- loop -------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._refresh_metadata()
                produced = self._produce_round()
                self._producer.poll(0 if produced else _IDLE_POLL_S)
                self._apply_acks()
                self._settle()
            except Exception:
                log.exception("sender loop error; retrying")
                self._stop.wait(self._settings.retry_backoff_s)

    def _refresh_metadata(self) -> None:
        now = self._clock.monotonic()
        if now < self._next_refresh:
            return
        layouts = self._metadata.topics()
        if layouts is None:
            self.connected = False
            self._next_refresh = now + _UNKNOWN_TOPIC_RETRY_S
            return
        if not self.connected and self._ever_connected:
            self.counters.reconnects += 1
        self.connected = self._ever_connected = True
        missing = []
        for topic in self._registry.topics():
            if not topic.has_queues:  # being opened, or refused by the disk budget
                continue
            layout = layouts.get(topic.name)
            if layout is None:
                missing.append(topic.name)
                continue
            self._registry.set_partition_count(topic.name, layout.partition_count)
            self._registry.set_available_partitions(topic.name, layout.led_partitions)
        if missing and self._settings.create_topics:
            self._metadata.create_topics(missing)
        interval = _UNKNOWN_TOPIC_RETRY_S if missing else self._settings.metadata_refresh_s
        self._next_refresh = now + interval

    def _produce_round(self) -> int:
        produced = 0
        now = self._clock.monotonic()
        for ref in self._registry.refs():
            if ref.partition is None:
                if ref.ring.depth:
                    self._next_refresh = min(self._next_refresh, now + _UNKNOWN_TOPIC_RETRY_S)
                continue
            state = self._queues.get(ref.ring)
            if state is None:
                state = _QueueState(ref, ref.partition, self._on_failure)
                self._queues[ref.ring] = state
            if state.tracker.failed or now < state.retry_at:
                continue
            room = self._settings.max_in_flight_per_queue - state.tracker.in_flight
            if room <= 0 or not ref.ring.unread:
                continue
            batch = ref.ring.core.read_for_kafka(
                min(room, self._settings.read_batch_records), _READ_BATCH_BYTES
            )
            self._produce_batch(state, batch)
            produced += len(batch)
        return produced

    def _produce_batch(self, state: _QueueState, batch: list[KafkaRecord]) -> None:
        """Hand one batch of a queue to librdkafka, in order, in compiled loops.

        Records come out of the ring already decoded, with their `event_id` header first
        (RingCore.read_for_kafka). A record with no headers is one whose envelope could not
        be parsed: no Kafka message can be made of it, so it is dead-lettered as it is.
        """
        deliveries = state.deliveries
        produce = self._producer.produce
        start = 0
        while start < len(batch):
            try:
                start = deliveries.produce_batch(
                    produce, state.ref.topic, state.partition, batch, start
                )
            except (BufferError, KafkaException):
                start = deliveries.stopped_at
                if self._produce_retrying(state, batch[start]):
                    deliveries.queued(batch[start][0])
                start += 1
                continue
            if start < len(batch):
                seq, _, payload, _, _ = batch[start]
                self._undecodable(state, seq, payload)
                start += 1

    def _undecodable(self, state: _QueueState, seq: int, payload: bytes | None) -> None:
        state.tracker.sent(seq)
        self._dead_letter(
            state,
            error_code="UNDECODABLE",
            reason="undecodable envelope",
            event_id=None,
            key=None,
            value=payload,
        )
        self._settled(state, seq)

    def _produce_retrying(self, state: _QueueState, record: KafkaRecord) -> bool:
        """produce() after it raised: wait out a full librdkafka queue, settle errors.

        True once the record is queued; False when it failed for good (dead-lettered) or
        transiently (the queue is rewound once its in-flight records settle).
        """
        seq, key, value, timestamp, headers = record
        while True:
            try:
                self._producer.produce(
                    state.ref.topic,
                    value,
                    key,
                    partition=state.partition,
                    timestamp=timestamp,
                    headers=headers,
                    on_delivery=state.deliveries,
                )
                return True
            except BufferError:
                self._producer.poll(0.05)
                self._apply_acks()
            except KafkaException as exc:
                error = exc.args[0]
                if not isinstance(error, KafkaError):
                    raise
                if is_permanent(error):
                    raw_id = headers[0][1] if headers else None
                    self._dead_letter(
                        state,
                        error_code=error.name(),
                        reason=error.str(),
                        event_id=_as_text(raw_id),
                        key=key,
                        value=value,
                    )
                    self._settled(state, seq)
                else:
                    self.counters.last_error = str(error)
                    state.tracker.failed_transiently()
                return False

    def _on_failure(
        self, state: _QueueState, seq: int, error: KafkaError, message: Message
    ) -> None:
        """A failed delivery report: dead-letter a permanent failure, rewind otherwise."""
        if is_permanent(error):
            event_id = _as_text(dict(message.headers() or []).get("event_id"))
            key, value = message.key(), message.value()
            self._dead_letter(
                state,
                error_code=error.name(),
                reason=error.str(),
                event_id=event_id,
                key=_as_bytes(key),
                value=_as_bytes(value),
            )
            self._settled(state, seq)
            return
        self.counters.last_error = str(error)
        state.tracker.failed_transiently()

    def _settled(self, state: _QueueState, seq: int) -> None:
        if state.tracker.completed(seq):
            self._advanced.add(state)

    def _apply_acks(self) -> None:
        """Move read positions once per poll, not once per delivery report."""
        for state in self._queues.values():
            deliveries = state.deliveries
            if deliveries.advanced:
                deliveries.advanced = False
                state.backoff_s = 0.0
                self._advanced.add(state)
            if deliveries.delivered:
                self.counters.delivered += deliveries.delivered
                deliveries.delivered = 0
        for state in self._advanced:
            state.ref.ring.ack(state.tracker.acked_until - 1)
        self._advanced.clear()

    def _dead_letter(
        self,
        state: _QueueState,
        *,
        error_code: str,
        reason: str,
        event_id: str | None,
        key: bytes | None,
        value: bytes | None,
    ) -> None:
        self.dead_letters.write(
            DeadLetter(
                topic=state.ref.topic,
                partition=state.partition,
                event_id=event_id,
                key=key,
                value=value,
                error_code=error_code,
                reason=reason,
                time_ms=self._clock.now_ms(),
            )
        )
        self.counters.dead_letters += 1
        log.warning(
            "event %s of %s/%s dead-lettered: %s",
            event_id,
            state.ref.topic,
            state.ref.partition,
            reason,
        )

    def _settle(self) -> None:
        """Rewind queues whose failed batch has fully settled, with exponential backoff."""
        now = self._clock.monotonic()
        for state in self._queues.values():
            tracker = state.tracker
            if not tracker.failed or tracker.in_flight:
                continue
            state.ref.ring.rewind()
            tracker.reset(state.ref.ring.head_seq)
            state.backoff_s = min(
                self._settings.retry_backoff_max_s,
                max(self._settings.retry_backoff_s, state.backoff_s * 2),
            )
            state.retry_at = now + state.backoff_s
            self.counters.retried_batches += 1
            self._next_refresh = 0.0

    def _on_statistics(self, text: str) -> None:
        """Keep the count of produce requests librdkafka has sent to every broker."""
        brokers = json.loads(text).get("brokers", {})
        self.counters.produce_requests = sum(
            int(broker.get("req", {}).get("Produce", 0)) for broker in brokers.values()
        )

    def _on_error(self, error: KafkaError) -> None:
        self.counters.broker_errors += 1
        self.counters.last_error = str(error)
        if error.code() in (KafkaError._ALL_BROKERS_DOWN, KafkaError._TRANSPORT):
            self.connected = False


def _as_bytes(data: str | bytes | None) -> bytes | None:
    return data.encode() if isinstance(data, str) else data


def _as_text(data: str | bytes | None) -> str | None:
    return data.decode() if isinstance(data, bytes) else data
