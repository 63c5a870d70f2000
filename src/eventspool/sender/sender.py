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

Nothing wedges. When the producer is broken for good (watchdog.py) the sender drops it,
rewinds every queue to its acknowledged position and goes on with a new one: events in
flight then may arrive twice. Partition health (health.py) steers keyless events away
from partitions without a working leader, and failover.py moves those already queued
there. A queue that holds events and has not advanced for `stall_after_s` is reported
(stalls.py), never silent.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from eventspool._core.native import EVENT_ID_HEADER
from eventspool.clock import Clock
from eventspool.config import SenderSettings
from eventspool.sender.deadletter import DeadLetter, DeadLetterFile
from eventspool.sender.errors import is_permanent
from eventspool.sender.failover import FailoverStep, failover_step, move_keyless
from eventspool.sender.health import PartitionHealth, parse_statistics
from eventspool.sender.metadata import MetadataClient
from eventspool.sender.producer import (
    KafkaProducer,
    ProducerCallbacks,
    admin_config,
    producer_config,
)
from eventspool.sender.queuestate import KafkaRecord, QueueState
from eventspool.sender.stalls import StallChange, StallDetector, StalledQueue
from eventspool.sender.topicsettings import TopicSettingsCheck
from eventspool.sender.watchdog import ProducerWatchdog
from eventspool.spool.registry import QueueRegistry
from eventspool.spool.segments import SegmentedQueue

log = logging.getLogger(__name__)

# A round that found less than a full batch to send waits in poll(): briefly while
# traffic is recent (a new event waits at most that long before it is produced), longer
# once it has stopped (`Sender._poll_timeout`).
_BUSY_POLL_S = 0.001
_IDLE_POLL_S = 0.01
_BUSY_FOR_S = 0.2
_SMALL_ROUND = 64  # events a round produced below which the next one waits
_UNKNOWN_TOPIC_RETRY_S = 1.0
_READ_BATCH_BYTES = 1 << 20
_WATCH_INTERVAL_S = 0.5


