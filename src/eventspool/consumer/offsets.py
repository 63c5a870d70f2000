"""Which offsets may be committed, and when.

A worker pool finishes events out of order; Kafka stores one committed offset per
partition, meaning "everything below this is done". Committing anything past the first
unfinished event would lose it on a restart, so each partition commits only the end of
its longest finished prefix.
"""

from __future__ import annotations

from collections import deque

from eventspool.clock import Clock


class PartitionOffsets:
    """The offsets of one partition that were handed out and which of them are finished.

    Offsets are tracked in ranges, each finished as a whole: a single event, or a run of
    events from one poll that is accounted as one. Ranges must be added in increasing
    order (as a partition delivers them); they need not be contiguous (compaction and
    transaction markers leave holes in real logs).
    """

    __slots__ = ("_committed", "_done", "_outstanding", "_received_end")

    def __init__(self, committed: int | None = None) -> None:
        self._outstanding: deque[tuple[int, int]] = deque()
        self._done: set[tuple[int, int]] = set()
        self._committed = committed
        self._received_end: int | None = committed

    @property
    def received_end(self) -> int | None:
        """The offset after the last one received: anything below it is a stale refetch."""
        return self._received_end

    def add(self, offset: int) -> bool:
        """Track a newly received offset; False for one already seen (a stale refetch)."""
        if self._received_end is not None and offset < self._received_end:
            return False
        self.add_range(offset, offset + 1)
        return True

    def add_range(self, first: int, end: int) -> None:
        """Track offsets [first, end), finished together by `finish(first, end)`; the
        caller has checked that `first` is not below `received_end`."""
        self._outstanding.append((first, end))
        self._received_end = end

    def finish(self, first: int, end: int | None = None) -> None:
        """Mark the range [first, end) done (one offset without `end`). A range not
        outstanding is a no-op: one forgotten and fetched again may come back cut
        differently, and only the same range holds the same events."""
        span = (first, first + 1 if end is None else end)
        outstanding = self._outstanding
        if not outstanding or first < outstanding[0][0]:
            return
        if span == outstanding[0]:
            outstanding.popleft()
            done = self._done
            while outstanding and outstanding[0] in done:
                done.discard(outstanding.popleft())
        elif first > outstanding[0][0]:
            self._done.add(span)

    def forget_from(self, offset: int) -> None:
        """Drop outstanding ranges from `offset` on: they will be fetched again after a seek."""
        while self._outstanding and self._outstanding[-1][0] >= offset:
            self._done.discard(self._outstanding.pop())
        self._received_end = offset

    @property
    def outstanding(self) -> int:
        """Ranges not finished, or finished behind an unfinished one."""
        return len(self._outstanding)

    @property
    def committed(self) -> int | None:
        return self._committed

    @property
    def position(self) -> int | None:
        """The first offset not finished yet: where a restart would begin."""
        return self._outstanding[0][0] if self._outstanding else self._received_end

    def committable(self) -> int | None:
        """The offset to commit now (the first unfinished one), or None if it would not move."""
        end = self.position
        if end is None or (self._committed is not None and end <= self._committed):
            return None
        return end

    def mark_committed(self, offset: int) -> None:
        """Asynchronous commits may report back after a later blocking one: keep the
        furthest."""
        if self._committed is None or offset > self._committed:
            self._committed = offset


class CommitPolicy:
    """Commit after `every_n` finished events or `every_s` seconds, whichever comes first.

    A commit that failed, or whose offset an older commit overwrote, is due again
    `every_s` after it was sent even if no event finished since: once the last event
    finished, nothing else would count towards the next commit.
    """

    __slots__ = ("_clock", "_every_n", "_every_s", "_finished", "_last", "_retry")

    def __init__(self, every_n: int, every_s: float, clock: Clock) -> None:
        if every_n < 1 or every_s <= 0:
            raise ValueError(f"commit every {every_n} events / {every_s} s: both must be positive")
        self._every_n = every_n
        self._every_s = every_s
        self._clock = clock
        self._finished = 0
        self._retry = False
        self._last = clock.monotonic()

    def finished(self, count: int = 1) -> None:
        self._finished += count

    def retry(self) -> None:
        """A commit did not store its offsets: commit again after the interval."""
        self._retry = True

    def due(self) -> bool:
        if self._finished >= self._every_n:
            return True
        waiting = self._finished > 0 or self._retry
        return waiting and self._clock.monotonic() - self._last >= self._every_s

    def committed(self) -> None:
        """A commit was sent: count from here."""
        self._finished = 0
        self._retry = False
        self._last = self._clock.monotonic()
