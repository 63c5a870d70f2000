"""The spool's disk budget: how many bytes of queue files, and how many topics, it may hold.

The bytes are those allocated on disk (st_blocks): every segment file is preallocated,
so one made-up topic name costs a segment. The budget is asked when a queue file would
be created, never on the write path:

- a new topic's first segment: refused with `SpoolBudgetError` (the agent answers
  OVER_BUDGET, HTTP 507) when it would go over the budget or `max_topics`;
- a known topic's first segment of another partition (a count Kafka decides, not the
  caller): counted, never refused, so events of a topic already served never are;
- a further segment of a queue with a backlog (segments.py): made only if it fits;
  otherwise that queue is full and its full-queue policy applies.

Files already on disk count from the start, so a lowered budget refuses new topics and
growth until enough are gone.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from eventspool.clock import Clock
from eventspool.errors import SpoolBudgetError
from eventspool.spool.ring import allocated_bytes

log = logging.getLogger("eventspool.spool")

# One warning per this many seconds at most, however many sends are refused.
_LOG_EVERY_S = 60.0


class SegmentSpace(Protocol):
    """Where a queue asks for disk: this budget, as registry.py shows it to one queue."""

    def first(self, path: Path, make: Callable[[], int]) -> int:
        """Run `make` to create a queue's first segment at `path`; the bytes it takes on
        disk, which `make` returns.

        Raises SpoolBudgetError when the budget refuses it.
        """

    def grow(self, path: Path, size: int, make: Callable[[], int]) -> int | None:
        """Run `make` for a further segment of `size` bytes if the budget has room; its
        allocated bytes, or None when it has not."""

    def removed(self, allocated: int) -> None:
        """A segment file of `allocated` bytes was deleted."""


@dataclass(frozen=True, slots=True)
class BudgetUse:
    """What the budget holds now; a limit of None is no limit."""

    used_bytes: int
    max_bytes: int | None
    topics: int
    max_topics: int | None
    refusals: int


class DiskBudget:
    """Counts the queue files under `topics_dir` and admits new ones within the limits."""

    def __init__(
        self, topics_dir: Path, max_bytes: int | None, max_topics: int | None, clock: Clock
    ) -> None:
        self._max_bytes = max_bytes
        self._max_topics = max_topics
        self._clock = clock
        self._lock = threading.Lock()
        self._used = 0
        self._topics: set[str] = set()
        if topics_dir.is_dir():
            for queue_file in topics_dir.glob("*/*.queue"):
                self._used += allocated_bytes(queue_file)
                self._topics.add(queue_file.parent.name)
        self._refusals = 0
        self._next_log = 0.0

    def create(
        self, topic: str, path: Path, size: int, make: Callable[[], int], *, enforce: bool = True
    ) -> int:
        """Run `make` to create a queue's first file at `path`; for a new topic only if
        `size` more bytes and one more topic fit, SpoolBudgetError otherwise. Creations
        are serialised, so two at once cannot both take the last room. Without `enforce`
        (or for a topic that has queues) the file is only counted. `make` returns the
        bytes the file takes on disk, and so does this."""
        with self._lock:
            new_topic = topic not in self._topics
            refusal = self._refusal(topic, size) if enforce and new_topic else None
            if refusal is not None:
                self._refusals += 1
                self._log_refusal(refusal)
                raise SpoolBudgetError(refusal)
            allocated = make()
            self._used += allocated
            self._topics.add(topic)
            return allocated

    def grow(self, path: Path, size: int, make: Callable[[], int]) -> int | None:
        """Run `make` to create a further segment at `path` if `size` more bytes fit:
        the bytes it takes on disk (what `make` returns), or None (the queue is full)
        when they do not."""
        with self._lock:
            if self._max_bytes is not None and self._used + size > self._max_bytes:
                return None
            allocated = make()
            self._used += allocated
            return allocated

    def removed(self, allocated: int) -> None:
        """A queue file that took `allocated` bytes on disk was deleted."""
        with self._lock:
            self._used -= allocated

    def use(self) -> BudgetUse:
        with self._lock:
            return BudgetUse(
                self._used, self._max_bytes, len(self._topics), self._max_topics, self._refusals
            )

    def _refusal(self, topic: str, size: int) -> str | None:
        if self._max_topics is not None and len(self._topics) >= self._max_topics:
            return (
                f"no queue for topic {topic!r}: the spool already holds its maximum of "
                f"{self._max_topics} topics (max_topics); existing topics go on"
            )
        if self._max_bytes is not None and self._used + size > self._max_bytes:
            return (
                f"no queue for topic {topic!r}: its {size} bytes would take the spool's queue "
                f"files to {self._used + size} bytes, over its budget of {self._max_bytes} "
                "(max_spool_bytes); existing queues go on"
            )
        return None

    def _log_refusal(self, refusal: str) -> None:
        now = self._clock.monotonic()
        if now < self._next_log:
            return
        self._next_log = now + _LOG_EVERY_S
        log.warning(
            "%s (%d refusals so far; logged once a minute at most)", refusal, self._refusals
        )
