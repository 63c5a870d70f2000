"""What both kinds of worker loop share: the pipe they talk over, one event as a job,
a failure's report, and the bookkeeping of parts (what is left to settle, what to
report, which revoked partitions to drop, when a failed event is retried)."""

from __future__ import annotations

import contextlib
import os
import threading
import traceback
from collections.abc import Callable, Hashable, Iterable
from typing import Any, Protocol

from eventspool._core.native import decode_part
from eventspool.consumer.messages import Drop, Failure, PartWire, Progress
from eventspool.consumer.record import Record, record_from_raw
from eventspool.consumer.scheduler import TopicPartitionKey
from eventspool.consumer.settings import RetryPolicy

_MAX_TRACEBACK = 4000


class Pipe(Protocol):
    """What a worker's loop uses of its end of the pipe."""

    def send(self, obj: Any) -> None: ...

    def recv(self) -> Any: ...


def failure_of(exc: Exception) -> Failure:
    """A handler's exception as it crosses the pipe: plain strings, the traceback's end
    kept (it ends up in a log line and a dead letter's header)."""
    text = "".join(traceback.format_exception(exc))[-_MAX_TRACEBACK:]
    return (type(exc).__qualname__, str(exc), text)


class Job:
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


def part_jobs(
    part_id: int, topic: str, partition: int, records: Iterable[Record], first: int
) -> list[Job]:
    """A job for each of a part's records, the first of them at index `first`."""
    return [
        Job(part_id, index, record, (topic, partition, record.key), True)
        for index, record in enumerate(records, first)
    ]


class WorkerLoop:
    """What both kinds of worker share: reading transfers and, for parts, which events
    of each are still to settle, what to report, which revoked partitions to drop, and
    when a failed event is retried."""

    def __init__(self, conn: Pipe, retry: RetryPolicy) -> None:
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

    def _jobs(self, part: PartWire) -> list[Job]:
        part_id, topic, partition, _, _ = part
        return part_jobs(part_id, topic, partition, self._records(part), 0)

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

    def _is_dropped(self, job: Job) -> bool:
        return self._part_dropped(job.record.topic, job.record.partition, job.ident)

    def _part_dropped(self, topic: str, partition: int, part_id: int) -> bool:
        """Part `part_id` is of a revoked partition, handed over before the revoke."""
        if not self._bounds:
            return False
        bound = self._bounds.get((topic, partition))
        return bound is not None and part_id <= bound

    def _settle(self, job: Job, failure: Failure | None) -> float | None:
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

    def _drop(self, job: Job) -> None:
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
