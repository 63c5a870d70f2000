"""Worker processes that run handlers, so a slow or CPU-bound handler never holds the
poll thread (or the GIL it needs to keep the group membership alive).

Each worker takes one batch at a time over its own pipe and runs it in order. Before
each event it writes the event's index into shared memory, so when a worker dies the
pool knows which event killed it, which ones finished and which never started.
"""

from __future__ import annotations

import contextlib
import importlib
import multiprocessing
import signal
import traceback
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any

from eventspool.consumer.record import Record, WireRecord
from eventspool.consumer.scheduler import Ordering, scope_of
from eventspool.errors import EventspoolError

Handler = Callable[[Record], object]
HandlerRef = str | Handler
# (error type, message, traceback text); SKIPPED marks an event held back by its scope.
Failure = tuple[str, str, str]
SKIPPED: Failure = ("", "", "")
_MAX_TRACEBACK = 4000
_STOP_JOIN_TIMEOUT = 5.0


class HandlerError(EventspoolError):
    """The handler reference cannot be resolved to a callable."""


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
class WorkerDied:
    """A worker exited: events of its task before `index` finished, the one at `index`
    was running (-1: none had started; the task's length: all had finished)."""

    task_id: int | None
    index: int
    exitcode: int | None


PoolEvent = TaskDone | WorkerDied


def _worker_main(
    conn: Connection, handler_ref: HandlerRef, ordering: Ordering, progress: Any
) -> None:
    # The parent decides when in-flight work stops; a terminal's Ctrl-C or a service
    # manager's SIGTERM to the whole group must not cut a handler short behind its back.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    handler = resolve_handler(handler_ref)
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
            text = "".join(traceback.format_exception(exc))[-_MAX_TRACEBACK:]
            failures[index] = (type(exc).__qualname__, str(exc), text)
            failed_scope = scope_of(ordering, wire[0], wire[1], wire[3])
            if failed_scope is not None:
                held.add(failed_scope)
    progress.value = len(items)
    return failures or None


class _Worker:
    __slots__ = ("conn", "process", "progress", "task_id")

    def __init__(self, process: BaseProcess, conn: Connection, progress: Any) -> None:
        self.process = process
        self.conn = conn
        self.progress = progress
        self.task_id: int | None = None


class WorkerPool:
    """A fixed number of worker processes, replaced when one dies, kept across rebalances."""

    def __init__(
        self, size: int, handler: HandlerRef, ordering: Ordering, start_method: str
    ) -> None:
        if size < 1:
            raise ValueError(f"workers={size}: at least one worker is needed")
        resolve_handler(handler)
        self._context: Any = multiprocessing.get_context(start_method)
        self._handler = handler
        self._ordering = ordering
        self._workers = [self._spawn() for _ in range(size)]

    def _spawn(self) -> _Worker:
        parent_conn, child_conn = self._context.Pipe()
        progress = self._context.Value("q", -1, lock=False)
        process = self._context.Process(
            target=_worker_main,
            args=(child_conn, self._handler, self._ordering, progress),
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
        return [i for i, worker in enumerate(self._workers) if worker.task_id is None]

    def busy(self) -> int:
        return sum(1 for worker in self._workers if worker.task_id is not None)

    def pids(self) -> list[int | None]:
        return [worker.process.pid for worker in self._workers]

    def submit(self, index: int, task_id: int, items: list[tuple[WireRecord, int]]) -> None:
        worker = self._workers[index]
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
                    task_id, failures = worker.conn.recv()
                except (EOFError, OSError):
                    pass
                else:
                    worker.task_id = None
                    events.append(TaskDone(task_id, failures))
                    continue
            if worker.conn in ready or worker.process.sentinel in ready:
                events.append(self._replace(index))
        return events

    def _replace(self, index: int) -> WorkerDied:
        worker = self._workers[index]
        worker.process.join(_STOP_JOIN_TIMEOUT)
        died = WorkerDied(worker.task_id, worker.progress.value, worker.process.exitcode)
        worker.conn.close()
        self._workers[index] = self._spawn()
        return died

    def stop(self, timeout: float = _STOP_JOIN_TIMEOUT) -> None:
        """Let idle workers exit; kill the ones still busy (their work is abandoned)."""
        for worker in self._workers:
            if worker.task_id is None:
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
