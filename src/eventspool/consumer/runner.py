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

This module owns the lifecycle (start, the poll loop, rebalances, shutdown) and
coordinates the collaborators that own the rest: `Dispatcher` (events to workers and
outcomes back), `FlowControl` (held events, pause and resume), `Forwarder` (stale and
dead-letter topics), `CommitTracker` (commits and their answers) and `StatusBoard`
(the published snapshot and the lag probe).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import logging
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any, Self

from confluent_kafka import Consumer as KafkaConsumer
from confluent_kafka import KafkaException, TopicPartition

from eventspool.clock import SYSTEM_CLOCK, Clock
from eventspool.config import validate_topic
from eventspool.consumer.assignment import Assignment, PartitionState
from eventspool.consumer.commits import CommitTracker
from eventspool.consumer.dispatch import Dispatcher
from eventspool.consumer.flow import FlowControl
from eventspool.consumer.forwarding import Forwarder
from eventspool.consumer.handle import KafkaConsumerHandle
from eventspool.consumer.handler import HandlerRef, resolve_handler
from eventspool.consumer.offsets import CommitPolicy, PartitionOffsets
from eventspool.consumer.pool import WorkerPool
from eventspool.consumer.scheduler import TopicPartitionKey
from eventspool.consumer.settings import ConsumerSettings
from eventspool.consumer.status import ConsumerCounters, ConsumerStatus, StatusBoard
from eventspool.errors import EventspoolError

log = logging.getLogger("eventspool.consumer")

