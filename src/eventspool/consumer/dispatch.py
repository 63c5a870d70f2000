"""Dispatch: events from a poll to the workers, and the workers' outcomes back.

Under `key` ordering a keyed event goes straight to the worker of its key (a part), which
keeps the key's order and retries it itself; everything else goes through the scheduler
and out in batches (tasks) sized to the handler's pace. Each outcome settles its event:
finished (its offset, or its chunk's offset range once all of it is done), back in line,
retried after a backoff, or forwarded to the dead-letter topic once out of attempts. A
dead worker's unreported events are retried, the one that was running counted as failed.
"""

from __future__ import annotations

import functools
import itertools
import logging
import math
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from confluent_kafka import KafkaError, Message

from eventspool._core.native import decode_records, split_keyed
from eventspool.clock import Clock
from eventspool.consumer.assignment import Assignment, PartitionState
from eventspool.consumer.flow import FlowControl
from eventspool.consumer.forwarding import Forwarder
from eventspool.consumer.messages import (
    SKIPPED,
    EventsDone,
    Failure,
    PartWire,
    PoolEvent,
    Progress,
    TaskDone,
    WorkerDied,
)
from eventspool.consumer.offsets import CommitPolicy
from eventspool.consumer.pool import WorkerPool
from eventspool.consumer.record import RawRecord, wire_from_raw, wire_record
from eventspool.consumer.scheduler import Ordering, Pending, Scheduler, TopicPartitionKey
from eventspool.consumer.settings import ConsumerSettings
from eventspool.consumer.status import ConsumerCounters

if TYPE_CHECKING:
    from eventspool._core.native import KeyedRun

log = logging.getLogger("eventspool.consumer")

_BATCH_TARGET_S = 0.05


@dataclass(slots=True)
class _Task:
    items: list[tuple[PartitionState, Pending]]
    started: float
    done: set[int] = field(default_factory=set)  # indexes an async worker reported

    def unfinished(self) -> list[tuple[PartitionState, Pending]]:
        return [item for index, item in enumerate(self.items) if index not in self.done]


@dataclass(slots=True, eq=False)
class _Chunk:
    """Keyed events of one partition from one poll, `left` of them not finished: their
    offsets are one range, finished once all of them are."""

    state: PartitionState
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


