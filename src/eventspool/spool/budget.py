"""The spool's disk budget: how many bytes of queue files, and how many topics, it may hold.

Every queue file is preallocated at its full capacity, so one made-up topic name costs
a whole ring on disk. The budget is checked only when a new topic's first queue file
would be created, never on the write path: topics that have queues go on when the
budget is spent, and a new one that would go over it is refused with `SpoolBudgetError`
(the agent answers OVER_BUDGET, HTTP 507). A known topic's further rings (one per
partition, a count Kafka decides, not the caller) are counted but not refused, so events
of a topic already served never are. Files already on disk count from the start, so a
lowered budget refuses new topics until enough are gone.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from eventspool.clock import Clock
from eventspool.errors import SpoolBudgetError

log = logging.getLogger("eventspool.spool")

# One warning per this many seconds at most, however many sends are refused.
_LOG_EVERY_S = 60.0


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
                self._used += queue_file.stat().st_size
                self._topics.add(queue_file.parent.name)
        self._refusals = 0
        self._next_log = 0.0

    def create(
        self, topic: str, path: Path, size: int, make: Callable[[], None], *, enforce: bool = True
    ) -> None:
        """Run `make` to create the queue file at `path`; for a new topic only if `size`
        more bytes and one more topic fit, SpoolBudgetError otherwise. Creations are
        serialised, so two at once cannot both take the last room. Without `enforce` (or
        for a topic that has queues) the file is only counted."""
        with self._lock:
            new_topic = topic not in self._topics
            refusal = self._refusal(topic, size) if enforce and new_topic else None
            if refusal is not None:
                self._refusals += 1
                self._log_refusal(refusal)
                raise SpoolBudgetError(refusal)
            make()
            self._used += path.stat().st_size
            self._topics.add(topic)

    def removed(self, size: int) -> None:
        """A queue file of `size` bytes was deleted (a pending ring, moved)."""
        with self._lock:
            self._used -= size

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
