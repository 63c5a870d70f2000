"""The drain loop: one thread serving every queue of a spool.

Per queue it reads a batch after what is in flight, produces each record to its explicit
partition through librdkafka (idempotent, acks=all), and moves the queue's read position
to the end of the longest prefix the broker acknowledged. librdkafka retries transient
errors itself; `message.timeout.ms=0` means it never gives up on an event silently. A
transient failure that does surface rewinds the queue once its in-flight records have
settled, and the queue resends after a backoff: at-least-once, duplicates removable by
event_id. A permanent failure sends that event to the dead-letter file and moves on.
"""

from __future__ import annotations

import functools
import logging
import threading
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from eventspool.clock import Clock
from eventspool.config import KafkaConfigValue, SenderSettings
from eventspool.envelope import decode
from eventspool.sender.deadletter import DeadLetter, DeadLetterFile
from eventspool.sender.errors import is_permanent
from eventspool.sender.metadata import MetadataClient
from eventspool.sender.tracking import AckTracker
from eventspool.spool.registry import QueueRef, QueueRegistry
from eventspool.spool.ring import Record, RingQueue

log = logging.getLogger(__name__)

_IDLE_POLL_S = 0.01
_UNKNOWN_TOPIC_RETRY_S = 1.0
_ENVELOPE_OVERHEAD = 4096


@dataclass(slots=True)
class _QueueState:
    ref: QueueRef
    partition: int
    tracker: AckTracker
    retry_at: float = 0.0
    backoff_s: float = 0.0


@dataclass(slots=True)
class SenderCounters:
    delivered: int = 0
    retried_batches: int = 0
    dead_letters: int = 0
    broker_errors: int = 0
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
        self._producer = Producer(
            {
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
        self._next_refresh = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="eventspool-sender", daemon=True)
        self.connected = False

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float) -> None:
        """Stop the loop; whatever is still unacknowledged stays queued for the next run."""
        self._stop.set()
        self._thread.join(timeout)
        self._producer.purge()
        self._producer.poll(0)

    def request_metadata_refresh(self) -> None:
        self._next_refresh = 0.0

    # ---- loop -------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._refresh_metadata()
                produced = self._produce_round()
                self._producer.poll(0 if produced else _IDLE_POLL_S)
                self._settle()
            except Exception:
                log.exception("sender loop error; retrying")
                self._stop.wait(self._settings.retry_backoff_s)

    def _refresh_metadata(self) -> None:
        now = self._clock.monotonic()
        if now < self._next_refresh:
            return
        counts = self._metadata.partition_counts()
        if counts is None:
            self.connected = False
            self._next_refresh = now + _UNKNOWN_TOPIC_RETRY_S
            return
        self.connected = True
        missing = []
        for topic in self._registry.topics():
            count = counts.get(topic.name)
            if count is None:
                missing.append(topic.name)
            else:
                self._registry.set_partition_count(topic.name, count)
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
                state = _QueueState(ref, ref.partition, AckTracker(ref.ring.head_seq))
                self._queues[ref.ring] = state
            if state.tracker.failed or now < state.retry_at:
                continue
            room = self._settings.max_in_flight_per_queue - state.tracker.in_flight
            if room <= 0 or not ref.ring.unread:
                continue
            batch = ref.ring.read_batch(min(room, self._settings.read_batch_records))
            for record in batch:
                self._produce(state, record)
            produced += len(batch)
        return produced

    def _produce(self, state: _QueueState, record: Record) -> None:
        ref = state.ref
        event = decode(record.payload)
        headers: list[tuple[str, str | bytes | None]] = [("event_id", event.event_id.encode())]
        if event.headers:
            headers.extend(event.headers)
        callback = functools.partial(self._on_delivery, state, record.seq)
        state.tracker.sent(record.seq)
        while True:
            try:
                self._producer.produce(
                    ref.topic,
                    event.value,
                    event.key,
                    partition=state.partition,
                    timestamp=event.create_time_ms,
                    headers=headers,
                    on_delivery=callback,
                )
                return
            except BufferError:
                self._producer.poll(0.05)
            except KafkaException as exc:
                error = exc.args[0]
                if not isinstance(error, KafkaError):
                    raise
                if is_permanent(error):
                    self._dead_letter(state, error, event.event_id, event.key, event.value)
                    if state.tracker.completed(record.seq):
                        ref.ring.ack(state.tracker.acked_until - 1)
                else:
                    callback(error, None)
                return

    def _on_delivery(
        self, state: _QueueState, seq: int, error: KafkaError | None, message: Message | None
    ) -> None:
        tracker = state.tracker
        if error is None:
            self.counters.delivered += 1
            if tracker.completed(seq):
                state.ref.ring.ack(tracker.acked_until - 1)
            state.backoff_s = 0.0
            return
        if is_permanent(error) and message is not None:
            raw_id = dict(message.headers() or []).get("event_id")
            event_id = raw_id.decode() if isinstance(raw_id, bytes) else raw_id
            key, value = message.key(), message.value()
            self._dead_letter(state, error, event_id, _as_bytes(key), _as_bytes(value))
            if tracker.completed(seq):
                state.ref.ring.ack(tracker.acked_until - 1)
            return
        self.counters.last_error = str(error)
        tracker.failed_transiently()

    def _dead_letter(
        self,
        state: _QueueState,
        error: KafkaError,
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
                error_code=error.name(),
                reason=error.str(),
                time_ms=self._clock.now_ms(),
            )
        )
        self.counters.dead_letters += 1
        log.warning(
            "event %s of %s/%s dead-lettered: %s",
            event_id,
            state.ref.topic,
            state.ref.partition,
            error.str(),
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

    def _on_error(self, error: KafkaError) -> None:
        self.counters.broker_errors += 1
        self.counters.last_error = str(error)
        if error.code() in (KafkaError._ALL_BROKERS_DOWN, KafkaError._TRANSPORT):
            self.connected = False


def _as_bytes(data: str | bytes | None) -> bytes | None:
    return data.encode() if isinstance(data, str) else data
