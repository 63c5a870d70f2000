"""Worker processes that run handlers, so a slow or CPU-bound handler never holds the
poll thread (or the GIL it needs to keep the group membership alive).

Parts (key-ordered events): the poll thread routes each keyed event to the worker of
its key and hands a worker all of a poll's events for it in one transfer: their packed
records go into the worker's ring of shared memory, and only where they are into its
pipe. The worker runs them in arrival order, which is each key's offset order, and
keeps that order itself across retries: a failed event waits for its backoff in the
worker and holds back its key's later events meanwhile; one out of attempts is
reported for the poll thread to dead-letter. A plain worker's outcomes go back in one
report at most every 5 ms while it is busy (for slow events, about every hundred events,
at most 20 ms apart), an async worker's every 2 ms; a whole part is one entry once it
is done. A revoked partition's events still queued are dropped on request. When a
worker dies, every event of its parts it had not reported is retried.

Tasks (everything else): a plain function's worker runs one task at a time, in order.
Before each event it writes the event's index into shared memory, so when a worker dies
the pool knows which event killed it, which ones finished and which never started.

An `async def` handler: each worker runs an event loop with up to `concurrency` handler
calls at once, takes new transfers while earlier ones run, and reports each event as it
finishes (the reports of a couple of milliseconds in one message), so a slow event holds
back neither the others nor the commit of those before it. Events of one scope (key or
partition, by the ordering) still run one after the other, in order. When such a worker
dies, every event it had not reported is retried.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import importlib
import inspect
import itertools
import multiprocessing
import os
import queue
import signal
import threading
import time
import traceback
from collections import deque
from collections.abc import Awaitable, Callable, Hashable, Iterable
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any, NamedTuple, Protocol

from eventspool._core.native import Handoff, PartRecords, decode_part
from eventspool.consumer.record import RawRecord, Record, WireRecord, record_from_raw
from eventspool.consumer.scheduler import Ordering, TopicPartitionKey, scope_of
from eventspool.consumer.settings import RetryPolicy
from eventspool.errors import EventspoolError

Handler = Callable[[Record], object]
AsyncHandler = Callable[[Record], Awaitable[object]]
HandlerRef = str | Handler
# (error type, message, traceback text); SKIPPED marks an event held back by its scope.
Failure = tuple[str, str, str]
SKIPPED: Failure = ("", "", "")
_MAX_TRACEBACK = 4000
_STOP_JOIN_TIMEOUT = 5.0
# An async worker reports what finished within this long in one message, not one per event.
_REPORT_EVERY_S = 0.002
# A plain worker reports at most this often while it is busy (an idle one at once): each
# report wakes the poll thread and costs it tens of microseconds, and with cheap handlers
# the reports of two workers every 2 ms took a tenth of its time. With slow events it waits
# longer, up to _REPORT_MAX_WAIT_S, for a report to carry about _REPORT_EVENTS of them, so
# handlers that need the whole machine do not pay that per event.
_REPORT_MIN_WAIT_S = 0.005
_REPORT_EVENTS = 100
_REPORT_MAX_WAIT_S = 0.02
# Each worker's hand-off ring: twice what the default window of 200-byte events packs to.
# A blob that does not fit in the room left goes through the pipe instead.
_HANDOFF_BYTES = 4 << 20


class HandlerError(EventspoolError):
    """The handler reference cannot be resolved to a callable."""


class WorkerStartError(EventspoolError):
    """A worker process exited before it could run a handler: starting another would
    fail the same way, and its events are not the handler's fault."""


# A worker's first message: it imported its module and resolved the handler.
_STARTED = "started"


def is_async(handler: Handler) -> bool:
    """An `async def` function (also behind functools.partial) runs concurrently."""
    return inspect.iscoroutinefunction(handler)


def resolve_handler(ref: HandlerRef) -> Handler:
    """`module:function` or a callable (which must be picklable to reach a worker)."""
    if not isinstance(ref, str):
        if not callable(ref):
            raise HandlerError(f"handler {ref!r} is not callable")
        return ref
    module_name, sep, attribute = ref.partition(":")
    if not sep or not module_name or not attribute:
        raise HandlerError(f"handler {ref!r}: expected 'module:function'")
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise HandlerError(f"handler {ref!r}: cannot import {module_name!r}: {exc}") from exc
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise HandlerError(f"handler {ref!r}: {module_name!r} has no {attribute!r}") from None
    if not callable(target):
        raise HandlerError(f"handler {ref!r} is not callable")
    handler: Handler = target
    return handler


