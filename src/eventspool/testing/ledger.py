"""Ledgers of event ids: append-only files, one `EVENT_ID TARGET` line per event.

A line is written with one `os.write` on a file opened with O_APPEND, after the event
was acknowledged (or handled): lines of concurrent writers never interleave, and a
SIGKILL leaves at most one line unwritten, never half of one that is counted. TARGET is
a topic, or `@NAME` for an event published through exchange NAME.

Producers write one file each, a consumer handler one per worker process (`HandlerLedger`);
`LedgerReader` follows any number of them while they grow, so a long run is read once.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from types import TracebackType
from typing import Self

from eventspool.consumer.record import Record

__all__ = ["HandlerLedger", "LedgerReader", "LedgerWriter"]

_READ_CHUNK = 1 << 20


class LedgerWriter:
    """Appends `event_id target` lines to one ledger file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def append(self, event_id: str, target: str) -> None:
        os.write(self._fd, f"{event_id} {target}\n".encode())

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


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

    `counts[target][event_id]` is the number of lines that named the event; a line still
    being written (no newline yet) is read on a later `poll()`.
    """

    def __init__(self, directory: Path, pattern: str) -> None:
        self.directory = directory
        self.pattern = pattern
        self.counts: dict[str, Counter[str]] = {}
        self.lines = 0
        self._offsets: dict[Path, int] = {}

    def poll(self) -> int:
        """Read what was appended since the last call; returns how many lines that was."""
        before = self.lines
        for path in sorted(self.directory.glob(self.pattern)):
            self._read(path)
        return self.lines - before

    def _read(self, path: Path) -> None:
        offset = self._offsets.get(path, 0)
        with path.open("rb") as handle:
            handle.seek(offset)
            while chunk := handle.read(_READ_CHUNK):
                end = chunk.rfind(b"\n") + 1
                if end == 0:
                    break
                for line in chunk[:end].decode().splitlines():
                    event_id, _, target = line.partition(" ")
                    counts = self.counts.get(target)
                    if counts is None:
                        counts = self.counts[target] = Counter()
                    counts[event_id] += 1
                    self.lines += 1
                offset += end
                handle.seek(offset)
        self._offsets[path] = offset

    def ids(self, target: str) -> set[str]:
        """Every event id written for `target`."""
        return set(self.counts.get(target, ()))
