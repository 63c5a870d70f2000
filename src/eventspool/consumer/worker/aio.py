"""An `async def` handler's worker loop: up to `concurrency` handler calls at once,
each event reported as it finishes, events of one scope still one after the other."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Hashable
from typing import Any

from eventspool.consumer.handler import Handler
from eventspool.consumer.messages import SKIPPED, Drop, Failure, Parts
from eventspool.consumer.record import Record, WireRecord
from eventspool.consumer.scheduler import Ordering, scope_of
from eventspool.consumer.settings import RetryPolicy
from eventspool.consumer.worker.loop import Job, Pipe, WorkerLoop, failure_of

# An async worker reports what finished within this long in one message, not one per event.
_REPORT_EVERY_S = 0.002


class AsyncWorker(WorkerLoop):
    """An async worker's loop: `concurrency` runners take events from one queue, so an
    event costs no task of its own. An event whose scope has one running (or waiting for
    a retry) waits behind it and is run next by the runner of that scope, so one scope's
    events keep their order; each outcome is reported when it is known."""

    def __init__(
        self,
        conn: Pipe,
        handler: Handler,
        ordering: Ordering,
        concurrency: int,
        retry: RetryPolicy,
    ) -> None:
        super().__init__(conn, retry)
        self._handler: Any = handler
        self._ordering = ordering
        self._concurrency = concurrency
        self._ready: asyncio.Queue[Job | None] = asyncio.Queue()
        # Scopes with an event running or waiting for a retry, and the events behind it.
        self._behind: dict[Hashable, deque[Job]] = {}
        self._retries: dict[Job, asyncio.TimerHandle] = {}
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
                job = Job(task_id, index, Record(*wire, attempt=attempt), scope, False)
                if self._admit(job):
                    self._ready.put_nowait(job)

    def _admit(self, job: Job) -> bool:
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

    async def _step(self, job: Job) -> Job | None:
        """Settle `job`; the next event of its scope to run now, if any."""
        if job.keyed and self._is_dropped(job):
            self._drop(job)
            self._schedule_flush()
            return self._next_of(job.scope)
        failure: Failure | None = None
        try:
            await self._handler(job.record)
        except Exception as exc:
            failure = failure_of(exc)
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

    def _next_of(self, scope: Hashable) -> Job | None:
        if scope is None:
            return None
        waiting = self._behind[scope]
        if waiting:
            return waiting.popleft()
        del self._behind[scope]
        return None

    def _retry_after(self, job: Job, delay: float) -> None:
        loop = asyncio.get_running_loop()
        self._retries[job] = loop.call_later(delay, self._retry_due, job)

    def _retry_due(self, job: Job) -> None:
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