@dataclass(frozen=True, slots=True)
class TaskDone:
    task_id: int
    failures: dict[int, Failure] | None


@dataclass(frozen=True, slots=True)
class EventsDone:
    """Events an async worker finished: (task id, index in the task, failure or None)."""

    events: list[tuple[int, int, Failure | None]]


@dataclass(frozen=True, slots=True)
class WorkerDied:
    """Worker `worker` exited: events of its task before `index` finished, the one at
    `index` was running (-1: none had started; the task's length: all had finished). An
    async worker's tasks are all in `tasks`; what it did not report as done was
    unfinished, and so were its parts' events it did not report."""

    worker: int
    task_id: int | None
    index: int
    exitcode: int | None
    tasks: tuple[int, ...] = ()


class InRing(NamedTuple):
    """Where a part's blob waits in its worker's hand-off ring."""

    start: int
    size: int


# A part: (part id, topic, partition, records, attempts or None for all first attempts).
# Key-ordered events of one partition from one poll, all for one worker; the records come
# packed by the compiled core (`split_keyed`), or as a list when resent after a death.
PartWire = tuple[int, str, int, list[RawRecord] | bytes, list[int] | None]
# A part in the pipe: its packed blob usually waits in the worker's hand-off ring.
SentPart = tuple[int, str, int, list[RawRecord] | bytes | InRing, list[int] | None]


@dataclass(frozen=True, slots=True)
class Parts:
    """Parts handed to a worker in one transfer."""

    parts: list[PartWire]


@dataclass(frozen=True, slots=True)
class SentParts:
    """Parts as the pipe carries them; the worker's end makes them `Parts` again."""

    parts: list[SentPart]


@dataclass(frozen=True, slots=True)
class Drop:
    """Forget the events of these partitions from parts up to the given id (revoked)."""

    bounds: dict[TopicPartitionKey, int]


@dataclass(frozen=True, slots=True)
class Progress:
    """What a worker settled of its parts since its last report.

    `finished`: (part id, indexes, or None for every event of the part not reported
    before). `failures`: (part id, index, attempt, failure, gave up); an event that gave
    up is the poll thread's to dead-letter, one that did not is retried by the worker.
    `dropped`: (part id, indexes) of revoked partitions. `settled` counts the events this
    report settles; `busy_s` is the handler time spent on `handled` events.
    """

    finished: list[tuple[int, list[int] | None]]
    failures: list[tuple[int, int, int, Failure, bool]]
    dropped: list[tuple[int, list[int]]]
    settled: int
    busy_s: float
    handled: int


PoolEvent = TaskDone | EventsDone | WorkerDied | Progress


class _Pipe(Protocol):
    """What a worker's loop uses of its end of the pipe."""

    def send(self, obj: Any) -> None: ...

    def recv(self) -> Any: ...


class _RingPipe:
    """A worker's end of its pipe, which copies the blobs of the parts it receives out
    of the hand-off ring; in the order they were put there, as the ring needs."""

    def __init__(self, conn: Connection, handoff: Handoff) -> None:
        self._conn = conn
        self._handoff = handoff

    def send(self, obj: Any) -> None:
        self._conn.send(obj)

    def recv(self) -> Any:
        message = self._conn.recv()
        if not isinstance(message, SentParts):
            return message
        take = self._handoff.take
        return Parts(
            [
                (part_id, topic, partition, take(*packed), attempts)
                if isinstance(packed, InRing)
                else (part_id, topic, partition, packed, attempts)
                for part_id, topic, partition, packed, attempts in message.parts
            ]
        )


