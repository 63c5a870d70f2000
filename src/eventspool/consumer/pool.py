"""The parent's side of the worker processes: a fixed number of them, replaced when one
dies, kept across rebalances.

The poll thread hands each worker tasks, or all of a poll's key-ordered events for it in
one transfer (parts): their packed records go into the worker's ring of shared memory,
and only where they are into its pipe. The pool tracks what each worker holds, so that
when a worker dies it reports what was unfinished: for a plain worker's task, which
event was running (the worker writes the index of each into shared memory first); for
an async worker, every task and part event it had not reported. The poll thread retries
those.
"""

from __future__ import annotations

import contextlib
import multiprocessing
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any

from eventspool._core.native import Handoff
from eventspool.consumer.handler import HandlerRef, is_async, resolve_handler
from eventspool.consumer.messages import (
    STARTED,
    Drop,
    EventsDone,
    InRing,
    PartWire,
    PoolEvent,
    Progress,
    SentPart,
    SentParts,
    TaskDone,
    WorkerDied,
)
from eventspool.consumer.record import WireRecord
from eventspool.consumer.scheduler import Ordering, TopicPartitionKey
from eventspool.consumer.settings import RetryPolicy
from eventspool.consumer.worker.main import worker_main
from eventspool.errors import EventspoolError

_STOP_JOIN_TIMEOUT = 5.0
# Each worker's hand-off ring: twice what the default window of 200-byte events packs to.
# A blob that does not fit in the room left goes through the pipe instead.
_HANDOFF_BYTES = 4 << 20


class WorkerStartError(EventspoolError):
    """A worker process exited before it could run a handler: starting another would
    fail the same way, and its events are not the handler's fault."""


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
            target=worker_main,
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
                    if message == STARTED:
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
