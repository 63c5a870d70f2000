"""The files of a segmented queue on disk: their names, and the leftovers a crash removes.

Files of a queue `<q>` (a partition number, or `pending`), format version 2 of a spool
directory::

    <q>.queue        segment 0: a version-1 queue is this one file
    <q>.<n>.queue    segment n > 0; numbers only grow, the oldest segment is the lowest
    <q>.spare.<k>    segments kept ahead of need while the queue has a backlog: made in
                     the background (create_spare_ring), or acknowledged segments
                     recycled; not part of the chain (deleted when found at open)
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from eventspool._core.native import MappedFile
from eventspool.clock import Clock
from eventspool.config import QueueSettings
from eventspool.spool.ring import (
    HEADER_SIZE,
    RingQueue,
    SyncObserver,
    creation_error,
    ring_header,
    segment_capacity,
)

SUFFIX = ".queue"
SPARE_SUFFIX = ".spare"
# What ring.create_file writes before renaming it into place.
TMP_SUFFIX = ".tmp"


@dataclass(slots=True)
class Segment:
    """One segment file of a queue, open: its place in the chain (-1 for a spare)."""

    number: int
    ring: RingQueue
    allocated: int


def segment_path(directory: Path, queue: str, number: int) -> Path:
    """The file of segment `number` of queue `queue` (segment 0 keeps the version-1 name)."""
    return directory / (f"{queue}{SUFFIX}" if number == 0 else f"{queue}.{number}{SUFFIX}")


def parse_segment_name(name: str) -> tuple[str, int] | None:
    """(queue, segment number) of a segment file's name, or None for any other file."""
    if not name.endswith(SUFFIX):
        return None
    queue, _, number = name[: -len(SUFFIX)].partition(".")
    if not (queue.isdigit() or queue == "pending"):
        return None
    if not number:
        return queue, 0
    return (queue, int(number)) if number.isdigit() and int(number) > 0 else None


def find_segments(directory: Path, queue: str) -> list[tuple[int, Path]]:
    """The segments of `queue` on disk; a `.tmp` or a spare left by a crash is removed."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    found = []
    for name in names:
        if not name.startswith(f"{queue}."):
            continue
        parsed = parse_segment_name(name)
        if parsed is not None and parsed[0] == queue:
            found.append((parsed[1], directory / name))
        elif name.startswith(f"{queue}{SPARE_SUFFIX}.") or (
            name.endswith(TMP_SUFFIX)
            and (parse_segment_name(name[: -len(TMP_SUFFIX)]) or ("", 0))[0] == queue
        ):
            (directory / name).unlink()
    return found


def never_written(path: Path) -> bool:
    """Whether the file's header is all zeros: a spare renamed before it reached the disk."""
    with path.open("rb") as handle:
        return not any(handle.read(HEADER_SIZE))


def create_spare_ring(
    path: Path,
    settings: QueueSettings,
    *,
    max_payload: int,
    clock: Clock,
    on_fsync: SyncObserver | None,
) -> tuple[RingQueue, int]:
    """A new, empty ring at the spare name `path`, every page already touched, and the
    bytes it takes on disk. The file is created, reserved and mapped in one call that
    lets go of the interpreter lock once (MappedFile), for the thread that makes spares
    ahead of a writer holding that lock (spares.py). Nothing is synced, and a process
    killed meanwhile leaves a partial file, which the next open removes as any spare.

    Raises DiskFullError or QueueFileError as ring.create_file does.
    """
    capacity = segment_capacity(settings)
    mapping = MappedFile()
    step, error = mapping.create(os.fsencode(path), ring_header(capacity), HEADER_SIZE + capacity)
    if step:
        raise creation_error(path, HEADER_SIZE + capacity, step, error)
    try:
        ring = RingQueue(
            path,
            mapping.fd,
            settings,
            clock,
            max_payload,
            writable=True,
            on_fsync=on_fsync,
            mapping=mapping,
        )
    except BaseException:
        mapping.close()
        os.close(mapping.fd)
        path.unlink(missing_ok=True)
        raise
    return ring, mapping.allocated