def _worker_main(
    conn: Connection,
    handler_ref: HandlerRef,
    ordering: Ordering,
    progress: Any,
    concurrency: int,
    *,
    ring: Any,
    retry: RetryPolicy,
) -> None:
    # The parent decides when in-flight work stops; a terminal's Ctrl-C or a service
    # manager's SIGTERM to the whole group must not cut a handler short behind its back.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    handler = resolve_handler(handler_ref)
    conn.send(_STARTED)
    pipe = _RingPipe(conn, Handoff(ring))
    if is_async(handler):
        asyncio.run(_AsyncWorker(pipe, handler, ordering, concurrency, retry).serve())
    else:
        _PlainWorker(pipe, handler, ordering, progress, retry).serve()


def _run_batch(
    handler: Handler, ordering: Ordering, items: list[tuple[WireRecord, int]], progress: Any
) -> dict[int, Failure] | None:
    failures: dict[int, Failure] = {}
    held: set[Hashable] = set()
    for index, (wire, attempt) in enumerate(items):
        if held and scope_of(ordering, wire[0], wire[1], wire[3]) in held:
            failures[index] = SKIPPED
            continue
        progress.value = index
        try:
            handler(Record(*wire, attempt=attempt))
        except Exception as exc:
            failures[index] = _failure(exc)
            failed_scope = scope_of(ordering, wire[0], wire[1], wire[3])
            if failed_scope is not None:
                held.add(failed_scope)
    progress.value = len(items)
    return failures or None


def _failure(exc: Exception) -> Failure:
    text = "".join(traceback.format_exception(exc))[-_MAX_TRACEBACK:]
    return (type(exc).__qualname__, str(exc), text)


class _Job:
    """One event in a worker: from a part (`keyed`: the worker retries it) or from a task
    (the poll thread decides about it). `ident` is the part's or the task's id."""

    __slots__ = ("ident", "index", "keyed", "record", "scope")

    def __init__(
        self, ident: int, index: int, record: Record, scope: Hashable, keyed: bool
    ) -> None:
        self.ident = ident
        self.index = index
        self.record = record
        self.scope = scope
        self.keyed = keyed


def _part_jobs(
    part_id: int, topic: str, partition: int, records: Iterable[Record], first: int
) -> list[_Job]:
    """A job for each of a part's records, the first of them at index `first`."""
    return [
        _Job(part_id, index, record, (topic, partition, record.key), True)
        for index, record in enumerate(records, first)
    ]


class _PartRun:
    """A packed part's first attempts in a plain worker; `next` is the index of the
    first one `records` has still to make.

    While no key waits for a retry, the worker runs them in one loop, with no job, no
    scope and no settling call per event: that loop is what a cheap handler costs."""

    __slots__ = ("end", "ident", "next", "partition", "records", "topic")

    def __init__(self, ident: int, topic: str, partition: int, records: PartRecords) -> None:
        self.ident = ident
        self.topic = topic
        self.partition = partition
        self.records = records
        self.next = 0
        self.end = records.count

    def jobs(self) -> list[_Job]:
        """The events still to run, one job each; this uses `records` up, so the run
        is done with once they are taken."""
        return _part_jobs(self.ident, self.topic, self.partition, self.records, self.next)


