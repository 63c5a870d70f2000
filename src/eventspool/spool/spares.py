"""The spare segments of one queue: made ahead of need, or recycled, while it has a backlog.

Creating a segment costs syncs and a page fault per 4 KiB when first written, about as
long as filling it (segments.py tells the whole story). So once a queue has chained,
a background thread makes up to SPARES_MADE_AHEAD segments ahead of need, every page
touched and nothing synced, and segments the sender emptied are kept instead of
deleted. A chaining queue takes the one made ready last, restarts it at its sequence and
renames it into the chain. A spare's name (`<q>.spare.<k>`) is not part of the chain: a
crash leaves one that the next open removes.

A page that writeback cleaned is read-only in the mapping again, so the first write to
it faults, though it was touched before: after each chain, the next spare is faulted in
writable by a compiled thread that never takes the interpreter lock
(RingCore.start_fault_in), so that the writer does not fault once per 4 KiB (all of a
recycled segment's pages, after a writeback). A job of the background thread did it
too, but each time it needed the interpreter lock, the writer gave it up, and the
sender's thread often had it next, for a switch interval.

The writer holds the interpreter lock while it appends, so a thread that lets go of it
waits up to a switch interval to have it back. A spare is therefore created, reserved,
mapped and touched in one compiled call that lets go of the lock once
(segment_files.create_spare_ring): made in Python steps, each syscall such a wait, spares came
later than the writer needed them, and it made its next segments itself. For the same
reason the renames done under the queue's lock keep the interpreter lock.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

from eventspool._core.native import RingCore, rename_holding_gil
from eventspool.errors import QueueFileError
from eventspool.spool.budget import SegmentSpace
from eventspool.spool.ring import HEADER_SIZE, RingQueue, fsync_directory
from eventspool.spool.segment_files import SPARE_SUFFIX, Segment

# Spares a queue with a backlog keeps: segments the sender emptied, at least four and as
# many as its chain held more segments at its longest during this backlog (it may grow
# back to that, and a recycled segment is mapped with every page touched already), but
# only two made ahead of need. A spare made while the sender was emptying segments came
# before or after a recycled one, and one of the two was deleted again: a creation and a
# deletion per chain, a page fault per 4 KiB each, on a core the writer needs.
SPARES_KEPT = 4
SPARES_MADE_AHEAD = 2
# Recycled spares beyond SPARES_KEPT that no chain took for this long are deleted.
SPARES_TRIM_S = 30.0
# How long a writer that found no spare waits for one being made before it makes its own.
SPARE_WAIT_S = 0.05
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
        create_ring: Callable[[Path], tuple[RingQueue, int]],
        delete: Callable[[Segment], None],
    ) -> None:
        self.ready: list[Segment] = []
        self._coming = 0
        self._longest = 0  # the most segments the chain held during this backlog
        self._fewest = 0  # the fewest spares ready since the last trim
        self._trimmed_at: float | None = None
        self._names = 0
        self._directory = directory
        self._name = name
        self._where = where
        self._background = background
        self._space = space
        self._segment_capacity = segment_capacity
        self._fsync = fsync
        self._lock = lock
        # Told when a spare is offered, or a making of one ended without it.
        self._arrived = threading.Condition(lock)
        self._create_ring = create_ring
        self._delete = delete

    def take(self, path: Path, start: int, writer: RingCore) -> Segment | None:
        """A spare, started at sequence `start` and renamed to `path`, if there is one:
        the one made ready last (the next one faulted in; the others unused, to trim)."""
        if not self.ready:
            return None
        spare = self.ready.pop()
        self._fewest = min(self._fewest, len(self.ready))
        spare.ring.core.restart(start, writer.dropped, writer.skipped)
        spare.ring.core.sealed = spare.ring.core.drop_oldest = False  # a recycled segment
        _rename(spare, path)
        if self._fsync:
            fsync_directory(path.parent)
        return spare

    def await_one(self) -> bool:
        """When no spare is ready but one is being made, wait for it, the queue's lock let
        go (at most SPARE_WAIT_S); whether it waited, so the queue may have changed.

        The spare being made comes sooner than the writer could make its own, which would
        also hold the queue's lock meanwhile and leave the one being made unwanted.
        """
        if self.ready or not self._coming:
            return False
        self._arrived.wait(SPARE_WAIT_S)
        return True

    def want(
        self, segments: int, room_for: Callable[[int], bool], needed: Callable[[], bool]
    ) -> None:
        """Have segments made in the background, ahead of need, while a backlog grows.

        `segments`: how many the chain holds now; `room_for(n)`: whether the queue's
        maximum leaves room for n more segments; `needed()`, asked with the lock held once
        a spare is made: whether to keep it.
        """
        self._longest = max(self._longest, segments)
        while self._background is not None and (
            len(self.ready) + self._coming < SPARES_MADE_AHEAD
            and room_for(len(self.ready) + self._coming + 1)
        ):
            self._coming += 1
            self._background(functools.partial(self._make, self._path(), needed))
        if self.ready:
            self.ready[-1].ring.core.start_fault_in()  # the one the next chain takes

    def _path(self) -> Path:
        self._names += 1
        return self._directory / f"{self._name}{SPARE_SUFFIX}.{self._names}"

    def _make(self, path: Path, needed: Callable[[], bool]) -> None:
        """Make a spare (on the background thread), then offer it.

        Its name is not part of the chain: a crash leaves a spare that the next open
        removes. Nothing is synced (see segments.py). None is made when recycled
        segments filled the spares meanwhile: making one costs a page fault per 4 KiB,
        and deleting it again as much, on a core the writer may need. One not wanted
        any more once made is deleted outside the queue's lock: unmapping and unlinking
        take milliseconds that a writer waiting to chain would otherwise wait too.
        """
        with self._lock:
            if not needed() or len(self.ready) >= SPARES_MADE_AHEAD:
                self._coming -= 1
                self._arrived.notify_all()
                return
        made: list[RingQueue] = []

        def create() -> int:
            ring, allocated = self._create_ring(path)
            made.append(ring)
            return allocated

        spare = None
        try:
            allocated = self._space.grow(path, HEADER_SIZE + self._segment_capacity, create)
            if allocated is not None:
                spare = Segment(-1, made[0], allocated)
        except QueueFileError as exc:  # a full disk: the writer meets it, in its own words
            log.info("no spare segment for %s: %s", self._where, exc)
        except Exception:
            log.exception("making a spare segment for %s failed", self._where)
        with self._lock:
            self._coming -= 1
            self._arrived.notify_all()
            if spare is None:
                return
            if needed() and len(self.ready) < SPARES_KEPT:
                self.ready.append(spare)
                return
        self._delete(spare)  # not needed any more, or recycled segments came first

    def recycle(self, emptied: Segment, segments: int) -> bool:
        """Keep a segment the sender emptied as a spare, if spares are wanted (`segments`:
        how many the chain holds without it); whether it was kept (the caller deletes it
        otherwise)."""
        if (
            self._background is None
            or len(self.ready) >= max(SPARES_KEPT, self._longest - segments)
            or emptied.ring.capacity != self._segment_capacity
        ):
            return False
        _rename(emptied, self._path())
        self.ready.append(emptied)
        self._arrived.notify_all()
        return True

    def trim(self, now: float) -> list[Segment]:
        """Spares beyond SPARES_KEPT that no chain took for SPARES_TRIM_S (a backlog that
        was longer once): the caller deletes them once it let go of the queue's lock."""
        if self._trimmed_at is None:
            self._trimmed_at, self._fewest = now, len(self.ready)
        if now - self._trimmed_at < SPARES_TRIM_S:
            return []
        unused = max(0, min(self._fewest, len(self.ready) - SPARES_KEPT))
        trimmed = self.ready[:unused]  # the bottom of the stack: take() pops the top
        del self.ready[:unused]
        self._longest -= len(trimmed)
        self._fewest, self._trimmed_at = len(self.ready), now
        return trimmed

    def drop(self) -> None:
        """Delete the spares: the backlog is gone, or the queue closed."""
        self._arrived.notify_all()
        self._longest, self._trimmed_at = 0, None
        while self.ready:
            self._delete(self.ready.pop())


def _rename(segment: Segment, path: Path) -> None:
    """Rename a segment's file, keeping the interpreter lock: both callers hold the queue's
    lock, and the writer waits for it (rename_holding_gil says why)."""
    error = rename_holding_gil(os.fsencode(segment.ring.path), os.fsencode(path))
    if error:
        raise QueueFileError(
            str(path), f"cannot rename {segment.ring.path.name} to it: {os.strerror(error)}"
        )
    segment.ring.path = path
