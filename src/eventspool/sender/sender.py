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

Nothing wedges. A fatal producer error (librdkafka's idempotent producer gives up for
good, e.g. on a sequence desynchronization after a broker restart), or no acknowledgement
at all for `producer_reset_after_s` while queues of available partitions hold events and
the brokers answer metadata (a broker that lost its state fences the producer: PRODUCER_FENCED,
UNKNOWN_PRODUCER_ID, which librdkafka retries for ever), make the sender drop its
producer, rewind every queue to its acknowledged position and go on with a new one:
events in flight then may arrive twice. Partition health (health.py) steers keyless events away from
partitions without a working leader and moves those already queued there. A queue that
holds events and has not advanced for `stall_after_s` is reported, never silent.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from eventspool._core.native import AckTracker, Deliveries
from eventspool.clock import Clock
from eventspool.config import KafkaConfigValue, SenderSettings
from eventspool.kafkalog import librdkafka_logger
from eventspool.sender.deadletter import DeadLetter, DeadLetterFile
from eventspool.sender.errors import is_permanent
from eventspool.sender.health import PartitionHealth, parse_statistics
from eventspool.sender.metadata import MetadataClient
from eventspool.sender.topicsettings import durability_problems
from eventspool.spool.registry import QueueRef, QueueRegistry
from eventspool.spool.ring import RingQueue

log = logging.getLogger(__name__)

# A round that found nothing to send waits in poll(): briefly while traffic is recent (a
# new event waits at most that long before it is produced), longer once it has stopped.
_BUSY_POLL_S = 0.001
_IDLE_POLL_S = 0.01
_BUSY_FOR_S = 0.2
_UNKNOWN_TOPIC_RETRY_S = 1.0
_ENVELOPE_OVERHEAD = 4096
_READ_BATCH_BYTES = 1 << 20
_WATCH_INTERVAL_S = 0.5
_MAX_RESET_AFTER_S = 300.0

# (sequence, key, value, create time ms, headers); headers None: undecodable payload.
KafkaRecord = tuple[
    int, bytes | None, bytes | None, int, list[tuple[str, str | bytes | None]] | None
]


FailureHandler = Callable[["_QueueState", int, KafkaError, Message], None]


class _QueueState:
    """One queue as the sender sees it; `deliveries` is its delivery-report callback.

    `waiting_since`: when the oldest event in flight was produced, or the prefix last
    grew. `parked`: its keyless events were moved away and nothing is produced from it
    until its partition is available again; `moved_until` is the ring's end at the move.
    """

    __slots__ = (
        "backoff_s",
        "deliveries",
        "moved_until",
        "parked",
        "partition",
        "ref",
        "retry_at",
        "tracker",
        "waiting_since",
    )

    def __init__(self, ref: QueueRef, partition: int, on_failure: FailureHandler) -> None:
        self.ref = ref
        self.partition = partition
        self.tracker = AckTracker(ref.ring.head_seq)
        self.deliveries = Deliveries(self.tracker, functools.partial(on_failure, self))
        self.retry_at = 0.0
        self.backoff_s = 0.0
        self.waiting_since = 0.0
        self.parked = False
        self.moved_until = 0