class _WorkerLoop:
    """What both kinds of worker share: reading transfers and, for parts, which events
    of each are still to settle, what to report, which revoked partitions to drop, and
    when a failed event is retried."""

    def __init__(self, conn: _Pipe, retry: RetryPolicy) -> None:
        self._conn = conn
        self._retry = retry
        self._left: dict[int, int] = {}
        self._finished: dict[int, list[int]] = {}
        self._failures: list[tuple[int, int, int, Failure, bool]] = []
        self._dropped: dict[int, list[int]] = {}
        self._settled = 0
        self._busy_s = 0.0
        self._handled = 0
        self._bounds: dict[TopicPartitionKey, int] = {}

    def _jobs(self, part: PartWire) -> list[_Job]:
        part_id, topic, partition, _, _ = part
        return _part_jobs(part_id, topic, partition, self._records(part), 0)

    def _records(self, part: PartWire) -> list[Record]:
        part_id, topic, partition, packed, attempts = part
        if isinstance(packed, bytes):
            records = decode_part(packed, topic, partition)
        else:
            records = [
                record_from_raw(topic, partition, raw, attempts[index] if attempts else 1)
                for index, raw in enumerate(packed)
            ]
        self._left[part_id] = len(records)
        return records

    def _drop_bounds(self, drop: Drop) -> None:
        self._bounds.update(drop.bounds)

    def _is_dropped(self, job: _Job) -> bool:
        return self._part_dropped(job.record.topic, job.record.partition, job.ident)

    def _part_dropped(self, topic: str, partition: int, part_id: int) -> bool:
        """Part `part_id` is of a revoked partition, handed over before the revoke."""
        if not self._bounds:
            return False
        bound = self._bounds.get((topic, partition))
        return bound is not None and part_id <= bound

    def _settle(self, job: _Job, failure: Failure | None) -> float | None:
        """Report a keyed job's outcome; the delay before its retry if it gets one (its
        scope stays held until then), else None."""
        if failure is None:
            self._finished.setdefault(job.ident, []).append(job.index)
            self._settled_one(job.ident)
            return None
        attempt = job.record.attempt
        gives_up = attempt >= self._retry.max_attempts
        self._failures.append((job.ident, job.index, attempt, failure, gives_up))
        if gives_up:
            self._settled_one(job.ident)
            return None
        job.record = job.record.with_attempt(attempt + 1)
        return self._retry.delay(attempt)

    def _drop(self, job: _Job) -> None:
        self._dropped.setdefault(job.ident, []).append(job.index)
        self._settled_one(job.ident)

    def _settled_one(self, part_id: int) -> None:
        self._left[part_id] -= 1
        self._settled += 1

    def _settled_many(self, part_id: int, count: int) -> None:
        self._left[part_id] -= count
        self._settled += count

    def _report(self) -> Progress | None:
        if not self._settled and not self._failures:
            return None
        left = self._left
        finished = [
            (part_id, None if not left[part_id] else indexes)
            for part_id, indexes in self._finished.items()
        ]
        for part_id in {*self._finished, *self._dropped, *(f[0] for f in self._failures)}:
            if not left[part_id]:
                del left[part_id]
        progress = Progress(
            finished,
            self._failures,
            list(self._dropped.items()),
            self._settled,
            self._busy_s,
            self._handled,
        )
        self._finished, self._failures, self._dropped = {}, [], {}
        self._settled, self._busy_s, self._handled = 0, 0.0, 0
        return progress

    def _send(self, message: object) -> None:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError, EOFError):
            self._conn.send(message)

    def _start_reading(self, deliver: Callable[[Any], object]) -> None:
        """Take transfers off the pipe as they come, on a thread of their own: the poll
        thread never waits on a busy worker to hand one over, so it goes on reading the
        worker's reports, and neither side can block the other for good."""
        thread = threading.Thread(
            target=self._read, args=(deliver,), name="eventspool-worker-read", daemon=True
        )
        thread.start()

    def _read(self, deliver: Callable[[Any], object]) -> None:
        while True:
            try:
                message = self._conn.recv()
            except (EOFError, OSError):
                message = None
            except Exception:
                # A transfer it cannot read: a bug. Die loudly, so the pool replaces this
                # worker and retries what it had not reported, instead of hanging.
                traceback.print_exc()
                os._exit(1)
            deliver(message)
            if message is None:
                return


