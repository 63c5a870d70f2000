"""A queue of small segments for tests, and a disk budget they can exhaust."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from eventspool.clock import SYSTEM_CLOCK
from eventspool.config import FullPolicy, QueueSettings
from eventspool.spool.ring import allocated_bytes
from eventspool.spool.segments import SegmentedQueue
from eventspool.spool.spares import Background

SEGMENT = 64 * 1024


class Space:
    """A disk budget of `limit` allocated bytes (None: no limit), counting like DiskBudget."""

    def __init__(self, limit: int | None = None) -> None:
        self.limit = limit
        self.used = 0

    def first(self, path: Path, make: Callable[[], int]) -> int:
        allocated = make()
        assert allocated == allocated_bytes(path)
        self.used += allocated
        return allocated

    def grow(self, path: Path, size: int, make: Callable[[], int]) -> int | None:
        if self.limit is not None and self.used + size > self.limit:
            return None
        return self.first(path, make)

    def removed(self, allocated: int) -> None:
        self.used -= allocated


def open_queue(
    directory: Path,
    *,
    segments: int = 4,
    policy: FullPolicy = FullPolicy.REJECT,
    space: Space | None = None,
    max_payload: int = 3000,
    block_timeout_s: float = 5.0,
    name: str = "0",
    background: Background | None = None,
) -> SegmentedQueue:
    settings = QueueSettings(
        capacity_bytes=segments * SEGMENT,
        segment_bytes=SEGMENT,
        full_policy=policy,
        block_timeout_s=block_timeout_s,
    )
    return SegmentedQueue(
        directory,
        name,
        settings,
        space or Space(),
        SYSTEM_CLOCK,
        max_payload=max_payload,
        background=background,
    )


def segment_files(directory: Path) -> list[str]:
    return sorted(path.name for path in directory.glob("*.queue*"))
