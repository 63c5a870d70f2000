"""Offline inspection of a spool directory: read-only, it never moves a position."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from eventspool.errors import QueueFileError
from eventspool.spool.lock import is_locked
from eventspool.spool.registry import PENDING, TOPICS_DIR, load_partition_counts
from eventspool.spool.ring import RecoveryReport, RingQueue, RingStats
from eventspool.spool.segment_files import SUFFIX, parse_segment_name


@dataclass(frozen=True, slots=True)
class QueueReport:
    """One segment file of a queue (a queue without a backlog has one)."""

    topic: str
    partition: int | None
    segment: int
    path: Path
    stats: RingStats | None
    recovery: RecoveryReport | None
    error: str | None


@dataclass(frozen=True, slots=True)
class SpoolReport:
    directory: Path
    owner_pid: int | None
    partition_counts: dict[str, int]
    queues: list[QueueReport]


def inspect_spool(directory: Path) -> SpoolReport:
    """Scan every queue file as a recovery would, without changing any of them.

    A live owner may be writing while this reads: the figures are then a snapshot.
    A damaged file is reported, not raised, so one bad queue does not hide the others.
    """
    if not directory.is_dir():
        raise FileNotFoundError(f"{directory} is not a spool directory")
    queues: list[QueueReport] = []
    for path in sorted((directory / TOPICS_DIR).glob(f"*/*{SUFFIX}")):
        parsed = parse_segment_name(path.name)
        if parsed is None:
            continue
        topic = path.parent.name
        partition = None if parsed[0] == PENDING else int(parsed[0])
        try:
            ring = RingQueue.open(path, create=False, writable=False)
        except QueueFileError as exc:
            queues.append(QueueReport(topic, partition, parsed[1], path, None, None, str(exc)))
            continue
        with ring:
            queues.append(
                QueueReport(topic, partition, parsed[1], path, ring.stats(), ring.recovery, None)
            )
    queues.sort(key=lambda q: (q.topic, q.partition is None, q.partition or 0, q.segment))
    return SpoolReport(directory, is_locked(directory), load_partition_counts(directory), queues)
