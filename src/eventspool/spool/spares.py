"""The spare segments of one queue: made ahead of need, or recycled, while it has a backlog.

Creating a segment costs syncs and a page fault per 4 KiB when first written, about as
long as filling it (segments.py tells the whole story). So once a queue has chained,
a background thread makes up to SPARES_AHEAD segments ahead of need, every page
touched and nothing synced, and segments the sender emptied are kept instead of
deleted. A chaining queue takes one, restarts it at its sequence and renames it into
the chain. A spare's name (`<q>.spare.<k>`) is not part of the chain: a crash leaves
one that the next open removes.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

from eventspool._core.native import RingCore
from eventspool.errors import QueueFileError
from eventspool.spool.budget import SegmentSpace
from eventspool.spool.ring import HEADER_SIZE, RingQueue, create_file, fsync_directory
from eventspool.spool.segment_files import SPARE_SUFFIX, Segment

# Spares a queue with a backlog keeps ready: two, as one creation can take longer than
# the writer takes to fill a segment.
SPARES_AHEAD = 2
# Runs a job on another thread (an executor's `submit`): where spare segments are made.
Background = Callable[[Callable[[], None]], object]

log = logging.getLogger("eventspool.spool")


class Spares:
    """The spares of one queue; call every method but the background job with the
    queue's `lock` held. Without `background`, spares are never made nor kept."""

    def __init__(
        self,
        directory: Path,
        name: str,
        *,
        where: str,
        background: Background | None,
        space: SegmentSpace,
        segment_capacity: int,
        fsync: bool,
        lock: threading.Lock,
        open_ring: Callable[[Path], RingQueue],
        delete: Callable[[Segment], None],
    ) -> None:
        self.ready: list[Segment] = []
        self._coming = 0
        self._names = 0
        self._directory = directory
        self._name = name
        self._where = where
        self._background = background
        self._space = space
        self._segment_capacity = segment_capacity
        self._fsync = fsync
        self._lock = lock
        self._open_ring = open_ring
        self._delete = delete

    def take(self, path: Path, start: int, writer: RingCore) -> Segment | None:
        """A spare, started at sequence `start` and renamed to `path`, if there is one."""
        if not self.ready:
            return None
        spare = self.ready.pop(0)
        spare.ring.core.restart(start, writer.dropped, writer.skipped)
        spare.ring.core.sealed = spare.ring.core.drop_oldest = False  # a recycled segment
        os.replace(spare.ring.path, path)
        spare.ring.path = path
        if self._fsync:
            fsync_directory(path.parent)
        return spare

    def want(self, room_for: Callable[[int], bool], needed: Callable[[], bool]) -> None:
        """Have segments made in the background, ahead of need, while a backlog grows.

        `room_for(n)`: whether the queue's maximum leaves room for n more segments;
        `needed()`, asked with the lock held once a spare is made: whether to keep it.
        """
        while self._background is not None and (
            len(self.ready) + self._coming < SPARES_AHEAD
            and room_for(len(self.ready) + self._coming + 1)
        ):
            self._coming += 1
            self._background(functools.partial(self._make, self._path(), needed))

    def _path(self) -> Path:
        self._names += 1
        return self._directory / f"{self._name}{SPARE_SUFFIX}.{self._names}"

    def _make(self, path: Path, needed: Callable[[], bool]) -> None:
        """Create, open and prefault a spare (on the background thread), then offer it.

        Its name is not part of the chain: a crash leaves a spare that the next open
        removes. Nothing is synced (see segments.py).
        """
        spare = None
        try:
            allocated = self._space.grow(
                path,
                HEADER_SIZE + self._segment_capacity,
                lambda: create_file(path, self._segment_capacity, sync=False),
            )
            if allocated is not None:
                spare = Segment(-1, self._open_ring(path), allocated)
                spare.ring.core.prefault()
        except QueueFileError as exc:  # a full disk: the writer meets it, in its own words
            log.info("no spare segment for %s: %s", self._where, exc)
        except Exception:
            log.exception("making a spare segment for %s failed", self._where)
        with self._lock:
            self._coming -= 1
            if spare is None:
                return
            if not needed() or len(self.ready) >= SPARES_AHEAD:
                self._delete(spare)  # not needed any more, or recycled segments came first
            else:
                self.ready.append(spare)

    def recycle(self, emptied: Segment) -> bool:
        """Keep a segment the sender emptied as a spare, if spares are wanted; whether it
        was kept (the caller deletes it otherwise)."""
        if (
            self._background is None
            or len(self.ready) >= SPARES_AHEAD
            or emptied.ring.capacity != self._segment_capacity
        ):
            return False
        path = self._path()
        os.replace(emptied.ring.path, path)
        emptied.ring.path = path
        self.ready.append(emptied)
        return True

    def drop(self) -> None:
        """Delete the spares: the backlog is gone, or the queue closed."""
        while self.ready:
            self._delete(self.ready.pop())
