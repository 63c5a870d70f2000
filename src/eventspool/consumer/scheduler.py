"""Which buffered events may run now, under the chosen ordering.

Ordering is kept by *scopes*: events of one scope run one batch at a time, in offset
order, and a scope whose head is waiting for a retry holds back everything behind it.
A batch may carry several events of one scope, because a worker runs a batch in order.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Hashable
from dataclasses import dataclass, field
from enum import StrEnum

from eventspool.consumer.record import WireRecord

TopicPartitionKey = tuple[str, int]


class Ordering(StrEnum):
    KEY = "key"
    PARTITION = "partition"
    UNORDERED = "unordered"


def scope_of(ordering: Ordering, topic: str, partition: int, key: bytes | None) -> Hashable:
    """The unit that must not run concurrently; None means "no constraint".

    Keyless events have no order in Kafka beyond their partition, so in `key` mode they
    run freely.
    """
    if ordering is Ordering.KEY:
        return None if key is None else (topic, partition, key)
    if ordering is Ordering.PARTITION:
        return (topic, partition)
    return None


@dataclass(slots=True)
class Pending:
    """A buffered event: its record, how often a handler has failed on it, and until when
    it must wait before the next attempt."""

    wire: WireRecord
    attempt: int = 1
    not_before: float = 0.0
    scope: Hashable = field(default=None)

    @property
    def offset(self) -> int:
        return self.wire[2]


class Scheduler:
    """Waiting events per partition in offset order, and the scopes that are running."""

    def __init__(self, ordering: Ordering) -> None:
        self._ordering = ordering
        self._waiting: dict[TopicPartitionKey, list[Pending]] = {}
        self._running: Counter[Hashable] = Counter()
        self._count = 0
        self._rotation = 0

    @property
    def ordering(self) -> Ordering:
        return self._ordering

    @property
    def waiting(self) -> int:
        return self._count

    def add(self, wire: WireRecord) -> Pending:
        """Buffer a newly received event (after every earlier one of its partition)."""
        pending = Pending(wire, scope=scope_of(self._ordering, wire[0], wire[1], wire[3]))
        self._waiting.setdefault((wire[0], wire[1]), []).append(pending)
        self._count += 1
        return pending

    def put_back(self, pending: Pending) -> None:
        """Return an event that did not finish, in its offset position."""
        queue = self._waiting.setdefault((pending.wire[0], pending.wire[1]), [])
        bisect.insort(queue, pending, key=lambda p: p.offset)
        self._count += 1

    def take(self, limit: int, now: float) -> list[Pending]:
        """Up to `limit` events that may start now; their scopes count as running."""
        batch: list[Pending] = []
        partitions = list(self._waiting)
        if not partitions:
            return batch
        self._rotation = (self._rotation + 1) % len(partitions)
        for tp in partitions[self._rotation :] + partitions[: self._rotation]:
            if len(batch) >= limit:
                break
            self._take_from(tp, limit - len(batch), now, batch)
        for pending in batch:
            if pending.scope is not None:
                self._running[pending.scope] += 1
        self._count -= len(batch)
        return batch

    def _take_from(self, tp: TopicPartitionKey, limit: int, now: float, out: list[Pending]) -> None:
        queue = self._waiting[tp]
        running = self._running
        held: set[Hashable] = set()
        kept: list[Pending] = []
        taken = 0
        for index, pending in enumerate(queue):
            if taken >= limit:  # the rest stays as it is: no need to look at it
                kept.extend(queue[index:])
                break
            scope = pending.scope
            blocked = scope is not None and (scope in held or scope in running)
            if blocked or pending.not_before > now:
                if scope is not None:
                    held.add(scope)
                kept.append(pending)
                continue
            out.append(pending)
            taken += 1
        if kept:
            self._waiting[tp] = kept
        else:
            del self._waiting[tp]

    def release(self, pending: Pending) -> None:
        """The event's batch ended (whatever its outcome): its scope may run again."""
        scope = pending.scope
        if scope is not None:
            remaining = self._running[scope] - 1
            if remaining > 0:
                self._running[scope] = remaining
            else:
                del self._running[scope]

    def drop_partition(self, tp: TopicPartitionKey) -> list[Pending]:
        """Forget the waiting events of a partition (revoked, or its commit failed)."""
        dropped = self._waiting.pop(tp, [])
        self._count -= len(dropped)
        return dropped

    def next_due(self) -> float | None:
        """The earliest retry time among waiting events held back by a backoff."""
        times = [p.not_before for q in self._waiting.values() for p in q if p.not_before > 0]
        return min(times) if times else None
