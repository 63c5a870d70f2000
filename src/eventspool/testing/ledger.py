"""Ledgers of event ids: what a process was told was acknowledged (or handled), in files
a SIGKILL of that process cannot cut short. The one such record for tests and bench.

A ledger file (little-endian):

    offset  size  field
    0       24    commit slot 0: u64 length, u64 lines, u64 check of the two
    24      24    commit slot 1: the same
    48      ...   lines `EVENT_ID TARGET[ VALUE]\\n` in the order they were appended;
                  TARGET is a topic, or `@NAME` for an event published through exchange
                  NAME; VALUE, when given, is what the writer noted beside the id (a
                  counter, a sequence). None of the three holds a space.

The writer maps the file shared (sparse, `capacity` bytes of lines): every store is in
the page cache the moment it is made and the kernel keeps it when the process dies, so
an append costs no system call and a kill loses nothing committed. Commit-last: a line
is stored before the length that covers it, and commits alternate between the two
slots, so a kill in the middle of one slot's store leaves the other whole (one line
fewer); a slot whose check does not match is torn and ignored.

Producers write one file each, a consumer handler one per worker process (`HandlerLedger`);
`LedgerReader` follows any number of them while they grow, so a long run is read once.
`read_lines` reads one file in order, for a test that checks the steps a killed writer
took, not only what it counted.
"""

from __future__ import annotations

import mmap
import os
import struct
import threading
from collections import Counter
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, NamedTuple, Self

if TYPE_CHECKING:  # only the handler's signature: a writer needs none of the consumer
    from eventspool.consumer.record import Record

__all__ = [
    "HandlerLedger",
    "LedgerFullError",
    "LedgerLine",
    "LedgerReader",
    "LedgerWriter",
    "committed_lines",
    "read_lines",
]

DEFAULT_CAPACITY = 1 << 30  # bytes of lines; the file is sparse, so only what is written
_SLOT = struct.Struct("<QQQ")
_HEADER_BYTES = 2 * _SLOT.size
_MASK = (1 << 64) - 1
_MIX = 0x9E3779B97F4A7C15


def _check(length: int, lines: int) -> int:
    return ((length * _MIX) ^ lines ^ _MASK) & _MASK


def _committed(header: bytes) -> tuple[int, int, int]:
    """(length, lines, slot) of the latest whole commit in a file's header."""
    best = (0, 0, 1)
    if len(header) < _HEADER_BYTES:
        return best
    for slot in (0, 1):
        length, lines, check = _SLOT.unpack_from(header, slot * _SLOT.size)
        if check == _check(length, lines) and length >= best[0]:
            best = (length, lines, slot)
    return best


class LedgerFullError(RuntimeError):
    """More lines were appended than the file was sized for."""


class LedgerLine(NamedTuple):
    """One committed line; `value` is "" where the writer noted nothing beside the id."""

    event_id: str
    target: str
    value: str

    @classmethod
    def parse(cls, line: str) -> LedgerLine:
        event_id, _, rest = line.partition(" ")
        target, _, value = rest.partition(" ")
        return cls(event_id, target, value)


class LedgerWriter:
    """Appends `event_id target` lines to one ledger file; threads may share it."""

    def __init__(self, path: Path, capacity: int = DEFAULT_CAPACITY) -> None:
        """Map `path`, creating it for `capacity` bytes of lines; appends go after any
        lines it holds already (a restarted writer continues its file)."""
        self.path = path
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            size = _HEADER_BYTES + capacity
            if os.fstat(fd).st_size < size:
                os.ftruncate(fd, size)
            self._map: mmap.mmap | None = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self._length, self.lines, self._slot = _committed(self._map[:_HEADER_BYTES])
        self._lock = threading.Lock()

    def append(self, event_id: str, target: str, value: str = "") -> None:
        """Record one event: its line first, then the commit that covers it."""
        line = (f"{event_id} {target} {value}\n" if value else f"{event_id} {target}\n").encode()
        with self._lock:
            if self._map is None:
                raise ValueError(f"{self.path} is closed")
            start = _HEADER_BYTES + self._length
            end = start + len(line)
            if end > len(self._map):
                raise LedgerFullError(f"{self.path} is full; size it larger")
            self._map[start:end] = line
            self._length += len(line)
            self.lines += 1
            self._slot ^= 1
            _SLOT.pack_into(
                self._map,
                self._slot * _SLOT.size,
                self._length,
                self.lines,
                _check(self._length, self.lines),
            )

    def close(self) -> None:
        with self._lock:
            if self._map is not None:
                self._map.close()
                self._map = None

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


def committed_lines(path: Path) -> int:
    """Lines committed to one ledger file so far (0 while it does not exist): a cheap
    look at a writer's progress, without reading its lines."""
    try:
        with path.open("rb") as handle:
            return _committed(handle.read(_HEADER_BYTES))[1]
    except FileNotFoundError:
        return 0


def _committed_text(path: Path, offset: int) -> tuple[str, int]:
    """The committed lines of one file from byte `offset` on, and where they end."""
    with path.open("rb") as handle:
        length = _committed(handle.read(_HEADER_BYTES))[0]
        if length <= offset:
            return "", offset
        handle.seek(_HEADER_BYTES + offset)
        return handle.read(length - offset).decode(), length


def read_lines(path: Path) -> list[LedgerLine]:
    """Every line committed to one ledger file, in the order it was appended."""
    text, _ = _committed_text(path, 0)
    return [LedgerLine.parse(line) for line in text.splitlines()]


_handler_files: dict[Path, LedgerWriter] = {}


class HandlerLedger:
    """A consumer handler that writes each record to `directory/PREFIX-PID.ids`.

    Picklable, so it reaches worker processes; each worker opens its own file on its
    first record. The line is written when the handler runs, so a worker killed after
    it and before the consumer saw the result makes a duplicate, never a gap.
    """

    def __init__(self, directory: Path, prefix: str = "handled") -> None:
        self.directory = directory
        self.prefix = prefix

    def __call__(self, record: Record) -> None:
        path = self.directory / f"{self.prefix}-{os.getpid()}.ids"
        writer = _handler_files.get(path)
        if writer is None:
            writer = _handler_files[path] = LedgerWriter(path)
        writer.append(record.event_id or "-", record.topic)


class LedgerReader:
    """Follows the ledger files `directory/PATTERN` as they grow and are created.

    `counts[target][event_id]` is the number of lines that named the event; a line is
    read once its writer committed it.
    """

    def __init__(self, directory: Path, pattern: str) -> None:
        self.directory = directory
        self.pattern = pattern
        self.counts: dict[str, Counter[str]] = {}
        self.lines = 0
        self._offsets: dict[Path, int] = {}

    def poll(self) -> int:
        """Read what was committed since the last call; returns how many lines that was."""
        before = self.lines
        for path in sorted(self.directory.glob(self.pattern)):
            self._read(path)
        return self.lines - before

    def _read(self, path: Path) -> None:
        text, length = _committed_text(path, self._offsets.get(path, 0))
        if not text:
            return
        for line in text.splitlines():
            event_id, target, _ = LedgerLine.parse(line)
            counts = self.counts.get(target)
            if counts is None:
                counts = self.counts[target] = Counter()
            counts[event_id] += 1
        self.lines += text.count("\n")
        self._offsets[path] = length

    def ids(self, target: str) -> set[str]:
        """Every event id written for `target`."""
        return set(self.counts.get(target, ()))