class _PlainWorker(_WorkerLoop):
    """A plain function's worker: one event at a time. Tasks run whole, as they come;
    parts' events run in arrival order, except that a failed event holds back its key's
    later ones until its retry settles."""

    def __init__(
        self,
        conn: _Pipe,
        handler: Handler,
        ordering: Ordering,
        progress: Any,
        retry: RetryPolicy,
    ) -> None:
        super().__init__(conn, retry)
        self._handler = handler
        self._ordering = ordering
        self._progress = progress
        self._inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._ready: deque[_Job | _PartRun] = deque()
        # Keys whose event waits for a retry, and their later events behind it.
        self._held: dict[Hashable, deque[_Job]] = {}
        self._timers: list[tuple[float, int, _Job]] = []
        self._timer_ids = itertools.count()

    def serve(self) -> None:
        self._start_reading(self._inbox.put)
        report_due = time.monotonic() + _REPORT_MIN_WAIT_S
        while (work := self._next()) is not None:
            if isinstance(work, _PartRun):
                self._run_part(work, report_due)
            else:
                self._run(work)
            now = time.monotonic()
            if now >= report_due:
                report_due = now + self._report_interval()
                self._flush()

    def _next(self) -> _Job | _PartRun | None:
        """The next work to run (None: stop), taking in transfers and waiting as needed.
        A part's run goes by jobs while any key waits for a retry, so that key's later
        events wait behind it: correct, and slower per event, for as long as the retry's
        backoff lasts."""
        while True:
            while not self._inbox.empty():
                if not self._take(self._inbox.get()):
                    return None
            if self._timers and self._timers[0][0] <= time.monotonic():
                return heapq.heappop(self._timers)[2]
            while self._ready:
                work = self._ready.popleft()
                if isinstance(work, _PartRun):
                    if not self._held:
                        return work
                    self._ready.extendleft(reversed(work.jobs()))
                elif self._held and work.scope in self._held:
                    self._held[work.scope].append(work)
                else:
                    return work
            self._flush()
            timeout = max(self._timers[0][0] - time.monotonic(), 0.0) if self._timers else None
            try:
                message = self._inbox.get(timeout=timeout)
            except queue.Empty:
                continue
            if not self._take(message):
                return None

    def _take(self, message: Any) -> bool:
        if message is None:
            return False
        if isinstance(message, Parts):
            for part in message.parts:
                part_id, topic, partition, packed, _ = part
                if isinstance(packed, bytes):  # first attempts, packed by the poll thread
                    run = _PartRun(part_id, topic, partition, PartRecords(packed, topic, partition))
                    self._left[part_id] = run.end
                    self._ready.append(run)
                    continue
                for job in self._jobs(part):
                    if job.record.attempt == 1:
                        self._ready.append(job)
                    elif job.scope in self._held:
                        self._held[job.scope].append(job)
                    else:  # resent after a worker died: a retry
                        self._hold(job, self._retry.delay(job.record.attempt - 1))
        elif isinstance(message, Drop):
            self._drop_bounds(message)
            self._timers = [
                (0.0, n, job) if self._is_dropped(job) else (due, n, job)
                for due, n, job in self._timers
            ]
            heapq.heapify(self._timers)
        else:
            task_id, items = message
            self._send((task_id, _run_batch(self._handler, self._ordering, items, self._progress)))
        return True

    def _hold(self, job: _Job, delay: float) -> None:
        """Retry `job` after `delay`; its key's later events wait behind it."""
        self._held.setdefault(job.scope, deque())
        heapq.heappush(self._timers, (time.monotonic() + delay, next(self._timer_ids), job))

    def _run(self, job: _Job) -> None:
        if self._is_dropped(job):
            self._drop(job)
            self._release(job.scope)
            return
        started = time.perf_counter()
        failure: Failure | None = None
        try:
            self._handler(job.record)
        except Exception as exc:
            failure = _failure(exc)
        self._busy_s += time.perf_counter() - started
        self._handled += 1
        delay = self._settle(job, failure)
        if delay is not None:
            self._hold(job, delay)
        elif self._held:
            self._release(job.scope)

    def _run_part(self, run: _PartRun, report_due: float) -> None:
        """Run a part's events in order until it is done, one fails, a message arrives
        (a transfer, or a drop that may concern this part) or a report is due; what is
        left goes back to the front."""
        if self._part_dropped(run.topic, run.partition, run.ident):
            self._dropped.setdefault(run.ident, []).extend(range(run.next, run.end))
            self._settled_many(run.ident, run.end - run.next)
            return
        handler = self._handler
        nothing_arrived = self._inbox.empty
        clock = time.monotonic
        start = index = run.next
        end = run.end
        failure: Failure | None = None
        started = time.perf_counter()
        for record in run.records:
            try:
                handler(record)
            except Exception as exc:
                failure = _failure(exc)
                break
            index += 1
            if not nothing_arrived() or clock() >= report_due:
                break
        else:
            if index < end:  # never put back a run that cannot go on: that would spin
                raise RuntimeError(f"part {run.ident}: {end - index} of its records are missing")
        self._busy_s += time.perf_counter() - started
        self._handled += index - start
        if index > start:
            self._finished.setdefault(run.ident, []).extend(range(start, index))
            self._settled_many(run.ident, index - start)
        if failure is not None:
            job = _Job(run.ident, index, record, (run.topic, run.partition, record.key), True)
            self._handled += 1
            index += 1
            delay = self._settle(job, failure)
            if delay is not None:
                self._hold(job, delay)
        if index < end:
            run.next = index
            self._ready.appendleft(run)

    def _release(self, scope: Hashable) -> None:
        """A held key's retry settled: its waiting events run next, in order."""
        waiting = self._held.pop(scope, None)
        if waiting:
            self._ready.extendleft(reversed(waiting))

    def _flush(self) -> None:
        report = self._report()
        if report is not None:
            self._send(report)

    def _report_interval(self) -> float:
        """How long until the next report: about _REPORT_EVENTS events at the pace of the
        events since the last one, within bounds. An idle worker reports at once anyway."""
        if not self._handled:
            return _REPORT_MIN_WAIT_S
        pace = self._busy_s / self._handled
        return min(max(pace * _REPORT_EVENTS, _REPORT_MIN_WAIT_S), _REPORT_MAX_WAIT_S)