class Dispatcher:
    """The events between intake and their outcome: the scheduler's waiting ones, the
    tasks and parts the workers hold, and the pace of the handler that sizes batches."""

    def __init__(
        self,
        group: str,
        settings: ConsumerSettings,
        *,
        clock: Clock,
        assignment: Assignment,
        flow: FlowControl,
        forwarder: Forwarder,
        policy: CommitPolicy,
        counters: ConsumerCounters,
        stop_requested: threading.Event,
    ) -> None:
        self._group = group
        self._settings = settings
        self._clock = clock
        self._partitions = assignment
        self._flow = flow
        self._forwarder = forwarder
        self._policy = policy
        self._counters = counters
        self._stop_requested = stop_requested
        self._keyed = settings.ordering is Ordering.KEY
        self._scheduler = Scheduler(settings.ordering)
        self._tasks: dict[int, _Task] = {}
        self._task_ids = itertools.count()
        self._parts: dict[int, _Part] = {}
        self._next_part = 0
        self._event_seconds: float | None = None
        self._pool: WorkerPool | None = None

    def attach(self, pool: WorkerPool) -> None:
        """The workers to dispatch to, once started."""
        self._pool = pool

    @property
    def waiting(self) -> int:
        return self._scheduler.waiting

    @property
    def has_parts(self) -> bool:
        return bool(self._parts)

    def running(self) -> bool:
        """Some event is in a worker."""
        return bool(self._tasks or self._parts)

    def busy(self) -> bool:
        """Some event is in a worker or waits for one."""
        return bool(self._tasks or self._parts or self._scheduler.waiting)

    def in_flight(self) -> int:
        return sum(len(task.items) - len(task.done) for task in self._tasks.values()) + sum(
            part.left for part in self._parts.values()
        )

    def oldest_in_flight_s(self, now: float) -> float | None:
        starts = [task.started for task in self._tasks.values()]
        starts += [part.started for part in self._parts.values()]
        return now - min(starts) if starts else None

    def handle_pool_events(self, timeout: float) -> None:
        """Settle what the workers reported, waiting up to `timeout` for a report."""
        assert self._pool is not None
        self._handle(self._pool.collect(timeout))

    def take_in(self, messages: list[Message]) -> None:
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
        self._flow.hold(state, count)
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
            self._forwarder.drop_stale(state, wire, functools.partial(self._settle_chunk, chunk, 1))

    def _new_part_id(self) -> int:
        part_id = self._next_part
        self._next_part += 1
        return part_id

    def _intake(self, message: Message) -> None:
        error = message.error()
        if error is not None:
            if error.code() != KafkaError._PARTITION_EOF:
                log.warning("consumer group %s: %s", self._group, error)
            return
        wire = wire_record(message)
        state = self._partitions.get((wire[0], wire[1]))
        if state is None or not state.offsets.add(wire[2]):
            return
        self._flow.hold(state)
        self._counters.received += 1
        self._scheduler.add(wire)

    def dispatch(self) -> None:
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
            items: list[tuple[PartitionState, Pending]] = []
            for pending in batch:
                state = self._partitions[(pending.wire[0], pending.wire[1])]
                if self._forwarder.is_stale(pending.wire[6]):
                    self._scheduler.release(pending)
                    self._forwarder.drop_stale(
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

    def _handle(self, events: Iterable[PoolEvent]) -> None:
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

    def _settle(self, state: PartitionState, pending: Pending, failure: Failure | None) -> None:
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
                    self._forwarder.dead_letter(state, wire, attempt, failure, done)
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
                self._flow.release(part.chunk.state, len(indexes))
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
        self._flow.release(state, count)
        self._policy.finished(count)
        chunk.left -= count
        if not chunk.left:
            state.offsets.finish(chunk.first, chunk.end)

    def _worker_died(self, event: WorkerDied) -> None:
        self._counters.worker_restarts += 1
        log.warning(
            "consumer group %s: worker died (exit code %s); replaced", self._group, event.exitcode
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
                    self._flow.release(state, 1)
                    self._counters.abandoned += 1
                    continue
                attempt = part.attempts[index] if part.attempts else 1
                self._log_failure(part.topic, part.partition, raw[0], attempt, died)
                if not state.active:
                    continue
                if attempt >= self._settings.max_attempts:
                    wire = wire_from_raw(part.topic, part.partition, raw)
                    done = functools.partial(self._settle_chunk, part.chunk, 1)
                    self._forwarder.dead_letter(state, wire, attempt, died, done)
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

    def _finish(self, state: PartitionState, pending: Pending) -> None:
        if not state.active:
            return
        state.offsets.finish(pending.offset)
        self._flow.release(state)
        self._policy.finished()

    def _requeue(self, state: PartitionState, pending: Pending) -> None:
        if state.active:
            self._scheduler.put_back(pending)

    def _failed(self, state: PartitionState, pending: Pending, failure: Failure) -> None:
        wire = pending.wire
        self._log_failure(wire[0], wire[1], pending.offset, pending.attempt, failure)
        if not state.active:
            return
        if pending.attempt >= self._settings.max_attempts:
            done = functools.partial(self._finish, state, pending)
            self._forwarder.dead_letter(state, wire, pending.attempt, failure, done)
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
            self._group,
            topic,
            partition,
            offset,
            attempt,
            error_type,
            message,
            f"\n{trace.rstrip()}" if attempt == 1 and trace else "",
        )

    def drop_waiting(self, states: dict[TopicPartitionKey, PartitionState]) -> None:
        for key, state in states.items():
            dropped = len(self._scheduler.drop_partition(key))
            self._flow.release(state, dropped)
            self._counters.dropped += dropped

    def drop_parts(self, states: dict[TopicPartitionKey, PartitionState]) -> None:
        """Have the workers drop the events they hold of these partitions (each reports
        them as dropped), so only the ones running need to finish."""
        for state in states.values():
            state.dropping = True
        wanted = {id(state) for state in states.values()}
        if any(id(part.chunk.state) in wanted for part in self._parts.values()):
            assert self._pool is not None
            self._pool.drop(dict.fromkeys(states, self._next_part - 1))

    def running_on(self, states: Iterable[PartitionState]) -> bool:
        wanted = {id(state) for state in states}
        return any(
            id(s) in wanted for task in self._tasks.values() for s, _ in task.unfinished()
        ) or any(id(part.chunk.state) in wanted for part in self._parts.values())

    def forget_waiting(self, key: TopicPartitionKey) -> int | None:
        """Drop a partition's waiting events, to be fetched again: the offset to seek
        back to, or None if none was waiting."""
        state = self._partitions.get(key)
        dropped = self._scheduler.drop_partition(key)
        if state is None or not dropped:
            return None
        self._flow.release(state, len(dropped))
        self._counters.dropped += len(dropped)
        first = min(p.offset for p in dropped)
        state.offsets.forget_from(first)
        return first

    def forget_inactive(self) -> None:
        """Forget the parts of partitions let go: what comes back of them changes nothing."""
        self._parts = {i: p for i, p in self._parts.items() if p.chunk.state.active}

    def abandon_running(self) -> int:
        """Forget every event still in a worker (at a stop); how many there were."""
        abandoned = sum(len(task.unfinished()) for task in self._tasks.values())
        abandoned += sum(part.left for part in self._parts.values())
        self._tasks.clear()
        self._parts.clear()
        return abandoned