@dataclass(frozen=True, slots=True)
class StalledQueue:
    """A queue that holds events and has not advanced for `stalled_s` seconds."""

    topic: str
    partition: int | None
    depth: int
    stalled_s: float


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
        self._producer_config: dict[str, object] = {
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
            "logger": librdkafka_logger(),
        }
        self._base_config = base
        self._producer = Producer(self._producer_config)
        self._metadata = MetadataClient(self._producer, base, settings)
        self.dead_letters = DeadLetterFile(directory)
        self.counters = SenderCounters()
        self._queues: dict[RingQueue, _QueueState] = {}
        self._advanced: set[_QueueState] = set()
        self._next_refresh = 0.0
        self._next_watch = 0.0
        self._produced_at = 0.0
        self._health = PartitionHealth(clock)
        self._fatal: KafkaError | None = None
        self._last_ack = clock.monotonic()  # or the last moment there was nothing to ack
        self._reset_after_s = settings.producer_reset_after_s  # doubles while resets fail
        self._progress: dict[RingQueue, tuple[int, float]] = {}
        self._stalled: set[RingQueue] = set()
        self.moves = 0  # failover moves so far: Spool.flush() then looks at the new rings
        # Topics whose settings cannot keep an acknowledged event, with why (topicsettings.py).
        self.topic_warnings: dict[str, list[str]] = {}
        self._settings_checked: set[str] = set()
        self._configs_unreadable_logged = False
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

    # ---- loop -------------------------------------------------------------------

    def stalled_queues(self) -> list[StalledQueue]:
        """Queues holding events that have not advanced for `stall_after_s` or longer."""
        now = self._clock.monotonic()
        stalled = []
        for ref in self._registry.refs():
            mark = self._progress.get(ref.ring)
            if ref.ring in self._stalled and mark is not None and ref.ring.depth:
                stalled.append(
                    StalledQueue(ref.topic, ref.partition, ref.ring.depth, now - mark[1])
                )
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
                    self._fatal = error  # replaced by the next _watch()
                    continue
                log.exception("sender loop error; retrying")
                self._stop.wait(self._settings.retry_backoff_s)
            except Exception:
                log.exception("sender loop error; retrying")
                self._stop.wait(self._settings.retry_backoff_s)

    def _poll_timeout(self, produced: int) -> float:
        now = self._clock.monotonic()
        if produced:
            self._produced_at = now
            return 0.0
        return _BUSY_POLL_S if now - self._produced_at < _BUSY_FOR_S else _IDLE_POLL_S

    def _watch(self) -> None:
        """Twice a second: replace a broken producer, judge partitions, report stalls."""
        now = self._clock.monotonic()
        if now < self._next_watch and self._fatal is None:
            return
        self._next_watch = now + _WATCH_INTERVAL_S
        if not any(
            state.ref.ring.depth
            and not state.parked
            and not self._health.unavailable_for((state.ref.topic, state.partition))
            for state in self._queues.values()
        ):
            self._last_ack = now  # nothing the producer could have delivered
        if self._fatal is not None:
            self._replace_producer(f"fatal producer error: {self._fatal.str()}")
        elif self.connected and now - self._last_ack >= self._reset_after_s:
            self._replace_producer(
                f"no event acknowledged for {now - self._last_ack:.0f} s while the brokers answer"
            )
            # A cluster that is only slow must not see a new producer every few seconds.
            self._reset_after_s = min(self._reset_after_s * 2, _MAX_RESET_AFTER_S)
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
        self._metadata = MetadataClient(self._producer, self._base_config, self._settings)
        for state in self._queues.values():
            state.ref.ring.rewind()
        self._queues.clear()
        self._fatal = None
        self._last_ack = self._clock.monotonic()
        self._next_refresh = 0.0

    def _check_topic_settings(self, topic: str, replication: int) -> None:
        """Once per topic, off the sender's loop (DescribeConfigs may take its timeout):
        warn when the cluster cannot keep what it acknowledges."""
        try:
            configs = self._metadata.topic_configs([topic]).get(topic)
        except KafkaException as exc:
            log.debug("cannot describe topic %s: %s", topic, exc)
            configs = None
        if configs is None and not self._configs_unreadable_logged:
            self._configs_unreadable_logged = True
            log.warning(
                "the brokers do not describe topic settings (DescribeConfigs): "
                "min.insync.replicas and unclean.leader.election.enable are not checked"
            )
        problems = durability_problems(replication, configs)
        if problems:
            self.topic_warnings[topic] = problems
            log.warning(
                "topic %s may lose events the broker acknowledged: %s", topic, "; ".join(problems)
            )

    def _apply_health(self) -> None:
        """Tell each topic's partitioner which partitions keyless events may go to."""
        for topic in self._registry.topics():
            count = topic.partition_count
            if count is not None and topic.has_queues:
                available = self._health.available(topic.name, count)
                if available != topic.available:
                    self._registry.set_available_partitions(topic.name, available)

    def _fail_over(self) -> None:
        """Move queued keyless events off partitions unavailable past `keyless_failover_s`.

        The queue's events in flight stay with librdkafka (it cannot take back one
        partition's) and are delivered when the partition recovers: a keyless one moved
        meanwhile then arrives twice. The queue is parked until then, so its keyed events
        wait on disk, produced once more when it recovers.
        """
        for ring, state in list(self._queues.items()):
            key = (state.ref.topic, state.partition)
            unavailable_s = self._health.unavailable_for(key)
            if not unavailable_s:
                state.parked = False
                continue
            if unavailable_s < self._settings.keyless_failover_s or not ring.depth:
                continue
            if state.parked and ring.next_seq == state.moved_until:
                continue
            topic = self._registry.topic(state.ref.topic)
            if topic.partition_count is None:
                continue
            targets = sorted(self._health.available(topic.name, topic.partition_count))
            if not targets:
                continue
            moved = self._registry.move_keyless(topic.name, state.partition, targets)
            parked = _QueueState(state.ref, state.partition, self._on_failure)
            parked.parked = True
            parked.moved_until = ring.next_seq
            self._queues[ring] = parked
            if moved:
                self.moves += 1
                self.counters.failover_moved += moved
                log.warning(
                    "partition %s/%d has had no available leader for %.0f s: moved its %d "
                    "queued keyless events to partitions %s; its keyed events wait for it",
                    topic.name,
                    state.partition,
                    unavailable_s,
                    moved,
                    targets,
                )

    def _check_stalls(self, now: float) -> None:
        """Log once when a queue holding events stops advancing, and when it moves again."""
        seen = set()
        for ref in self._registry.refs():
            ring = ref.ring
            if not ring.is_open:
                continue
            seen.add(ring)
            head = ring.head_seq
            mark = self._progress.get(ring)
            if not ring.depth or mark is None or mark[0] != head:
                self._progress[ring] = (head, now)
                if ring in self._stalled:
                    self._stalled.discard(ring)
                    log.warning("queue %s/%s is moving again", ref.topic, _name(ref.partition))
                continue
            if ring not in self._stalled and now - mark[1] >= self._settings.stall_after_s:
                self._stalled.add(ring)
                log.error(
                    "queue %s/%s holds %d events and has not advanced for %.0f s "
                    "(broker connected: %s; last error: %s)",
                    ref.topic,
                    _name(ref.partition),
                    ring.depth,
                    now - mark[1],
                    "yes" if self.connected else "no",
                    self.counters.last_error,
                )
        for ring in self._progress.keys() - seen:
            del self._progress[ring]
            self._stalled.discard(ring)

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
            if topic.name not in self._settings_checked:
                self._settings_checked.add(topic.name)
                threading.Thread(
                    target=self._check_topic_settings,
                    args=(topic.name, layout.replication),
                    name="eventspool-topic-settings",
                    daemon=True,
                ).start()
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
                state = _QueueState(ref, ref.partition, self._on_failure)
                self._queues[ref.ring] = state
            if state.tracker.failed or state.parked or now < state.retry_at:
                continue
            room = self._settings.max_in_flight_per_queue - state.tracker.in_flight
            if room <= 0 or not ref.ring.unread:
                continue
            if not state.tracker.in_flight:
                state.waiting_since = now
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
                if error.fatal():
                    self._fatal = error
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
                self._last_ack = now
                self._reset_after_s = self._settings.producer_reset_after_s
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
            self._fatal = error
        if error.code() in (KafkaError._ALL_BROKERS_DOWN, KafkaError._TRANSPORT):
            self.connected = False


def _name(partition: int | None) -> str:
    return "pending" if partition is None else str(partition)


def _as_bytes(data: str | bytes | None) -> bytes | None:
    return data.encode() if isinstance(data, str) else data


def _as_text(data: str | bytes | None) -> str | None:
    return data.decode() if isinstance(data, bytes) else data