class _AsyncWorker(_WorkerLoop):
    """An async worker's loop: `concurrency` runners take events from one queue, so an
    event costs no task of its own. An event whose scope has one running (or waiting for
    a retry) waits behind it and is run next by the runner of that scope, so one scope's
    events keep their order; each outcome is reported when it is known."""

    def __init__(
        self,
        conn: _Pipe,
        handler: Handler,
        ordering: Ordering,
        concurrency: int,
        retry: RetryPolicy,
    ) -> None:
        super().__init__(conn, retry)
        self._handler: Any = handler
        self._ordering = ordering
        self._concurrency = concurrency
        self._ready: asyncio.Queue[_Job | None] = asyncio.Queue()
        # Scopes with an event running or waiting for a retry, and the events behind it.
        self._behind: dict[Hashable, deque[_Job]] = {}
        self._retries: dict[_Job, asyncio.TimerHandle] = {}
        self._outbox: list[tuple[int, int, Failure | None]] = []
        self._flush_due = False

    async def serve(self) -> None:
        loop = asyncio.get_running_loop()
        self._start_reading(lambda message: loop.call_soon_threadsafe(self._take, message))
        await asyncio.gather(*(self._runner() for _ in range(self._concurrency)))

    def _take(self, message: Any) -> None:
        if message is None:
            for _ in range(self._concurrency):
                self._ready.put_nowait(None)
        elif isinstance(message, Parts):
            for part in message.parts:
                for job in self._jobs(part):
                    if not self._admit(job):
                        continue
                    if job.record.attempt > 1:  # resent after a worker died: a retry
                        self._retry_after(job, self._retry.delay(job.record.attempt - 1))
                    else:
                        self._ready.put_nowait(job)
        elif isinstance(message, Drop):
            self._drop_bounds(message)
            for job in [job for job in self._retries if self._is_dropped(job)]:
                self._retries.pop(job).cancel()
                self._ready.put_nowait(job)
        else:
            task_id: int = message[0]
            items: list[tuple[WireRecord, int]] = message[1]
            for index, (wire, attempt) in enumerate(items):
                scope = scope_of(self._ordering, wire[0], wire[1], wire[3])
                job = _Job(task_id, index, Record(*wire, attempt=attempt), scope, False)
                if self._admit(job):
                    self._ready.put_nowait(job)

    def _admit(self, job: _Job) -> bool:
        """True if `job` may start now; else it waits behind its scope's running one."""
        if job.scope is None:
            return True
        waiting = self._behind.get(job.scope)
        if waiting is not None:
            waiting.append(job)
            return False
        self._behind[job.scope] = deque()
        return True

    async def _runner(self) -> None:
        while (job := await self._ready.get()) is not None:
            while job is not None:
                job = await self._step(job)

    async def _step(self, job: _Job) -> _Job | None:
        """Settle `job`; the next event of its scope to run now, if any."""
        if job.keyed and self._is_dropped(job):
            self._drop(job)
            self._schedule_flush()
            return self._next_of(job.scope)
        failure: Failure | None = None
        try:
            await self._handler(job.record)
        except Exception as exc:
            failure = _failure(exc)
        self._schedule_flush()
        if job.keyed:
            delay = self._settle(job, failure)
            if delay is not None:
                self._retry_after(job, delay)
                return None
            return self._next_of(job.scope)
        self._outbox.append((job.ident, job.index, failure))
        if failure is None:
            return self._next_of(job.scope)
        # Its scope is held: the rest go back to the scheduler, in order, for the retry.
        for following in self._behind.pop(job.scope, ()):
            self._outbox.append((following.ident, following.index, SKIPPED))
        return None

    def _next_of(self, scope: Hashable) -> _Job | None:
        if scope is None:
            return None
        waiting = self._behind[scope]
        if waiting:
            return waiting.popleft()
        del self._behind[scope]
        return None

    def _retry_after(self, job: _Job, delay: float) -> None:
        loop = asyncio.get_running_loop()
        self._retries[job] = loop.call_later(delay, self._retry_due, job)

    def _retry_due(self, job: _Job) -> None:
        del self._retries[job]
        self._ready.put_nowait(job)

    def _schedule_flush(self) -> None:
        if not self._flush_due:
            self._flush_due = True
            asyncio.get_running_loop().call_later(_REPORT_EVERY_S, self._flush)

    def _flush(self) -> None:
        self._flush_due = False
        if self._outbox:
            done, self._outbox = self._outbox, []
            self._send(done)
        report = self._report()
        if report is not None:
            self._send(report)


