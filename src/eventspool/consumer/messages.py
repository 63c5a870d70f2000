"""The messages between the poll thread's pool and its worker processes.

Parent to worker, on the worker's pipe:
    (task id, [(wire record, attempt), ...])   a task: run these in order, report once
    SentParts([...])                           parts: key-ordered events, each part's
                                               packed blob usually in the worker's hand-off
                                               ring (`InRing`), else in the message itself
    Drop({(topic, partition): last part id})   forget parts of revoked partitions
    None                                       stop once idle
Worker to parent:
    STARTED                                    the handler resolved; sent once, first
    (task id, {index: Failure} or None)        a plain worker finished a task
    [(task id, index, Failure or None), ...]   an async worker's finished events
    Progress(...)                              what a worker settled of its parts
The pool turns what it receives into `PoolEvent`s for the poll thread, adding
`WorkerDied` for a worker that exited.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from eventspool.consumer.record import RawRecord
from eventspool.consumer.scheduler import TopicPartitionKey

# (error type, message, traceback text); SKIPPED marks an event held back by its scope.
Failure = tuple[str, str, str]
SKIPPED: Failure = ("", "", "")

# A worker's first message: it imported its module and resolved the handler.
STARTED = "started"


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
