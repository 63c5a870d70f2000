"""Which queues hold events and have not advanced for `stall_after_s`: a stall is
reported (log line, status, /metrics, the agent's /healthz), never silent."""

from __future__ import annotations

import enum
from collections.abc import Collection, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

QueueT = TypeVar("QueueT", bound=Hashable)


@dataclass(frozen=True, slots=True)
class StalledQueue:
    """A queue that holds events and has not advanced for `stalled_s` seconds."""

    topic: str
    partition: int | None
    depth: int
    stalled_s: float


class StallChange(enum.Enum):
    STALLED = "stalled"
    MOVING_AGAIN = "moving again"


class StallDetector(Generic[QueueT]):
    """Each queue's head and since when it has been there; a queue is stalled once it
    held events at the same head for `stall_after_s`, until its head moves or it empties."""

    def __init__(self, stall_after_s: float) -> None:
        self._stall_after_s = stall_after_s
        self._progress: dict[QueueT, tuple[int, float]] = {}  # queue -> (head, since)
        self._stalled: set[QueueT] = set()

    def observe(self, queue: QueueT, head: int, depth: int, now: float) -> StallChange | None:
        """Record where `queue` is; say when it has just stalled or just moved again."""
        mark = self._progress.get(queue)
        if not depth or mark is None or mark[0] != head:
            self._progress[queue] = (head, now)
            if queue in self._stalled:
                self._stalled.discard(queue)
                return StallChange.MOVING_AGAIN
            return None
        if queue not in self._stalled and now - mark[1] >= self._stall_after_s:
            self._stalled.add(queue)
            return StallChange.STALLED
        return None

    def keep_only(self, queues: Collection[QueueT]) -> None:
        """Forget the queues not among `queues` (closed since)."""
        for queue in self._progress.keys() - queues:
            del self._progress[queue]
            self._stalled.discard(queue)

    def stalled_for(self, queue: QueueT, depth: int, now: float) -> float | None:
        """Seconds since a stalled `queue` last advanced; None when it is not stalled."""
        mark = self._progress.get(queue)
        if queue in self._stalled and mark is not None and depth:
            return now - mark[1]
        return None