class _Worker:
    __slots__ = ("conn", "handoff", "parts", "process", "progress", "started", "task_id", "tasks")

    def __init__(
        self, process: BaseProcess, conn: Connection, progress: Any, handoff: Handoff
    ) -> None:
        self.process = process
        self.conn = conn
        self.progress = progress
        self.handoff = handoff
        self.task_id: int | None = None
        # An async worker's tasks: events not yet reported per task.
        self.tasks: dict[int, int] = {}
        # Events of parts handed to it and not settled yet.
        self.parts = 0
        self.started = False


class WorkerPool:
    """A fixed number of worker processes, replaced when one dies, kept across rebalances."""

    def __init__(
        self,
        size: int,
        handler: HandlerRef,
        ordering: Ordering,
        start_method: str,
        *,
        concurrency: int,
        retry: RetryPolicy,
    ) -> None:
        if size < 1:
            raise ValueError(f"workers={size}: at least one worker is needed")
        self.concurrent = is_async(resolve_handler(handler))
        # Events one worker runs at once: a plain function runs one batch at a time.
        self.concurrency = concurrency if self.concurrent else 1
        self._context: Any = multiprocessing.get_context(start_method)
        self._handler = handler
        self._ordering = ordering
        self._retry = retry
        self._workers = [self._spawn() for _ in range(size)]

    def _spawn(self) -> _Worker:
        parent_conn, child_conn = self._context.Pipe()
        progress = self._context.Value("q", -1, lock=False)
        ring = self._context.RawArray("b", _HANDOFF_BYTES)
        process = self._context.Process(
            target=_worker_main,
            args=(child_conn, self._handler, self._ordering, progress, self.concurrency),
            kwargs={"ring": ring, "retry": self._retry},
            name="eventspool-worker",
            daemon=True,
        )
        process.start()
        child_conn.close()
        return _Worker(process, parent_conn, progress, Handoff(ring))

    @property
    def size(self) -> int:
        return len(self._workers)

    def idle(self) -> list[int]:
        """Workers that take a batch now."""
        return [i for i in range(len(self._workers)) if self.room(i)]

    def room(self, index: int) -> int:
        """Events worker `index` takes now: a plain worker a whole batch when idle, an
        async one as many as it has free handler slots."""
        worker = self._workers[index]
        if self.concurrent:
            # Twice its slots: a slot that frees starts the next event at once, without
            # waiting for the report to reach the parent and a new batch to come back.
            return max(2 * self.concurrency - sum(worker.tasks.values()), 0)
        return 0 if worker.task_id is not None else 1 << 30

    def busy(self) -> int:
        return sum(1 for worker in self._workers if self._busy(worker))

    @staticmethod
    def _busy(worker: _Worker) -> bool:
        return worker.task_id is not None or bool(worker.tasks) or worker.parts > 0

    def pids(self) -> list[int | None]:
        return [worker.process.pid for worker in self._workers]

    def submit(self, index: int, task_id: int, items: list[tuple[WireRecord, int]]) -> None:
        worker = self._workers[index]
        if self.concurrent:
            worker.tasks[task_id] = len(items)
        else:
            worker.task_id = task_id
            worker.progress.value = -1
        # A dead worker's pipe refuses the task; collect() reports the death with it.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError, EOFError):
            worker.conn.send((task_id, items))

    def send_parts(self, index: int, parts: list[PartWire], events: int) -> None:
        """Hand parts (`events` in all) to worker `index` in one transfer; it reports them
        in `Progress`."""
        worker = self._workers[index]
        worker.parts += events
        put = worker.handoff.put
        wire: list[SentPart] = []
        for part_id, topic, partition, packed, attempts in parts:
            if isinstance(packed, bytes) and (start := put(packed)) is not None:
                wire.append((part_id, topic, partition, InRing(start, len(packed)), attempts))
            else:
                wire.append((part_id, topic, partition, packed, attempts))
        with contextlib.suppress(BrokenPipeError, ConnectionResetError, EOFError):
            worker.conn.send(SentParts(wire))

    def drop(self, bounds: dict[TopicPartitionKey, int]) -> None:
        """Tell every worker to drop the parts' events of revoked partitions."""
        for worker in self._workers:
            if worker.parts:
                with contextlib.suppress(BrokenPipeError, ConnectionResetError, EOFError):
                    worker.conn.send(Drop(bounds))

    def collect(self, timeout: float) -> list[PoolEvent]:
        """Finished tasks and dead workers (already replaced), waiting up to `timeout`."""
        waitables: list[Any] = []
        for worker in self._workers:
            waitables.append(worker.conn)
            waitables.append(worker.process.sentinel)
        ready = set(wait(waitables, timeout))
        if not ready:
            return []
        events: list[PoolEvent] = []
        for index, worker in enumerate(self._workers):
            if worker.conn in ready:
                try:
                    message = worker.conn.recv()
                except (EOFError, OSError):
                    pass
                else:
                    if message == _STARTED:
                        worker.started = True
                    else:
                        events.append(self._received(worker, message))
                    continue
            if worker.conn in ready or worker.process.sentinel in ready:
                events.append(self._replace(index))
        return events

    @staticmethod
    def _received(worker: _Worker, message: Any) -> PoolEvent:
        if isinstance(message, Progress):
            worker.parts -= message.settled
            return message
        if isinstance(message, list):
            for task_id, _index, _failure in message:
                left = worker.tasks[task_id] - 1
                if left:
                    worker.tasks[task_id] = left
                else:
                    del worker.tasks[task_id]
            return EventsDone(message)
        task_id, failures = message
        worker.task_id = None
        return TaskDone(task_id, failures)

    def _replace(self, index: int) -> WorkerDied:
        """Start a new worker in place of a dead one; raise WorkerStartError for one that
        exited by itself before it started, since its replacement would too (one killed
        by a signal says nothing about the next)."""
        worker = self._workers[index]
        worker.process.join(_STOP_JOIN_TIMEOUT)
        exitcode = worker.process.exitcode
        if not worker.started and exitcode is not None and exitcode >= 0:
            raise WorkerStartError(
                f"a worker process exited (code {exitcode}) before it could "
                "run the handler; its traceback is on standard error. If that is "
                "multiprocessing's RuntimeError about the bootstrapping phase, the consumer "
                "was started when the main module was imported: start it under "
                '`if __name__ == "__main__":`'
            )
        died = WorkerDied(
            index,
            worker.task_id,
            worker.progress.value,
            worker.process.exitcode,
            tuple(worker.tasks),
        )
        worker.conn.close()
        self._workers[index] = self._spawn()
        return died

    def stop(self, timeout: float = _STOP_JOIN_TIMEOUT) -> None:
        """Let idle workers exit; kill the ones still busy (their work is abandoned)."""
        for worker in self._workers:
            if not self._busy(worker):
                with contextlib.suppress(OSError):
                    worker.conn.send(None)
            else:
                worker.process.kill()
        for worker in self._workers:
            worker.process.join(timeout)
            if worker.process.is_alive():
                worker.process.kill()
                worker.process.join()
            worker.conn.close()