_IDLE_POLL_S = 0.1
_BUSY_POLL_S = 0.002
# One poll takes at most this many messages, and no more than max_buffered has room for:
# each poll costs the poll thread a step's fixed work and a transfer per worker, which
# polls of 1,000 paid a tenth of its time for; 10,000 were no faster than 5,000.
_MAX_CONSUME = 5000
_REFILL_SHARE = 0.25
_COMMITTED_TIMEOUT_S = 10.0
# The final commit at a stop is tried this often, the waits between the tries doubling
# from the backoff: NOT_COORDINATOR and REBALANCE_IN_PROGRESS clear within a second or so
# while a group's coordinator moves. It may take until the shutdown deadline, and at least
# the minimum however much of that the handlers used.
_STOP_COMMIT_ATTEMPTS = 5
_STOP_COMMIT_BACKOFF_S = 0.25
_STOP_COMMIT_MIN_S = 5.0
_LAG_JOIN_S = 1.0
# stop() waits for the poll thread this long beyond `shutdown_timeout_s`: the commit at
# stop takes at least _STOP_COMMIT_MIN_S, and close() leaves the group. A poll thread
# still running after that is stuck in a librdkafka call, and stop() says where.
_STOP_MARGIN_S = _STOP_COMMIT_MIN_S + 30.0
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
        for name, value in self._settings.kafka.items():
            if name in _FORCED_KAFKA and value != _FORCED_KAFKA[name]:
                raise ValueError(f"kafka {name}={value!r}: eventspool commits offsets itself")
        self._counters = ConsumerCounters()
        self._partitions: Assignment = {}
        self._state = "created"
        self._stop_requested = threading.Event()
        self._stopped = threading.Event()
        self._lag_wakeup = threading.Event()
        self._failure: BaseException | None = None
        self._signalled: int | None = None
        self._kafka: KafkaConsumerHandle | None = None
        self._pool: WorkerPool | None = None
        self._threads: list[threading.Thread] = []
        self._flow = FlowControl(self._settings, self._counters)
        self._forwarder = Forwarder(group, self._settings, bootstrap_servers, self._counters, clock)
        policy = CommitPolicy(self._settings.commit_every_n, self._settings.commit_every_s, clock)
        self._commits = CommitTracker(
            group,
            self._partitions,
            policy,
            self._counters,
            stopping=lambda: self._state == "stopping",
            refetch=self._refetch,
        )
        self._dispatcher = Dispatcher(
            group,
            self._settings,
            clock=clock,
            assignment=self._partitions,
            flow=self._flow,
            forwarder=self._forwarder,
            policy=policy,
            counters=self._counters,
            stop_requested=self._stop_requested,
        )
        self._board = StatusBoard()
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
        self._dispatcher.attach(self._pool)
        try:
            kafka = KafkaConsumer(self._kafka_config())
            self._kafka = kafka
            kafka.subscribe(
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
        for thread in (
            threading.Thread(
                target=self._poll_loop, args=(kafka,), name="eventspool-consumer-poll"
            ),
            threading.Thread(target=self._lag_loop, name="eventspool-consumer-lag"),
        ):
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
            "on_commit": self._commits.on_commit,
        }

    def request_stop(self) -> None:
        """Ask the poll thread to stop; safe from a signal handler or any thread."""
        self._stop_requested.set()
        self._lag_wakeup.set()

    def stop(self, timeout: float | None = None) -> ConsumerStatus:
        """Stop taking events, let running handlers finish (up to `shutdown_timeout_s`),
        commit what is done and leave the group. The status returned names in
        `uncommitted` the partitions whose finished offsets could not be committed.

        The wait is bounded (by default `shutdown_timeout_s` plus a margin for the commit
        and leaving the group): a poll thread stuck in a Kafka call past it raises
        ConsumerError naming that call, instead of hanging the process that stops."""
        self.request_stop()
        return self.join(self._stop_bound_s() if timeout is None else timeout)

    def join(self, timeout: float | None = None) -> ConsumerStatus:
        """Wait for the poll thread, which commits and leaves the group, and briefly for
        the lag thread: an end-offset probe takes milliseconds, but runs to its timeout
        (10 s) against a partition leader that does not answer, and only the status's
        end offsets depend on it. Once a stop was requested, a poll thread still running
        at `timeout` is an error."""
        if self._threads:
            poll, lag = self._threads
            poll.join(timeout)
            lag.join(_LAG_JOIN_S)
            if poll.is_alive() and self._stop_requested.is_set():
                raise ConsumerError(
                    f"consumer group {self.group!r} did not stop within {timeout:.0f} s: "
                    f"its poll thread is blocked in {_blocked_in(poll)}"
                )
        if self._failure is not None:
            raise ConsumerError(f"consumer poll thread failed: {self._failure}") from self._failure
        return self.status()

    def _stop_bound_s(self) -> float:
        return self._settings.shutdown_timeout_s + _STOP_MARGIN_S

    def run(self) -> ConsumerStatus:
        """Start and block until SIGTERM or SIGINT (in the main thread) or `request_stop()`."""
        previous: dict[signal.Signals, Any] = {}
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGTERM, signal.SIGINT):
                previous[signum] = signal.signal(signum, self._on_signal)
        try:
            self.start()
            while not (self._stopped.wait(0.5) or self._stop_requested.is_set()):
                if self._signalled is not None:
                    log.info("signal %d: stopping consumer group %s", self._signalled, self.group)
                    self.request_stop()
            return self.join(self._stop_bound_s())
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        """Only notes the signal, for run()'s loop to act on within half a second.

        A handler runs between two bytecodes of the main thread, which may then hold the
        lock of the very Event it would set: a second SIGTERM (`timeout` sends two) or a
        second Ctrl-C deadlocked the process in Event.set(). Logging takes locks too.
        """
        self._signalled = signum

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
        status = self._board.status
        assert status is not None  # published from __init__ on
        return status

    def worker_pids(self) -> list[int | None]:
        """Process ids of the workers (a test or an operator may want to signal one)."""
        return self._pool.pids() if self._pool else []

    # ----------------------------------------------------------------- poll thread

    def _poll_loop(self, kafka: KafkaConsumerHandle) -> None:
        try:
            while not self._stop_requested.is_set():
                self._step(kafka)
            self._shutdown(kafka)
        except BaseException as exc:
            log.exception("consumer group %s: poll thread failed", self.group)
            self._failure = exc
            self._abort()
        finally:
            self._state = "stopped"
            self._publish_status(force=True)
            self._stopped.set()
            self._lag_wakeup.set()

    def _step(self, kafka: KafkaConsumerHandle) -> None:
        dispatcher = self._dispatcher
        dispatcher.handle_pool_events(0)
        dispatcher.dispatch()
        if self._flow.hold_intake(kafka):
            dispatcher.handle_pool_events(_BUSY_POLL_S)
        else:
            busy = dispatcher.busy() or self._forwarder.pending
            limit = self._settings.max_buffered
            if dispatcher.has_parts and limit - self._flow.held < limit * _REFILL_SHARE:
                # Nearly full: let the workers' next reports free room first, so this
                # poll takes a batch, not a trickle that costs a step and a transfer.
                dispatcher.handle_pool_events(_BUSY_POLL_S)
            budget = max(1, min(_MAX_CONSUME, limit - self._flow.held))
            with _collector_paused():
                dispatcher.take_in(kafka.consume(budget, _BUSY_POLL_S if busy else _IDLE_POLL_S))
            dispatcher.dispatch()
        self._forwarder.service()
        if self._commits.policy.due():
            self._commits.commit(kafka, list(self._partitions.items()), wait=False)
        self._publish_status()

    def _refetch(self, key: TopicPartitionKey) -> None:
        """A partition whose commit failed may have moved to another member, whose work
        its waiting events would duplicate: drop them and fetch them again."""
        first = self._dispatcher.forget_waiting(key)
        if first is None:
            return
        assert self._kafka is not None  # commits are answered on the poll thread
        try:
            self._kafka.seek(TopicPartition(key[0], key[1], first))
        except KafkaException as exc:
            log.warning("consumer group %s: cannot seek %s back: %s", self.group, key, exc)

    # ----------------------------------------------------------------- rebalances

    def _on_assign(self, kafka: KafkaConsumerHandle, partitions: list[TopicPartition]) -> None:
        self._counters.rebalances += 1
        try:
            committed = kafka.committed(partitions, timeout=_COMMITTED_TIMEOUT_S)
        except KafkaException as exc:
            log.warning("consumer group %s: cannot read committed offsets: %s", self.group, exc)
            committed = [TopicPartition(tp.topic, tp.partition) for tp in partitions]
        for tp in committed:
            start = tp.offset if tp.offset >= 0 else None
            self._partitions[(tp.topic, tp.partition)] = PartitionState(PartitionOffsets(start))
        self._flow.apply_to(kafka, partitions)
        log.info("consumer group %s: assigned %s", self.group, _names(partitions))
        self._publish_status(force=True)
        self._lag_wakeup.set()

    def _on_revoke(self, kafka: KafkaConsumerHandle, partitions: list[TopicPartition]) -> None:
        self._release_partitions(kafka, partitions, commit=True)

    def _on_lost(self, kafka: KafkaConsumerHandle, partitions: list[TopicPartition]) -> None:
        self._release_partitions(kafka, partitions, commit=False)

    def _release_partitions(
        self, kafka: KafkaConsumerHandle, partitions: list[TopicPartition], *, commit: bool
    ) -> None:
        """Drop waiting events, give running ones `revoke_timeout_s` to finish, commit
        what is done, and forget the rest: the next owner redelivers it."""
        keys = [(tp.topic, tp.partition) for tp in partitions]
        states = {key: self._partitions[key] for key in keys if key in self._partitions}
        dispatcher = self._dispatcher
        dispatcher.drop_waiting(states)
        dispatcher.drop_parts(states)
        if commit:
            previous = self._state
            if previous == "running":
                self._state = "revoking"
                self._publish_status(force=True)
            try:
                deadline = time.monotonic() + self._settings.revoke_timeout_s
                while dispatcher.running_on(states.values()) and time.monotonic() < deadline:
                    dispatcher.handle_pool_events(0.05)
                dispatcher.drop_waiting(states)
                self._commits.commit(kafka, states.items())
            finally:
                self._state = previous
        for key, state in states.items():
            state.active = False
            self._commits.release(key, state, lost=not commit)
            self._counters.abandoned += state.held
            self._flow.release(state, state.held)
            del self._partitions[key]
        self._forwarder.forget_inactive()
        dispatcher.forget_inactive()
        log.info(
            "consumer group %s: %s %s",
            self.group,
            "revoked" if commit else "lost",
            _names(partitions),
        )
        self._publish_status(force=True)

    # ----------------------------------------------------------------- shutdown

    def _shutdown(self, kafka: KafkaConsumerHandle) -> None:
        self._state = "stopping"
        self._publish_status(force=True)
        # From our own record: librdkafka's assignment() waits on the group thread without
        # a timeout, and after leader moves and a lost broker it was seen never to answer.
        assignment = [TopicPartition(topic, partition) for topic, partition in self._partitions]
        if assignment:
            kafka.pause(assignment)
        dispatcher = self._dispatcher
        dispatcher.drop_waiting(dict(self._partitions))
        dispatcher.drop_parts(self._partitions)
        deadline = time.monotonic() + self._settings.shutdown_timeout_s
        while (dispatcher.running() or self._forwarder.pending) and time.monotonic() < deadline:
            dispatcher.handle_pool_events(0.05)
            self._forwarder.service()
            # Keep the membership alive; anything fetched now is not taken.
            kafka.consume(1, 0)
            self._publish_status()
        abandoned = dispatcher.abandon_running()
        if abandoned:
            log.warning("consumer group %s: abandoned %d running events", self.group, abandoned)
        self._counters.abandoned += abandoned
        assert self._pool is not None
        self._pool.stop()
        self._forwarder.flush(max(deadline - time.monotonic(), 1.0))
        self._commit_at_stop(kafka, max(deadline, time.monotonic() + _STOP_COMMIT_MIN_S))
        # close() revokes them: their commit is settled, and a blocking one there could
        # wait out session.timeout.ms for a coordinator that is gone.
        self._partitions.clear()
        kafka.close()

    def _commit_at_stop(self, kafka: KafkaConsumerHandle, deadline: float) -> None:
        """Commit every finished offset, trying again with a backoff while it fails. Each
        try is asynchronous and its answer awaited to `deadline` (a blocking commit waits
        for a missing coordinator as long as librdkafka likes); the partitions left are
        logged and published as `uncommitted`."""
        commits = self._commits
        backoff = _STOP_COMMIT_BACKOFF_S
        for attempt in range(_STOP_COMMIT_ATTEMPTS + 1):
            _serve_kafka(kafka, deadline, lambda: not commits.in_flight)
            if commits.in_flight or attempt == _STOP_COMMIT_ATTEMPTS:
                break
            if not commits.anything_to_commit():
                break
            if attempt:
                _serve_kafka(kafka, min(time.monotonic() + backoff, deadline), lambda: False)
                backoff *= 2
            if time.monotonic() >= deadline:
                break
            commits.commit(kafka, list(self._partitions.items()), wait=False)
        commits.report_uncommitted()

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
        now = self._board.snapshot_due(self._flow.held, force=force)
        if now is None:
            return
        dispatcher = self._dispatcher
        self._board.status = ConsumerStatus(
            group=self.group,
            state=self._state,
            paused=self._flow.paused,
            buffered=self._flow.held,
            waiting=dispatcher.waiting,
            in_flight=dispatcher.in_flight(),
            oldest_in_flight_s=dispatcher.oldest_in_flight_s(now),
            partitions=self._board.partitions(self._partitions),
            uncommitted=self._commits.uncommitted(),
            counters=dataclasses.replace(self._counters),
            taken_at=now,
        )

    def _lag_loop(self) -> None:
        self._board.follow_end_offsets(
            self.group,
            {**self._settings.kafka, "bootstrap.servers": self._bootstrap},
            self._settings.lag_interval_s,
            self._stop_requested,
            self._lag_wakeup,
        )


def _blocked_in(thread: threading.Thread) -> str:
    """Where `thread` waits: its innermost frames in this package, the first being the
    call into the Kafka client (whose own C frames Python cannot show)."""
    frame = sys._current_frames().get(thread.ident or -1)
    if frame is None:
        return "a call that just returned"
    package = Path(__file__).parents[1]
    ours = [
        entry
        for entry in traceback.extract_stack(frame)
        if Path(entry.filename).is_relative_to(package)
    ]
    return " <- ".join(
        f"{Path(entry.filename).name}:{entry.lineno} {entry.line}" for entry in reversed(ours[-3:])
    )


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


def _names(partitions: Iterable[TopicPartition]) -> str:
    return ", ".join(f"{tp.topic}/{tp.partition}" for tp in partitions) or "nothing"


def _serve_kafka(kafka: KafkaConsumerHandle, until: float, done: Callable[[], bool]) -> None:
    """Let librdkafka report commits and rebalances until `done()` or `until`; this
    keeps the membership alive too. Anything fetched now is not taken."""
    while not done() and (left := until - time.monotonic()) > 0:
        kafka.consume(1, min(left, _IDLE_POLL_S))