@dataclass(slots=True)
class SenderCounters:
    delivered: int = 0
    retried_batches: int = 0
    dead_letters: int = 0
    broker_errors: int = 0
    reconnects: int = 0
    produce_requests: int = 0
    producer_resets: int = 0
    failover_moved: int = 0
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
        self._producer_config = producer_config(
            bootstrap_servers,
            settings,
            registry.settings.max_event_bytes,
            ProducerCallbacks(on_error=self._on_error, on_statistics=self._on_statistics),
        )
        self._admin_config = admin_config(bootstrap_servers, settings)
        self._producer: KafkaProducer = Producer(self._producer_config)
        self._metadata = MetadataClient(self._producer, self._admin_config, settings)
        self.dead_letters = DeadLetterFile(directory)
        self.counters = SenderCounters()
        self._queues: dict[SegmentedQueue, QueueState] = {}
        self._advanced: set[QueueState] = set()
        self._next_refresh = 0.0
        self._next_watch = 0.0
        self._produced_at = 0.0
        self._health = PartitionHealth(clock)
        self._watchdog = ProducerWatchdog(settings.producer_reset_after_s, clock.monotonic())
        self._stalls: StallDetector[SegmentedQueue] = StallDetector(settings.stall_after_s)
        self.moves = 0  # failover moves so far: Spool.flush() then looks at the new rings
        self._topic_settings = TopicSettingsCheck()
        # Topics whose settings cannot keep an acknowledged event, with why.
        self.topic_warnings = self._topic_settings.warnings
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="eventspool-sender", daemon=True)
        self.connected = False
        # The last metadata request went unanswered: waiting for acknowledgements is vain.
        self.unreachable = False
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

    # ---- status -----------------------------------------------------------------

    def stalled_queues(self) -> list[StalledQueue]:
        """Queues holding events that have not advanced for `stall_after_s` or longer."""
        now = self._clock.monotonic()
        stalled = []
        for ref in self._registry.refs():
            stalled_s = self._stalls.stalled_for(ref.ring, ref.ring.depth, now)
            if stalled_s is not None:
                stalled.append(StalledQueue(ref.topic, ref.partition, ref.ring.depth, stalled_s))
        return stalled

    # ---- loop -------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._refresh_metadata()
                produced = self._produce_round()
                self._producer.poll(self._poll_timeout(produced))
                self._apply_acks()
                self._settle()
                self._watch()
            except KafkaException as exc:
                error = exc.args[0] if exc.args else None
                if isinstance(error, KafkaError) and error.fatal():
                    self._watchdog.fatal = error  # replaced by the next _watch()
                    continue
                log.exception("sender loop error; retrying")
                self._stop.wait(self._settings.retry_backoff_s)
            except Exception:
                log.exception("sender loop error; retrying")
                self._stop.wait(self._settings.retry_backoff_s)

    def _poll_timeout(self, produced: int) -> float:
        """How long to wait for delivery reports before the next round: none after a
        round of `_SMALL_ROUND` events or more (more is likely waiting), `_BUSY_POLL_S`
        after a smaller one, as librdkafka lingers `linger_ms` (5) before it sends them
        anyway. A sender that went round again at once held the interpreter lock for a
        round per event or two, and the agent's listener waited for it before each
        answer: one caller's round trip took 45-57 us at p50, 17-23 us with the wait (the
        C echo's 10-13 us, on a 2-core VM, in alternating blocks)."""
        now = self._clock.monotonic()
        if produced:
            self._produced_at = now
            return 0.0 if produced >= _SMALL_ROUND else _BUSY_POLL_S
        return _BUSY_POLL_S if now - self._produced_at < _BUSY_FOR_S else _IDLE_POLL_S

    def _watch(self) -> None:
        """Twice a second: replace a broken producer, judge partitions, report stalls."""
        now = self._clock.monotonic()
        if now < self._next_watch and self._watchdog.fatal is None:
            return
        self._next_watch = now + _WATCH_INTERVAL_S
        if not any(
            state.ref.ring.depth
            and not state.parked
            and not self._health.unavailable_for((state.ref.topic, state.partition))
            for state in self._queues.values()
        ):
            self._watchdog.nothing_to_acknowledge(now)
        reason = self._watchdog.reason_to_replace(now, brokers_answer=self.connected)
        if reason is not None:
            self._replace_producer(reason)
        stuck = [
            (state.ref.topic, state.partition)
            for state in self._queues.values()
            if state.tracker.in_flight
            and now - state.waiting_since >= self._settings.partition_stuck_s
        ]
        if self._health.set_stuck(stuck):
            self._next_refresh = 0.0
        self._apply_health()
        if self._settings.keyless_failover_s:
            self._fail_over()
        self._check_stalls(now)

    def _replace_producer(self, reason: str) -> None:
        """Give up on the producer: a new one resends everything not acknowledged.

        The old producer is purged and never polled again, so none of its delivery
        reports reach a queue; what it delivered without reporting comes again.
        """
        self._apply_acks()
        in_flight = sum(state.tracker.in_flight for state in self._queues.values())
        log.error(
            "sender: %s (last error: %s); starting a new producer and resending the %d "
            "events in flight (some may arrive twice)",
            reason,
            self.counters.last_error,
            in_flight,
        )
        self.counters.producer_resets += 1
        self.counters.last_error = reason
        old = self._producer
        with contextlib.suppress(KafkaException):
            old.purge()
        self._producer = Producer(self._producer_config)
        self._metadata = MetadataClient(self._producer, self._admin_config, self._settings)
        for state in self._queues.values():
            state.ref.ring.rewind()
        self._queues.clear()
        self._watchdog.replaced(self._clock.monotonic())
        self._next_refresh = 0.0

    def _apply_health(self) -> None:
        """Tell each topic's partitioner which partitions keyless events may go to."""
        for topic in self._registry.topics():
            count = topic.partition_count
            if count is not None and topic.has_queues:
                available = self._health.available(topic.name, count)
                if available != topic.available:
                    self._registry.set_available_partitions(topic.name, available)

    def _fail_over(self) -> None:
        """Move queued keyless events off partitions unavailable past `keyless_failover_s`,
        and park their queues (failover.py)."""
        for ring, state in list(self._queues.items()):
            unavailable_s = self._health.unavailable_for((state.ref.topic, state.partition))
            step = failover_step(
                unavailable_s=unavailable_s,
                failover_after_s=self._settings.keyless_failover_s,
                depth=ring.depth,
                parked=state.parked,
                moved_until=state.moved_until,
                next_seq=ring.next_seq,
            )
            if step is FailoverStep.RESUME:
                state.parked = False
            if step is not FailoverStep.MOVE:
                continue
            moved = move_keyless(
                self._registry, self._health, state.ref.topic, state.partition, unavailable_s
            )
            if moved is None:
                continue
            parked = QueueState(state.ref, state.partition, self._on_failure)
            parked.parked = True
            parked.moved_until = ring.next_seq
            self._queues[ring] = parked
            if moved:
                self.moves += 1
                self.counters.failover_moved += moved

    def _check_stalls(self, now: float) -> None:
        """Log once when a queue holding events stops advancing, and when it moves again."""
        seen = set()
        for ref in self._registry.refs():
            ring = ref.ring
            if not ring.is_open:
                continue
            seen.add(ring)
            change = self._stalls.observe(ring, ring.head_seq, ring.depth, now)
            if change is StallChange.MOVING_AGAIN:
                log.warning("queue %s/%s is moving again", ref.topic, _name(ref.partition))
            elif change is StallChange.STALLED:
                log.error(
                    "queue %s/%s holds %d events and has not advanced for %.0f s "
                    "(broker connected: %s; last error: %s)",
                    ref.topic,
                    _name(ref.partition),
                    ring.depth,
                    self._stalls.stalled_for(ring, ring.depth, now),
                    "yes" if self.connected else "no",
                    self.counters.last_error,
                )
        self._stalls.keep_only(seen)

    def _refresh_metadata(self) -> None:
        now = self._clock.monotonic()
        if now < self._next_refresh:
            return
        layouts = self._metadata.topics()
        if layouts is None:
            self.connected = False
            self.unreachable = True
            self._next_refresh = now + _UNKNOWN_TOPIC_RETRY_S
            return
        if not self.connected and self._ever_connected:
            self.counters.reconnects += 1
        self.connected = self._ever_connected = True
        self.unreachable = False
        missing = []
        for topic in self._registry.topics():
            if not topic.has_queues:  # being opened, or refused by the disk budget
                continue
            layout = layouts.get(topic.name)
            if layout is None:
                missing.append(topic.name)
                continue
            self._registry.set_partition_count(topic.name, layout.partition_count)
            self._health.set_leaders(topic.name, layout.leaders)
            self._topic_settings.check_once(self._metadata, topic.name, layout.replication)
        self._apply_health()
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
                state = QueueState(ref, ref.partition, self._on_failure)
                self._queues[ref.ring] = state
            if state.tracker.failed or state.parked or now < state.retry_at:
                continue
            room = self._settings.max_in_flight_per_queue - state.tracker.in_flight
            if room <= 0 or not ref.ring.unread:
                continue
            if not state.tracker.in_flight:
                state.waiting_since = now
            batch = ref.ring.read_for_kafka(
                min(room, self._settings.read_batch_records), _READ_BATCH_BYTES
            )
            self._produce_batch(state, batch)
            produced += len(batch)
        return produced

    def _produce_batch(self, state: QueueState, batch: list[KafkaRecord]) -> None:
        """Hand one batch of a queue to librdkafka, in order, in compiled loops.

        Records come out of the queue already decoded, with their `event_id` header first
        (RingCore.read_for_kafka, oldest segment first). A record with no headers is one
        whose envelope could not be parsed: no Kafka message can be made of it, so it is
        dead-lettered as it is.
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

    def _undecodable(self, state: QueueState, seq: int, payload: bytes | None) -> None:
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

    def _produce_retrying(self, state: QueueState, record: KafkaRecord) -> bool:
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
                if error.fatal():
                    self._watchdog.fatal = error
                    state.tracker.failed_transiently()
                elif is_permanent(error):
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

    def _on_failure(self, state: QueueState, seq: int, error: KafkaError, message: Message) -> None:
        """A failed delivery report: dead-letter a permanent failure, rewind otherwise."""
        if is_permanent(error):
            event_id = _as_text(dict(message.headers() or []).get(EVENT_ID_HEADER))
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

    def _settled(self, state: QueueState, seq: int) -> None:
        # A state replaced since (new producer, failover) no longer owns its ring.
        if state.tracker.completed(seq) and self._queues.get(state.ref.ring) is state:
            self._advanced.add(state)

    def _apply_acks(self) -> None:
        """Move read positions once per poll, not once per delivery report."""
        now = self._clock.monotonic()
        for state in self._queues.values():
            deliveries = state.deliveries
            if deliveries.advanced:
                deliveries.advanced = False
                state.backoff_s = 0.0
                state.waiting_since = now
                self._advanced.add(state)
            if deliveries.delivered:
                self.counters.delivered += deliveries.delivered
                deliveries.delivered = 0
                self._watchdog.acknowledged(now)
        for state in self._advanced:
            state.ref.ring.ack(state.tracker.acked_until - 1)
        self._advanced.clear()

    def _dead_letter(
        self,
        state: QueueState,
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
        """Learn which brokers are unreachable and who leads what; count produce requests.

        Runs in poll(), on the sender's thread. A partition newly unavailable asks for a
        metadata refresh at once: the cluster may have elected a new leader.
        """
        view = parse_statistics(text)
        changed = self._health.set_down_brokers(view.down_brokers)
        for topic, leaders in view.leaders.items():
            changed |= self._health.set_leaders(topic, leaders)
        if changed:
            self._next_refresh = 0.0
        self.counters.produce_requests = view.produce_requests

    def _on_error(self, error: KafkaError) -> None:
        self.counters.broker_errors += 1
        self.counters.last_error = str(error)
        if error.fatal():
            self._watchdog.fatal = error
        if error.code() in (KafkaError._ALL_BROKERS_DOWN, KafkaError._TRANSPORT):
            self.connected = False


def _name(partition: int | None) -> str:
    return "pending" if partition is None else str(partition)


def _as_bytes(data: str | bytes | None) -> bytes | None:
    return data.encode() if isinstance(data, str) else data


def _as_text(data: str | bytes | None) -> str | None:
    return data.decode() if isinstance(data, bytes) else data
