"""Worker processes that run handlers, so a slow or CPU-bound handler never holds the
poll thread (or the GIL it needs to keep the group membership alive).

A plain function: each worker takes one batch at a time over its own pipe and runs it
in order. Before each event it writes the event's index into shared memory, so when a
worker dies the pool knows which event killed it, which ones finished and which never
started.

An `async def` handler: each worker runs an event loop with up to `concurrency` handler
calls at once, takes new batches while earlier ones run, and reports each event as it
finishes (the reports of one loop turn in one message), so a slow event holds back
neither the other events of its batch nor the commit of those before it. Events of one
scope (key or partition, by the ordering) still run one after the other, in order.
When such a worker dies, every event it had not reported is retried.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import inspect
import multiprocessing
import signal
import traceback
from collections import deque
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any

from eventspool.consumer.record import Record, WireRecord
from eventspool.consumer.scheduler import Ordering, scope_of
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


class HandlerError(EventspoolError):
    """The handler reference cannot be resolved to a callable."""


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
    """A worker exited: events of its task before `index` finished, the one at `index`
    was running (-1: none had started; the task's length: all had finished). An async
    worker's tasks are all in `tasks`; what it did not report as done was unfinished."""

    task_id: int | None
    index: int
    exitcode: int | None
    tasks: tuple[int, ...] = ()


PoolEvent = TaskDone | EventsDone | WorkerDied


def _worker_main(
    conn: Connection, handler_ref: HandlerRef, ordering: Ordering, progress: Any, concurrency: int
) -> None:
    # The parent decides when in-flight work stops; a terminal's Ctrl-C or a service
    # manager's SIGTERM to the whole group must not cut a handler short behind its back.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    handler = resolve_handler(handler_ref)
    if is_async(handler):
        asyncio.run(_AsyncWorker(conn, handler, ordering, concurrency).serve())
        return
    while True:
        try:
            task = conn.recv()
        except EOFError:
            return
        if task is None:
            return
        task_id, items = task
        conn.send((task_id, _run_batch(handler, ordering, items, progress)))


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


# One event in an async worker: (task id, index in the task, record, attempt, its scope).
_AsyncItem = tuple[int, int, WireRecord, int, Hashable]


class _AsyncWorker:
    """An async worker's loop: `concurrency` runners take events from one queue, so an
    event costs no task of its own. An event whose scope has one running waits behind it
    and is run next by the runner of that scope, so one scope's events keep their order;
    each outcome is reported when it is known."""

    def __init__(
        self, conn: Connection, handler: Handler, ordering: Ordering, concurrency: int
    ) -> None:
        self._conn = conn
        self._handler: Any = handler
        self._ordering = ordering
        self._concurrency = concurrency
        self._ready: asyncio.Queue[_AsyncItem | None] = asyncio.Queue()
        # Scopes with an event running, and the events waiting behind it.
        self._behind: dict[Hashable, deque[_AsyncItem]] = {}
        self._outbox: list[tuple[int, int, Failure | None]] = []

    async def serve(self) -> None:
        loop = asyncio.get_running_loop()
        loop.add_reader(self._conn.fileno(), self._receive)
        await asyncio.gather(*(self._runner() for _ in range(self._concurrency)))

    def _receive(self) -> None:
        try:
            task = self._conn.recv()
        except (EOFError, OSError):
            task = None
        if task is None:
            asyncio.get_running_loop().remove_reader(self._conn.fileno())
            for _ in range(self._concurrency):
                self._ready.put_nowait(None)
            return
        task_id, items = task
        behind, ordering = self._behind, self._ordering
        for index, (wire, attempt) in enumerate(items):
            scope = scope_of(ordering, wire[0], wire[1], wire[3])
            item = (task_id, index, wire, attempt, scope)
            if scope is None:
                self._ready.put_nowait(item)
            elif scope in behind:
                behind[scope].append(item)
            else:
                behind[scope] = deque()
                self._ready.put_nowait(item)

    async def _runner(self) -> None:
        while (item := await self._ready.get()) is not None:
            scope = item[4]
            succeeded = await self._run(item)
            if scope is None:
                continue
            waiting = self._behind[scope]
            while waiting:
                following = waiting.popleft()
                if succeeded:
                    succeeded = await self._run(following)
                else:  # its scope is held: back to the scheduler, in order, for the retry
                    self._report(following[0], following[1], SKIPPED)
            del self._behind[scope]

    async def _run(self, item: _AsyncItem) -> bool:
        task_id, index, wire, attempt, _scope = item
        failure: Failure | None = None
        try:
            await self._handler(Record(*wire, attempt=attempt))
        except Exception as exc:
            failure = _failure(exc)
        self._report(task_id, index, failure)
        return failure is None

    def _report(self, task_id: int, index: int, failure: Failure | None) -> None:
        if not self._outbox:
            asyncio.get_running_loop().call_later(_REPORT_EVERY_S, self._flush)
        self._outbox.append((task_id, index, failure))

    def _flush(self) -> None:
        done, self._outbox = self._outbox, []
        with contextlib.suppress(BrokenPipeError, ConnectionResetError, EOFError):
            self._conn.send(done)


class _Worker:
    __slots__ = ("conn", "process", "progress", "task_id", "tasks")

    def __init__(self, process: BaseProcess, conn: Connection, progress: Any) -> None:
        self.process = process
        self.conn = conn
        self.progress = progress
        self.task_id: int | None = None
        # An async worker's tasks: events not yet reported per task.
        self.tasks: dict[int, int] = {}


class WorkerPool:
    """A fixed number of worker processes, replaced when one dies, kept across rebalances."""

    def __init__(
        self,
        size: int,
        handler: HandlerRef,
        ordering: Ordering,
        start_method: str,
        concurrency: int = 1,
    ) -> None:
        if size < 1:
            raise ValueError(f"workers={size}: at least one worker is needed")
        self.concurrent = is_async(resolve_handler(handler))
        # Events one worker runs at once: a plain function runs one batch at a time.
        self.concurrency = concurrency if self.concurrent else 1
        self._context: Any = multiprocessing.get_context(start_method)
        self._handler = handler
        self._ordering = ordering
        self._workers = [self._spawn() for _ in range(size)]

    def _spawn(self) -> _Worker:
        parent_conn, child_conn = self._context.Pipe()
        progress = self._context.Value("q", -1, lock=False)
        process = self._context.Process(
            target=_worker_main,
            args=(child_conn, self._handler, self._ordering, progress, self.concurrency),
            name="eventspool-worker",
            daemon=True,
        )
        process.start()
        child_conn.close()
        return _Worker(process, parent_conn, progress)

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
        return sum(1 for worker in self._workers if worker.task_id is not None or worker.tasks)

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
                    events.append(self._received(worker, message))
                    continue
            if worker.conn in ready or worker.process.sentinel in ready:
                events.append(self._replace(index))
        return events

    @staticmethod
    def _received(worker: _Worker, message: Any) -> PoolEvent:
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
        worker = self._workers[index]
        worker.process.join(_STOP_JOIN_TIMEOUT)
        died = WorkerDied(
            worker.task_id, worker.progress.value, worker.process.exitcode, tuple(worker.tasks)
        )
        worker.conn.close()
        self._workers[index] = self._spawn()
        return died

    def stop(self, timeout: float = _STOP_JOIN_TIMEOUT) -> None:
        """Let idle workers exit; kill the ones still busy (their work is abandoned)."""
        for worker in self._workers:
            if worker.task_id is None and not worker.tasks:
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
