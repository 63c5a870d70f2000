"""The Consumer: one poll thread owns the Kafka consumer, worker processes run handlers.

The poll thread never waits on a handler. It keeps calling `consume()` (librdkafka
counts `max.poll.interval.ms` between those calls, paused or not), hands batches to idle
workers, pauses every assigned partition while `max_buffered` events are held and
resumes below the threshold, and commits per partition only the end of the finished
prefix: asynchronously on the count-or-time threshold, so a broker round trip never
stalls intake, and on revoke and shutdown waiting for the outcome, which must be known
before the partition is let go. Everything that touches consumer state runs on this
one thread, rebalance callbacks included; other threads read a status snapshot it
publishes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import itertools
import logging
import math
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, Any, Self

from confluent_kafka import Consumer as KafkaConsumer
from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition

from eventspool._core.native import decode_records, split_keyed
from eventspool.clock import SYSTEM_CLOCK, Clock
from eventspool.config import validate_topic
from eventspool.consumer.offsets import CommitPolicy, PartitionOffsets
from eventspool.consumer.pool import (
    SKIPPED,
    EventsDone,
    Failure,
    HandlerRef,
    PartWire,
    PoolEvent,
    Progress,
    TaskDone,
    WorkerDied,
    WorkerPool,
    resolve_handler,
)
from eventspool.consumer.record import (
    RawRecord,
    WireRecord,
    wire_from_raw,
    wire_record,
)
from eventspool.consumer.scheduler import (
    Ordering,
    Pending,
    Scheduler,
    TopicPartitionKey,
)
from eventspool.consumer.settings import ConsumerSettings
from eventspool.endoffsets import EndOffsetsError, true_end_offsets
from eventspool.errors import EventspoolError

if TYPE_CHECKING:
    from eventspool._core.native import KeyedRun

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
_IDLE_POLL_S = 0.1
_BUSY_POLL_S = 0.002
# One poll takes at most this many messages, and no more than max_buffered has room for:
# each poll costs the poll thread a step's fixed work and a transfer per worker, which
# polls of 1,000 paid a tenth of its time for; 10,000 were no faster than 5,000.
_MAX_CONSUME = 5000
_REFILL_SHARE = 0.25
_SNAPSHOT_EVERY_S = 0.25
_BATCH_TARGET_S = 0.05
_FORWARD_RETRY_S = 1.0
_COMMITTED_TIMEOUT_S = 10.0
# The final commit at a stop is tried this often, the waits between the tries doubling
# from the backoff: NOT_COORDINATOR and REBALANCE_IN_PROGRESS clear within a second or so
# while a group's coordinator moves. It may take until the shutdown deadline, and at least
# the minimum however much of that the handlers used.
_STOP_COMMIT_ATTEMPTS = 5
_STOP_COMMIT_BACKOFF_S = 0.25
_STOP_COMMIT_MIN_S = 5.0
_LAG_JOIN_S = 1.0
_FORCED_KAFKA = {"enable.auto.commit": False, "enable.auto.offset.store": False}
# librdkafka stops fetching for `fetch.queue.backoff.ms` (default 1 s) once its local queue
# holds `queued.min.messages` of the consumer's partitions together; a consumer that drains
# that queue in under a second would then sit idle for the rest of it.
# Its waits between attempts to reach a broker that refuses connections double up to
# `reconnect.backoff.max.ms` (default 10 s, with up to +50% jitter): a coordinator back
# after a 4 s outage was reached again up to 5.7 s later, one back after a longer outage
# up to 15 s later. 1 s is the Java client's default.
_DEFAULT_KAFKA = {
    "auto.offset.reset": "earliest",
    "fetch.queue.backoff.ms": 100,
    "reconnect.backoff.max.ms": 1000,
}


class ConsumerError(EventspoolError):
    """The consumer cannot start or its poll thread failed."""


@dataclass(slots=True)
class ConsumerCounters:
    """Events by outcome since start. `abandoned` were running at a revoke or shutdown
    and will be delivered again; `dropped` were buffered and will be fetched again."""

    received: int = 0
    processed: int = 0
    failed: int = 0
    retried: int = 0
    dead_lettered: int = 0
    stale: int = 0
    abandoned: int = 0
    dropped: int = 0
    commits: int = 0
    commit_failures: int = 0
    rebalances: int = 0
    worker_restarts: int = 0
    pauses: int = 0


@dataclass(frozen=True, slots=True)
class PartitionStatus:
    topic: str
    partition: int
    position: int | None
    committed: int | None
    end: int | None
    held: int

    @property
    def lag(self) -> int | None:
        """Events not yet finished, from the true end offset."""
        if self.end is None:
            return None
        start = self.position if self.position is not None else self.committed
        return None if start is None else max(self.end - start, 0)


@dataclass(frozen=True, slots=True)
class ConsumerStatus:
    """A snapshot the poll thread publishes every quarter second; `taken_at` is
    `time.monotonic()` when it was taken, so two snapshots give exact rates. `state` is
    created, starting, running, revoking (a rebalance waits for running handlers of the
    partitions it takes away), stopping or stopped. `uncommitted` names the partitions
    (`topic/partition`) whose finished offsets the last commit could not store: retried
    at the next commit while running, delivered again after a stop."""

    group: str
    state: str
    paused: bool
    buffered: int
    waiting: int
    in_flight: int
    oldest_in_flight_s: float | None
    partitions: tuple[PartitionStatus, ...]
    uncommitted: tuple[str, ...]
    counters: ConsumerCounters
    taken_at: float

    @property
    def lag(self) -> int | None:
        lags = [p.lag for p in self.partitions]
        known = [lag for lag in lags if lag is not None]
        return sum(known) if known else None

    def line(self) -> str:
        """One status line, as the CLI prints it."""
        c = self.counters
        lag = "?" if self.lag is None else str(self.lag)
        oldest = "-" if self.oldest_in_flight_s is None else f"{self.oldest_in_flight_s:.1f}s"
        return (
            f"{self.state} group={self.group} partitions={len(self.partitions)} lag={lag} "
            f"buffered={self.buffered} running={self.in_flight} oldest={oldest} "
            f"paused={'yes' if self.paused else 'no'} | received={c.received} "
            f"processed={c.processed} retried={c.retried} dead_lettered={c.dead_lettered} "
            f"stale={c.stale} commits={c.commits} rebalances={c.rebalances} "
            f"worker_restarts={c.worker_restarts}"
            + (f" uncommitted={','.join(self.uncommitted)}" if self.uncommitted else "")
        )


@dataclass(slots=True)
class _PartitionState:
    offsets: PartitionOffsets
    held: int = 0
    active: bool = True
    # The workers were told to drop its events (revoke, shutdown): none is resent.
    dropping: bool = False


@dataclass(slots=True)
class _Task:
    items: list[tuple[_PartitionState, Pending]]
    started: float
    done: set[int] = field(default_factory=set)  # indexes an async worker reported

    def unfinished(self) -> list[tuple[_PartitionState, Pending]]:
        return [item for index, item in enumerate(self.items) if index not in self.done]


@dataclass(slots=True, eq=False)
class _Chunk:
    """Keyed events of one partition from one poll, `left` of them not finished: their
    offsets are one range, finished once all of them are."""

    state: _PartitionState
    first: int
    end: int
    left: int


@dataclass(slots=True, eq=False)
class _Part:
    """A chunk's events for one worker, handed over in one transfer. `attempts` is kept
    once one of them failed (or was resent); `settled` once some were reported one by one.
    `items` stays the packed blob the worker got until a failure or a death needs them."""

    chunk: _Chunk
    worker: int
    topic: str
    partition: int
    items: list[RawRecord] | bytes
    attempts: list[int] | None
    started: float
    left: int
    settled: set[int] = field(default_factory=set)

    def records(self) -> list[RawRecord]:
        if isinstance(self.items, bytes):
            self.items = decode_records(self.items)
        records: list[RawRecord] = self.items
        return records


@dataclass(slots=True)
class _Forward:
    state: _PartitionState
    wire: WireRecord
    target: str
    headers: list[tuple[str, bytes]]
    counter: str
    done: Callable[[], None]
    not_before: float = 0.0


@dataclass(slots=True)
class _Shared:
    """What other threads may read: replaced whole, never mutated."""

    status: ConsumerStatus | None = None
    ends: dict[TopicPartitionKey, int] = field(default_factory=dict)


class Consumer:
    """Consume `topics` in consumer group `group`, running `handler` in worker processes.

    `handler` is `module:function` or a picklable callable taking a `Record`. Delivery is
    at least once: an event is committed only after its handler returned (or it went to
    the stale or dead-letter topic), and duplicates are bounded by `max_buffered`.
    """

    def __init__(
        self,
        group: str,
        topics: Sequence[str],
        handler: HandlerRef,
        *,
        workers: int = 2,
        bootstrap_servers: str = "127.0.0.1:9092",
        settings: ConsumerSettings | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        if not group:
            raise ValueError("a consumer group id is required")
        if isinstance(topics, str) or not topics:
            raise ValueError("topics must be a non-empty list of topic names")
        for topic in topics:
            if not topic.startswith("^"):
                validate_topic(topic)
        if workers < 1:
            raise ValueError(f"workers={workers}: at least one worker is needed")
        resolve_handler(handler)
        self.group = group
        self._topics = list(topics)
        self._handler = handler
        self._workers = workers
        self._bootstrap = bootstrap_servers
        self._settings = settings or ConsumerSettings()
        self._clock = clock
        for name, value in self._settings.kafka.items():
            if name in _FORCED_KAFKA and value != _FORCED_KAFKA[name]:
                raise ValueError(f"kafka {name}={value!r}: eventspool commits offsets itself")
        self._scheduler = Scheduler(self._settings.ordering)
        self._policy = CommitPolicy(
            self._settings.commit_every_n, self._settings.commit_every_s, clock
        )
        self._partitions: dict[TopicPartitionKey, _PartitionState] = {}
        self._tasks: dict[int, _Task] = {}
        self._task_ids = itertools.count()
        self._keyed = self._settings.ordering is Ordering.KEY
        self._parts: dict[int, _Part] = {}
        self._next_part = 0
        self._forwards: list[_Forward] = []
        self._counters = ConsumerCounters()
        self._commits_in_flight = 0
        # Partitions whose acknowledged offset a late answer to an older commit came after.
        self._overtaken: set[TopicPartitionKey] = set()
        self._commit_errors: dict[TopicPartitionKey, str] = {}
        self._held = 0
        self._paused = False
        self._full_since: float | None = None
        self._event_seconds: float | None = None
        self._state = "created"
        self._shared = _Shared()
        self._next_snapshot = 0.0
        self._stop_requested = threading.Event()
        self._stopped = threading.Event()
        self._lag_wakeup = threading.Event()
        self._failure: BaseException | None = None
        self._kafka: Any = None
        self._producer: Any = None
        self._pool: WorkerPool | None = None
        self._threads: list[threading.Thread] = []
        self._publish_status(force=True)

    # ----------------------------------------------------------------- lifecycle

    def start(self) -> None:
        """Start the worker pool, join the group and begin consuming in the background."""
        if self._state != "created":
            raise ConsumerError(f"consumer is {self._state}; a Consumer starts once")
        self._state = "starting"
        self._pool = WorkerPool(
            self._workers,
            self._handler,
            self._settings.ordering,
            self._settings.start_method,
            concurrency=self._settings.concurrency,
            retry=self._settings.retry,
        )
        try:
            self._kafka = KafkaConsumer(self._kafka_config())
            self._kafka.subscribe(
                self._topics,
                on_assign=self._on_assign,
                on_revoke=self._on_revoke,
                on_lost=self._on_lost,
            )
        except KafkaException as exc:
            self._pool.stop()
            raise ConsumerError(f"cannot start consumer group {self.group!r}: {exc}") from exc
        self._state = "running"
        self._publish_status(force=True)
        for target, name in ((self._poll_loop, "poll"), (self._lag_loop, "lag")):
            thread = threading.Thread(target=target, name=f"eventspool-consumer-{name}")
            thread.daemon = True
            thread.start()
            self._threads.append(thread)

    def _kafka_config(self) -> dict[str, Any]:
        return {
            "bootstrap.servers": self._bootstrap,
            "group.id": self.group,
            **_DEFAULT_KAFKA,
            **self._settings.kafka,
            **_FORCED_KAFKA,
            "on_commit": self._on_commit,
        }

    def request_stop(self) -> None:
        """Ask the poll thread to stop; safe from a signal handler or any thread."""
        self._stop_requested.set()
        self._lag_wakeup.set()

    def stop(self, timeout: float | None = None) -> ConsumerStatus:
        """Stop taking events, let running handlers finish (up to `shutdown_timeout_s`),
        commit what is done and leave the group. The status returned names in
        `uncommitted` the partitions whose finished offsets could not be committed."""
        self.request_stop()
        return self.join(timeout)

    def join(self, timeout: float | None = None) -> ConsumerStatus:
        """Wait for the poll thread, which commits and leaves the group, and briefly for
        the lag thread: an end-offset probe takes milliseconds, but runs to its timeout
        (10 s) against a partition leader that does not answer, and only the status's
        end offsets depend on it."""
        if self._threads:
            poll, lag = self._threads
            poll.join(timeout)
            lag.join(_LAG_JOIN_S)
        if self._failure is not None:
            raise ConsumerError(f"consumer poll thread failed: {self._failure}") from self._failure
        return self.status()

    def run(self) -> ConsumerStatus:
        """Start and block until SIGTERM or SIGINT (in the main thread) or `request_stop()`."""
        previous: dict[signal.Signals, Any] = {}
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGTERM, signal.SIGINT):
                previous[signum] = signal.signal(signum, self._on_signal)
        try:
            self.start()
            while not self._stopped.wait(0.5):
                pass
            return self.join()
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        log.info("signal %d: stopping consumer group %s", signum, self.group)
        self.request_stop()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def status(self) -> ConsumerStatus:
        status = self._shared.status
        assert status is not None  # published from __init__ on
        return status

    def worker_pids(self) -> list[int | None]:
        """Process ids of the workers (a test or an operator may want to signal one)."""
        return self._pool.pids() if self._pool else []

    # ----------------------------------------------------------------- poll thread

    def _poll_loop(self) -> None:
        try:
            while not self._stop_requested.is_set():
                self._step()
            self._shutdown()
        except BaseException as exc:
            log.exception("consumer group %s: poll thread failed", self.group)
            self._failure = exc
            self._abort()
        finally:
            self._state = "stopped"
            self._publish_status(force=True)
            self._stopped.set()
            self._lag_wakeup.set()

    def _step(self) -> None:
        self._handle_pool_events(self._pool_events(0))
        self._dispatch()
        if self._hold_intake():
            self._handle_pool_events(self._pool_events(_BUSY_POLL_S))
        else:
            busy = bool(self._tasks or self._parts or self._scheduler.waiting or self._forwards)
            limit = self._settings.max_buffered
            if self._parts and limit - self._held < limit * _REFILL_SHARE:
                # Nearly full: let the workers' next reports free room first, so this
                # poll takes a batch, not a trickle that costs a step and a transfer.
                self._handle_pool_events(self._pool_events(_BUSY_POLL_S))
            budget = max(1, min(_MAX_CONSUME, limit - self._held))
            with _collector_paused():
                self._take_in(self._kafka.consume(budget, _BUSY_POLL_S if busy else _IDLE_POLL_S))
            self._dispatch()
        self._service_forwards()
        if self._policy.due():
            self._commit(list(self._partitions.items()), wait=False)
        self._publish_status()

    def _pool_events(self, timeout: float) -> list[PoolEvent]:
        assert self._pool is not None
        return self._pool.collect(timeout)

    def _take_in(self, messages: list[Any]) -> None:
        """Take in one poll's messages. Under `key` ordering a keyed event goes straight
        to the worker of its key, which keeps the key's order and retries it itself; a
        poll's keyed events of one partition form chunks (up to a batch each), each
        accounted as one offset range, and each worker gets its share of them all in one
        transfer. Keyless events, and every event under the other orderings, go through
        the scheduler."""
        if not self._keyed:
            for message in messages:
                self._intake(message)
            return
        assert self._pool is not None
        workers = self._pool.size
        transfers: list[list[PartWire]] = [[] for _ in range(workers)]
        counts = [0] * workers
        max_age = self._settings.max_age_s
        oldest_ms = None if max_age is None else self._clock.now_ms() - max_age * 1000
        ends = {key: state.offsets.received_end for key, state in self._partitions.items()}
        cap = self._batch_for_handler_time()
        for item in split_keyed(messages, workers, cap, ends, oldest_ms):
            if type(item) is tuple:
                self._hand_over(item, transfers, counts)
            else:  # keyless, or an error
                self._intake(item)
        for worker, parts in enumerate(transfers):
            if parts:
                self._pool.send_parts(worker, parts, counts[worker])

    def _hand_over(self, run: KeyedRun, transfers: list[list[PartWire]], counts: list[int]) -> None:
        topic, partition, first, end, count, blobs, stale = run
        state = self._partitions[(topic, partition)]
        state.offsets.add_range(first, end)
        state.held += count
        self._held += count
        self._counters.received += count
        chunk = _Chunk(state, first, end, count)
        now = time.monotonic()
        for worker, packed in enumerate(blobs):
            if packed is not None:
                blob, events = packed
                part_id = self._new_part_id()
                self._parts[part_id] = _Part(
                    chunk, worker, topic, partition, blob, None, now, events
                )
                transfers[worker].append((part_id, topic, partition, blob, None))
                counts[worker] += events
        for raw in stale:
            wire = wire_from_raw(topic, partition, raw)
            self._drop_stale(state, wire, functools.partial(self._settle_chunk, chunk, 1))

    def _new_part_id(self) -> int:
        part_id = self._next_part
        self._next_part += 1
        return part_id

    def _intake(self, message: Any) -> None:
        error = message.error()
        if error is not None:
            if error.code() != KafkaError._PARTITION_EOF:
                log.warning("consumer group %s: %s", self.group, error)
            return
        wire = wire_record(message)
        state = self._partitions.get((wire[0], wire[1]))
        if state is None or not state.offsets.add(wire[2]):
            return
        state.held += 1
        self._held += 1
        self._counters.received += 1
        self._scheduler.add(wire)

    def _dispatch(self) -> None:
        if self._stop_requested.is_set() or not self._scheduler.waiting:
            return
        assert self._pool is not None
        idle = self._pool.idle()
        if not idle:
            return
        now = self._clock.monotonic()
        per_worker = min(
            self._settings.max_batch,
            math.ceil(self._scheduler.waiting / len(idle)),
            self._batch_for_handler_time(),
        )
        for index in idle:
            batch = self._scheduler.take(min(per_worker, self._pool.room(index)), now)
            if not batch:
                return
            items: list[tuple[_PartitionState, Pending]] = []
            for pending in batch:
                state = self._partitions[(pending.wire[0], pending.wire[1])]
                if self._is_stale(pending):
                    self._scheduler.release(pending)
                    self._drop_stale(
                        state, pending.wire, functools.partial(self._finish, state, pending)
                    )
                else:
                    items.append((state, pending))
            if items:
                task_id = next(self._task_ids)
                self._tasks[task_id] = _Task(items, time.monotonic())
                self._pool.submit(index, task_id, [(p.wire, p.attempt) for _, p in items])

    def _batch_for_handler_time(self) -> int:
        """Events per batch so that a batch takes about `_BATCH_TARGET_S`: fast handlers
        get big batches (one pipe round trip for many events), slow ones single events,
        so a finished event is reported (and committable) soon after it finished. An
        async worker reports each event as it finishes, so its batches fill its slots."""
        assert self._pool is not None
        if self._pool.concurrent:
            return self._settings.max_batch
        if self._event_seconds is None:
            return 1
        return max(1, int(_BATCH_TARGET_S / max(self._event_seconds, 1e-9)))

    def _learn_handler_time(self, task: _Task) -> None:
        self._learn_event_seconds((time.monotonic() - task.started) / len(task.items))

    def _learn_event_seconds(self, per_event: float) -> None:
        previous = self._event_seconds
        self._event_seconds = per_event if previous is None else 0.8 * previous + 0.2 * per_event

    def _is_stale(self, pending: Pending) -> bool:
        max_age = self._settings.max_age_s
        created = pending.wire[6]
        return (
            max_age is not None
            and created is not None
            and self._clock.now_ms() - created > max_age * 1000
        )

    def _handle_pool_events(self, events: Iterable[PoolEvent]) -> None:
        for event in events:
            if isinstance(event, TaskDone):
                task = self._tasks.pop(event.task_id)
                self._learn_handler_time(task)
                failures = event.failures or {}
                for index, (state, pending) in enumerate(task.items):
                    self._settle(state, pending, failures.get(index))
            elif isinstance(event, EventsDone):
                self._events_done(event)
            elif isinstance(event, Progress):
                self._progress(event)
            else:
                self._worker_died(event)

    def _settle(self, state: _PartitionState, pending: Pending, failure: Failure | None) -> None:
        """One event's batch ended for it: done, back in line (SKIPPED), or failed."""
        self._scheduler.release(pending)
        if failure is None:
            self._counters.processed += 1
            self._finish(state, pending)
        elif failure == SKIPPED:
            self._requeue(state, pending)
        else:
            self._failed(state, pending, failure)

    def _events_done(self, event: EventsDone) -> None:
        for task_id, index, failure in event.events:
            task = self._tasks.get(task_id)
            if task is None:  # abandoned at a shutdown
                continue
            task.done.add(index)
            state, pending = task.items[index]
            self._settle(state, pending, failure)
            if len(task.done) == len(task.items):
                del self._tasks[task_id]

    def _progress(self, progress: Progress) -> None:
        """A worker's report on its parts: failures first, so that a part's `None`
        (everything not reported before) counts only what finished."""
        parts = self._parts
        for part_id, index, attempt, failure, gave_up in progress.failures:
            part = parts.get(part_id)
            if part is None:  # revoked, or abandoned at a shutdown
                continue
            state = part.chunk.state
            raw = part.records()[index]
            self._log_failure(part.topic, part.partition, raw[0], attempt, failure)
            if gave_up:
                self._part_settled(part_id, part, [index], 1)
                if state.active:
                    wire = wire_from_raw(part.topic, part.partition, raw)
                    done = functools.partial(self._settle_chunk, part.chunk, 1)
                    self._dead_letter(state, wire, attempt, failure, done)
            else:
                self._counters.retried += 1
                if part.attempts is None:
                    part.attempts = [1] * len(part.records())
                part.attempts[index] = attempt + 1
        for part_id, indexes in progress.dropped:
            part = parts.get(part_id)
            if part is None:
                continue
            self._part_settled(part_id, part, indexes, len(indexes))
            if part.chunk.state.active:
                self._release_held(part.chunk.state, len(indexes))
                self._counters.dropped += len(indexes)
        for part_id, finished in progress.finished:
            part = parts.get(part_id)
            if part is None:
                continue
            count = part.left if finished is None else len(finished)
            self._part_settled(part_id, part, finished, count)
            self._counters.processed += count
            self._settle_chunk(part.chunk, count)
        if progress.handled:
            self._learn_event_seconds(progress.busy_s / progress.handled)

    def _part_settled(
        self, part_id: int, part: _Part, indexes: list[int] | None, count: int
    ) -> None:
        part.left -= count
        if not part.left:
            del self._parts[part_id]
        elif indexes is not None:
            part.settled.update(indexes)

    def _settle_chunk(self, chunk: _Chunk, count: int) -> None:
        """`count` events of the chunk finished: once all did, so did its offset range."""
        state = chunk.state
        if not state.active:
            return
        state.held -= count
        self._held -= count
        self._policy.finished(count)
        chunk.left -= count
        if not chunk.left:
            state.offsets.finish(chunk.first, chunk.end)

    def _worker_died(self, event: WorkerDied) -> None:
        self._counters.worker_restarts += 1
        log.warning(
            "consumer group %s: worker died (exit code %s); replaced", self.group, event.exitcode
        )
        died = ("WorkerDied", f"worker process died (exit code {event.exitcode})", "")
        for task_id in event.tasks:  # an async worker: what it did not report is retried
            task = self._tasks.pop(task_id, None)
            for state, pending in task.unfinished() if task is not None else ():
                self._scheduler.release(pending)
                self._failed(state, pending, died)
        if event.task_id is not None:
            self._sequential_worker_died(event.task_id, event.index, died)
        self._parts_died(event.worker, died)

    def _parts_died(self, worker: int, died: Failure) -> None:
        """Every event of the dead worker's parts that it did not report failed: those
        with attempts left go to its replacement in their order, which retries them."""
        resend: list[PartWire] = []
        for part_id, part in [(i, p) for i, p in self._parts.items() if p.worker == worker]:
            del self._parts[part_id]
            state = part.chunk.state
            items: list[RawRecord] = []
            attempts: list[int] = []
            for index, raw in enumerate(part.records()):
                if index in part.settled:
                    continue
                if state.active and state.dropping:  # its next owner runs it, not a replacement
                    self._release_held(state, 1)
                    self._counters.abandoned += 1
                    continue
                attempt = part.attempts[index] if part.attempts else 1
                self._log_failure(part.topic, part.partition, raw[0], attempt, died)
                if not state.active:
                    continue
                if attempt >= self._settings.max_attempts:
                    wire = wire_from_raw(part.topic, part.partition, raw)
                    done = functools.partial(self._settle_chunk, part.chunk, 1)
                    self._dead_letter(state, wire, attempt, died, done)
                else:
                    self._counters.retried += 1
                    items.append(raw)
                    attempts.append(attempt + 1)
            if items:
                new_id = self._new_part_id()
                self._parts[new_id] = _Part(
                    part.chunk,
                    worker,
                    part.topic,
                    part.partition,
                    items,
                    attempts,
                    time.monotonic(),
                    len(items),
                )
                resend.append((new_id, part.topic, part.partition, items, attempts))
        if resend:
            assert self._pool is not None
            self._pool.send_parts(worker, resend, sum(len(part[3]) for part in resend))

    def _sequential_worker_died(self, task_id: int, running: int, died: Failure) -> None:
        """Events before `running` finished, the one at it failed, the rest never ran."""
        task = self._tasks.pop(task_id)
        for index, (state, pending) in enumerate(task.items):
            self._scheduler.release(pending)
            if index < running:
                self._counters.processed += 1
                self._finish(state, pending)
            elif index == running:
                self._failed(state, pending, died)
            else:
                self._requeue(state, pending)

    def _finish(self, state: _PartitionState, pending: Pending) -> None:
        if not state.active:
            return
        state.offsets.finish(pending.offset)
        state.held -= 1
        self._held -= 1
        self._policy.finished()

    def _requeue(self, state: _PartitionState, pending: Pending) -> None:
        if state.active:
            self._scheduler.put_back(pending)

    def _failed(self, state: _PartitionState, pending: Pending, failure: Failure) -> None:
        wire = pending.wire
        self._log_failure(wire[0], wire[1], pending.offset, pending.attempt, failure)
        if not state.active:
            return
        if pending.attempt >= self._settings.max_attempts:
            done = functools.partial(self._finish, state, pending)
            self._dead_letter(state, wire, pending.attempt, failure, done)
            return
        pending.not_before = self._clock.monotonic() + self._settings.retry_delay(pending.attempt)
        pending.attempt += 1
        self._counters.retried += 1
        self._scheduler.put_back(pending)

    def _log_failure(
        self, topic: str, partition: int, offset: int, attempt: int, failure: Failure
    ) -> None:
        """One line per failed attempt; the first also carries the handler's traceback,
        which would otherwise be found only in the dead-letter topic's headers."""
        self._counters.failed += 1
        error_type, message, trace = failure
        log.warning(
            "consumer group %s: handler failed on %s/%d@%d (attempt %d): %s: %s%s",
            self.group,
            topic,
            partition,
            offset,
            attempt,
            error_type,
            message,
            f"\n{trace.rstrip()}" if attempt == 1 and trace else "",
        )

    # ----------------------------------------------------------------- forwarding

    def _dead_letter(
        self,
        state: _PartitionState,
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
        self._forwards.append(_Forward(state, wire, target, headers, "dead_lettered", done))

    def _drop_stale(
        self, state: _PartitionState, wire: WireRecord, done: Callable[[], None]
    ) -> None:
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
        self._forwards.append(_Forward(state, wire, target, headers, "stale", done))

    def _service_forwards(self) -> None:
        """Produce queued dead letters and stale events; each counts as finished only
        once the broker acknowledged it, so a crash before that redelivers it."""
        if self._producer is not None:
            self._producer.poll(0)
        if not self._forwards:
            return
        now = time.monotonic()
        due = [f for f in self._forwards if f.not_before <= now]
        if not due:
            return
        self._forwards = [f for f in self._forwards if f.not_before > now]
        producer = self._forwarder()
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
                on_delivery=self._forward_callback(forward),
            )
        producer.poll(0)

    def _forward_callback(self, forward: _Forward) -> Callable[[Any, Any], None]:
        def delivered(error: Any, _message: Any) -> None:
            if error is not None:
                log.warning(
                    "consumer group %s: cannot write to %s (%s); retrying",
                    self.group,
                    forward.target,
                    error,
                )
                forward.not_before = time.monotonic() + _FORWARD_RETRY_S
                self._forwards.append(forward)
                return
            setattr(self._counters, forward.counter, getattr(self._counters, forward.counter) + 1)
            forward.done()

        return delivered

    def _forwarder(self) -> Any:
        if self._producer is None:
            self._producer = Producer(
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

    # ----------------------------------------------------------------- offsets

    def _commit(
        self, states: Iterable[tuple[TopicPartitionKey, _PartitionState]], *, wait: bool = True
    ) -> None:
        """Commit the finished prefix of each partition. Without `wait` the outcome comes
        to `_on_commit` from a later consume() on this thread."""
        offsets: list[TopicPartition] = []
        for key, state in states:
            offset = self._to_commit(key, state)
            if offset is not None and state.active:
                offsets.append(TopicPartition(key[0], key[1], offset))
        self._policy.committed()
        if not offsets:
            return
        try:
            results = self._kafka.commit(offsets=offsets, asynchronous=not wait)
        except KafkaException as exc:
            self._commits_failed({(tp.topic, tp.partition): _reason(exc) for tp in offsets})
            return
        if wait:
            self._commit_done(None, results or ())
        else:
            self._commits_in_flight += 1

    def _to_commit(self, key: TopicPartitionKey, state: _PartitionState) -> int | None:
        """The offset to commit: the end of the finished prefix if it moved on, else the
        acknowledged offset again if an older commit was answered after it."""
        offset = state.offsets.committable()
        if offset is None and key in self._overtaken:
            return state.offsets.committed
        return offset

    def _on_commit(self, error: KafkaError | None, partitions: list[TopicPartition]) -> None:
        """librdkafka's report of an asynchronous commit (blocking ones are not reported
        here; `_commit` settles those itself)."""
        self._commits_in_flight -= 1
        self._commit_done(error, partitions)

    def _commit_done(self, error: KafkaError | None, results: Iterable[TopicPartition]) -> None:
        failed: dict[TopicPartitionKey, str] = {}
        for result in results:
            key = (result.topic, result.partition)
            state = self._partitions.get(key)
            if state is None:
                continue
            problem = result.error or error
            if problem is not None and problem.code() != KafkaError._NO_OFFSET:
                failed[key] = problem.str()
            elif result.offset >= 0:
                self._acknowledged(key, state, result.offset)
        self._counters.commits += 1
        if failed:
            self._commits_failed(failed)

    def _acknowledged(self, key: TopicPartitionKey, state: _PartitionState, offset: int) -> None:
        """The broker stored `offset`. librdkafka retries a commit that met NOT_COORDINATOR
        once it found the coordinator again, after commits sent later, and answers them in
        the order the broker stored them: an answer behind one before it means the broker
        may hold that older offset now. Taking the furthest answer for the stored offset
        left groups committed thousands of events short for good; such a partition is
        committed again at the next opportunity."""
        committed = state.offsets.committed
        if committed is not None and offset < committed:
            self._overtaken.add(key)
            self._policy.retry()
        else:
            self._overtaken.discard(key)
        state.offsets.mark_committed(offset)
        self._commit_errors.pop(key, None)

    def _commits_failed(self, reasons: dict[TopicPartitionKey, str]) -> None:
        """One line per failed commit; while stopping, the stop's own report of what it
        could not commit is the warning."""
        log.log(
            logging.INFO if self._state == "stopping" else logging.WARNING,
            "consumer group %s: commit of %s failed: %s",
            self.group,
            ", ".join(f"{topic}/{partition}" for topic, partition in reasons),
            "; ".join(sorted(set(reasons.values()))),
        )
        for key, reason in reasons.items():
            self._commit_failed(key, reason)

    def _commit_failed(self, key: TopicPartitionKey, reason: str) -> None:
        """Retry the commit after the interval; drop the partition's waiting events and
        fetch them again: the partition may have moved to another member, whose work they
        would duplicate."""
        self._counters.commit_failures += 1
        self._commit_errors[key] = reason
        self._policy.retry()
        state = self._partitions.get(key)
        dropped = self._scheduler.drop_partition(key)
        if state is None or not dropped:
            return
        self._release_held(state, len(dropped))
        self._counters.dropped += len(dropped)
        first = min(p.offset for p in dropped)
        state.offsets.forget_from(first)
        try:
            self._kafka.seek(TopicPartition(key[0], key[1], first))
        except KafkaException as exc:
            log.warning("consumer group %s: cannot seek %s back: %s", self.group, key, exc)

    def _release_held(self, state: _PartitionState, count: int) -> None:
        state.held -= count
        self._held -= count

    def _hold_intake(self) -> bool:
        """Back-pressure: True while this step must not call consume().

        A full buffer first gets `pause_grace_s` to drain without a pause, because pausing
        throws away what librdkafka prefetched and a resumed partition fetches again only
        after up to a second; a buffer that stays full is paused, and consume() goes on
        (returning nothing) so the member stays in its group however long handlers take.
        """
        limit = self._settings.max_buffered
        if self._paused:
            if self._held <= limit * self._settings.resume_fraction:
                self._set_paused(False)
            return False
        if self._held < limit:
            self._full_since = None
            return False
        now = time.monotonic()
        if self._full_since is None:
            self._full_since = now
        if now - self._full_since < self._settings.pause_grace_s:
            return True
        self._full_since = None
        self._set_paused(True)
        return False

    def _set_paused(self, paused: bool) -> None:
        assignment = self._kafka.assignment()
        if assignment:
            (self._kafka.pause if paused else self._kafka.resume)(assignment)
        self._paused = paused
        self._counters.pauses += paused

    # ----------------------------------------------------------------- rebalances

    def _on_assign(self, kafka: Any, partitions: list[TopicPartition]) -> None:
        self._counters.rebalances += 1
        try:
            committed = kafka.committed(partitions, timeout=_COMMITTED_TIMEOUT_S)
        except KafkaException as exc:
            log.warning("consumer group %s: cannot read committed offsets: %s", self.group, exc)
            committed = [TopicPartition(tp.topic, tp.partition) for tp in partitions]
        for tp in committed:
            start = tp.offset if tp.offset >= 0 else None
            self._partitions[(tp.topic, tp.partition)] = _PartitionState(PartitionOffsets(start))
        # librdkafka keeps a partition paused through its revocation and a new assignment:
        # one taken away while paused and given back after the pause ended was never
        # fetched again. The pause is ours, so each assignment gets it as it stands.
        (kafka.pause if self._paused else kafka.resume)(partitions)
        log.info("consumer group %s: assigned %s", self.group, _names(partitions))
        self._publish_status(force=True)
        self._lag_wakeup.set()

    def _on_revoke(self, kafka: Any, partitions: list[TopicPartition]) -> None:
        self._release_partitions(partitions, commit=True)

    def _on_lost(self, kafka: Any, partitions: list[TopicPartition]) -> None:
        self._release_partitions(partitions, commit=False)

    def _release_partitions(self, partitions: list[TopicPartition], *, commit: bool) -> None:
        """Drop waiting events, give running ones `revoke_timeout_s` to finish, commit
        what is done, and forget the rest: the next owner redelivers it."""
        keys = [(tp.topic, tp.partition) for tp in partitions]
        states = {key: self._partitions[key] for key in keys if key in self._partitions}
        self._drop_waiting(states)
        self._drop_parts(states)
        if commit:
            previous = self._state
            if previous == "running":
                self._state = "revoking"
                self._publish_status(force=True)
            try:
                deadline = time.monotonic() + self._settings.revoke_timeout_s
                while self._running_on(states.values()) and time.monotonic() < deadline:
                    self._handle_pool_events(self._pool_events(0.05))
                self._drop_waiting(states)
                self._commit(states.items())
            finally:
                self._state = previous
        for key, state in states.items():
            state.active = False
            self._release_commit_state(key, state, lost=not commit)
            self._counters.abandoned += state.held
            self._held -= state.held
            del self._partitions[key]
        self._forwards = [f for f in self._forwards if f.state.active]
        self._parts = {i: p for i, p in self._parts.items() if p.chunk.state.active}
        log.info(
            "consumer group %s: %s %s",
            self.group,
            "revoked" if commit else "lost",
            _names(partitions),
        )
        self._publish_status(force=True)

    def _release_commit_state(
        self, key: TopicPartitionKey, state: _PartitionState, *, lost: bool
    ) -> None:
        """A partition let go while running is the next owner's to commit; one let go
        while stopping with finished offsets not committed stays in `uncommitted`."""
        if self._state != "stopping" or self._to_commit(key, state) is None:
            self._commit_errors.pop(key, None)
        elif lost:
            self._commit_errors[key] = "the partition was lost with the group membership"
        self._overtaken.discard(key)

    def _drop_waiting(self, states: dict[TopicPartitionKey, _PartitionState]) -> None:
        for key, state in states.items():
            dropped = len(self._scheduler.drop_partition(key))
            self._release_held(state, dropped)
            self._counters.dropped += dropped

    def _drop_parts(self, states: dict[TopicPartitionKey, _PartitionState]) -> None:
        """Have the workers drop the events they hold of these partitions (each reports
        them as dropped), so only the ones running need to finish."""
        for state in states.values():
            state.dropping = True
        wanted = {id(state) for state in states.values()}
        if any(id(part.chunk.state) in wanted for part in self._parts.values()):
            assert self._pool is not None
            self._pool.drop(dict.fromkeys(states, self._next_part - 1))

    def _running_on(self, states: Iterable[_PartitionState]) -> bool:
        wanted = {id(state) for state in states}
        return any(
            id(s) in wanted for task in self._tasks.values() for s, _ in task.unfinished()
        ) or any(id(part.chunk.state) in wanted for part in self._parts.values())

    # ----------------------------------------------------------------- shutdown

    def _shutdown(self) -> None:
        self._state = "stopping"
        self._publish_status(force=True)
        assignment = self._kafka.assignment()
        if assignment:
            self._kafka.pause(assignment)
        self._drop_waiting(dict(self._partitions))
        self._drop_parts(self._partitions)
        deadline = time.monotonic() + self._settings.shutdown_timeout_s
        while (self._tasks or self._parts or self._forwards) and time.monotonic() < deadline:
            self._handle_pool_events(self._pool_events(0.05))
            self._service_forwards()
            # Keep the membership alive; anything fetched now is not taken.
            self._kafka.consume(1, 0)
            self._publish_status()
        abandoned = sum(len(task.unfinished()) for task in self._tasks.values())
        abandoned += sum(part.left for part in self._parts.values())
        if abandoned:
            log.warning("consumer group %s: abandoned %d running events", self.group, abandoned)
        self._counters.abandoned += abandoned
        self._tasks.clear()
        self._parts.clear()
        assert self._pool is not None
        self._pool.stop()
        if self._producer is not None:
            self._producer.flush(max(deadline - time.monotonic(), 1.0))
        self._commit_at_stop(max(deadline, time.monotonic() + _STOP_COMMIT_MIN_S))
        # close() revokes them: their commit is settled, and a blocking one there could
        # wait out session.timeout.ms for a coordinator that is gone.
        self._partitions.clear()
        self._kafka.close()

    def _commit_at_stop(self, deadline: float) -> None:
        """Commit every finished offset, trying again with a backoff while it fails. Each
        try is asynchronous and its answer awaited to `deadline` (a blocking commit waits
        for a missing coordinator as long as librdkafka likes); the partitions left are
        logged and published as `uncommitted`."""
        backoff = _STOP_COMMIT_BACKOFF_S
        for attempt in range(_STOP_COMMIT_ATTEMPTS + 1):
            self._serve_kafka(deadline, lambda: not self._commits_in_flight)
            if self._commits_in_flight or attempt == _STOP_COMMIT_ATTEMPTS:
                break
            if not any(self._to_commit(k, s) is not None for k, s in self._partitions.items()):
                break
            if attempt:
                self._serve_kafka(min(time.monotonic() + backoff, deadline), lambda: False)
                backoff *= 2
            if time.monotonic() >= deadline:
                break
            self._commit(list(self._partitions.items()), wait=False)
        unanswered = self._commits_in_flight > 0
        for key, state in self._partitions.items():
            if self._to_commit(key, state) is not None:
                self._commit_errors[key] = (
                    "no answer before the stop deadline"
                    if unanswered
                    else self._commit_errors.get(key, "no time left before the stop deadline")
                )
        if self._commit_errors:
            log.warning(
                "consumer group %s: could not commit %s; their events after the committed "
                "offsets will be delivered again",
                self.group,
                ", ".join(
                    f"{t}/{p} ({why})" for (t, p), why in sorted(self._commit_errors.items())
                ),
            )

    def _serve_kafka(self, until: float, done: Callable[[], bool]) -> None:
        """Let librdkafka report commits and rebalances until `done()` or `until`; this
        keeps the membership alive too. Anything fetched now is not taken."""
        while not done() and (left := until - time.monotonic()) > 0:
            self._kafka.consume(1, min(left, _IDLE_POLL_S))

    def _abort(self) -> None:
        """After a failure: stop the workers and leave the group, committing nothing. The
        revoke callback that close() runs meets the workers' closed pipes (OSError); the
        failure that brought us here is the one to report."""
        if self._pool is not None:
            self._pool.stop(timeout=1.0)
        if self._kafka is not None:
            with contextlib.suppress(KafkaException, RuntimeError, OSError):
                self._kafka.close()

    # ----------------------------------------------------------------- visibility

    def _publish_status(self, force: bool = False) -> None:
        now = time.monotonic()
        published = self._shared.status
        # The moment the last held event settles is published at once, not up to a
        # snapshot period later: whoever waits for the consumer to catch up (a drain, a
        # test, a benchmark's clock) sees it when it happens.
        drained = not self._held and published is not None and published.buffered > 0
        if not force and not drained and now < self._next_snapshot:
            return
        self._next_snapshot = now + _SNAPSHOT_EVERY_S
        ends = self._shared.ends
        partitions = tuple(
            PartitionStatus(
                key[0],
                key[1],
                state.offsets.position,
                state.offsets.committed,
                ends.get(key),
                state.held,
            )
            for key, state in sorted(self._partitions.items())
        )
        starts = [task.started for task in self._tasks.values()]
        starts += [part.started for part in self._parts.values()]
        self._shared.status = ConsumerStatus(
            group=self.group,
            state=self._state,
            paused=self._paused,
            buffered=self._held,
            waiting=self._scheduler.waiting,
            in_flight=sum(len(task.items) - len(task.done) for task in self._tasks.values())
            + sum(part.left for part in self._parts.values()),
            oldest_in_flight_s=now - min(starts) if starts else None,
            partitions=partitions,
            uncommitted=tuple(
                f"{topic}/{partition}" for topic, partition in sorted(self._commit_errors)
            ),
            counters=dataclasses.replace(self._counters),
            taken_at=now,
        )

    def _lag_loop(self) -> None:
        """Measure true end offsets on a timer, off the poll thread: the probe may take a
        fetch round trip per partition, which the poll loop must never wait for. A stop
        ends it without another probe: one against a partition leader that does not
        answer runs to its timeout (10 s), long after the consumer stopped."""
        kafka = {**self._settings.kafka, "bootstrap.servers": self._bootstrap}
        while not self._stop_requested.is_set():
            status = self._shared.status
            keys = [(p.topic, p.partition) for p in status.partitions] if status else []
            if keys:
                try:
                    ends = true_end_offsets(kafka, keys)
                except (EndOffsetsError, KafkaException) as exc:
                    log.debug("consumer group %s: end offsets: %s", self.group, exc)
                else:
                    self._shared.ends = {**self._shared.ends, **ends}
            self._lag_wakeup.wait(self._settings.lag_interval_s)
            self._lag_wakeup.clear()


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """No cyclic collection while a poll's messages are alive.

    A poll makes about three collector-tracked objects per message (the message, its
    header list and tuple), all dropped by reference counting once they are handed
    over. Collections triggered meanwhile found them alive and promoted them until full
    collections swept the whole process: 8% of the poll thread's time on a no-op
    workload. Deferred, the next collection finds them gone.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _reason(exc: KafkaException) -> str:
    """librdkafka's words for a failed call, without the KafkaError{...} around them."""
    error = exc.args[0] if exc.args else None
    return error.str() if isinstance(error, KafkaError) else str(exc)


def _names(partitions: Iterable[TopicPartition]) -> str:
    return ", ".join(f"{tp.topic}/{tp.partition}" for tp in partitions) or "nothing"
