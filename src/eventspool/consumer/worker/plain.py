"""A plain function's worker loop: one event at a time, tasks whole as they come, parts'
events in arrival order (a failed event holds back its key's later ones until its retry
settles), with reports batched while it is busy."""

from __future__ import annotations

import heapq
import itertools
import queue
import time
from collections import deque
from collections.abc import Hashable
from typing import Any

from eventspool._core.native import PartRecords
from eventspool.consumer.handler import Handler
from eventspool.consumer.messages import SKIPPED, Drop, Failure, Parts
from eventspool.consumer.record import Record, WireRecord
from eventspool.consumer.scheduler import Ordering, scope_of
from eventspool.consumer.settings import RetryPolicy
from eventspool.consumer.worker.loop import Job, Pipe, WorkerLoop, failure_of, part_jobs

# A plain worker reports at most this often while it is busy (an idle one at once): each
# report wakes the poll thread and costs it tens of microseconds, and with cheap handlers
# the reports of two workers every 2 ms took a tenth of its time. With slow events it waits
# longer, up to _REPORT_MAX_WAIT_S, for a report to carry about _REPORT_EVENTS of them, so
# handlers that need the whole machine do not pay that per event.
_REPORT_MIN_WAIT_S = 0.005
_REPORT_EVENTS = 100
_REPORT_MAX_WAIT_S = 0.02


def run_batch(
    handler: Handler, ordering: Ordering, items: list[tuple[WireRecord, int]], progress: Any
) -> dict[int, Failure] | None:
    """Run a task's events in order, writing each one's index into `progress` first so
    the pool knows which event a death interrupted; a failed event's scope skips the
    rest of the task (SKIPPED), which the poll thread puts back in line behind it."""
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
            failures[index] = failure_of(exc)
            failed_scope = scope_of(ordering, wire[0], wire[1], wire[3])
            if failed_scope is not None:
                held.add(failed_scope)
    progress.value = len(items)
    return failures or None


class PartRun:
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

    def jobs(self) -> list[Job]:
        """The events still to run, one job each; this uses `records` up, so the run
        is done with once they are taken."""
        return part_jobs(self.ident, self.topic, self.partition, self.records, self.next)


class PlainWorker(WorkerLoop):
    """A plain function's worker: one event at a time. Tasks run whole, as they come;
    parts' events run in arrival order, except that a failed event holds back its key's
    later ones until its retry settles."""

    def __init__(
        self,
        conn: Pipe,
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
        self._ready: deque[Job | PartRun] = deque()
        # Keys whose event waits for a retry, and their later events behind it.
        self._held: dict[Hashable, deque[Job]] = {}
        self._timers: list[tuple[float, int, Job]] = []
        self._timer_ids = itertools.count()

    def serve(self) -> None:
        self._start_reading(self._inbox.put)
        report_due = time.monotonic() + _REPORT_MIN_WAIT_S
        while (work := self._next()) is not None:
            if isinstance(work, PartRun):
                self._run_part(work, report_due)
            else:
                self._run(work)
            now = time.monotonic()
            if now >= report_due:
                report_due = now + self._report_interval()
                self._flush()

    def _next(self) -> Job | PartRun | None:
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
                if isinstance(work, PartRun):
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
                    run = PartRun(part_id, topic, partition, PartRecords(packed, topic, partition))
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
            self._send((task_id, run_batch(self._handler, self._ordering, items, self._progress)))
        return True

    def _hold(self, job: Job, delay: float) -> None:
        """Retry `job` after `delay`; its key's later events wait behind it."""
        self._held.setdefault(job.scope, deque())
        heapq.heappush(self._timers, (time.monotonic() + delay, next(self._timer_ids), job))

    def _run(self, job: Job) -> None:
        if self._is_dropped(job):
            self._drop(job)
            self._release(job.scope)
            return
        started = time.perf_counter()
        failure: Failure | None = None
        try:
            self._handler(job.record)
        except Exception as exc:
            failure = failure_of(exc)
        self._busy_s += time.perf_counter() - started
        self._handled += 1
        delay = self._settle(job, failure)
        if delay is not None:
            self._hold(job, delay)
        elif self._held:
            self._release(job.scope)

    def _run_part(self, run: PartRun, report_due: float) -> None:
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
                failure = failure_of(exc)
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
            job = Job(run.ident, index, record, (run.topic, run.partition, record.key), True)
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
