"""Which ring an event goes to: topic -> partitions -> rings, and pending rings.

Directory layout::

    DIR/LOCK                           owner lock (see lock.py)
    DIR/partitions.json                partition count per topic, as last learned
    DIR/exchanges.json                 runtime exchange declarations (routing/table.py)
    DIR/FORMAT                         the directory's format version (2)
    DIR/topics/<topic>/<n>.queue       queue of partition n: its segment 0, and further
    DIR/topics/<topic>/<n>.<s>.queue   segments s while it has a backlog (segments.py)
    DIR/topics/<topic>/pending.queue   events of a topic whose partition count is unknown
                                       (segments pending.<s>.queue likewise)

Events wait in the pending ring until the partition count of their topic is known,
then are partitioned in the order they were sent: keyed events by Kafka's murmur2, so
that they land where a Java producer would put them.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from eventspool._core.native import RingCore, TopicRoute
from eventspool.clock import Clock
from eventspool.config import SpoolSettings
from eventspool.envelope import EventIdGenerator, decode
from eventspool.errors import QueueFileError, SpoolBudgetError
from eventspool.spool.atomic_append import append_to_each
from eventspool.spool.budget import DiskBudget
from eventspool.spool.partitioner import StickyPartitioner, partition_for_key
from eventspool.spool.ring import HEADER_SIZE, Record, SyncObserver, segment_capacity
from eventspool.spool.segment_files import parse_segment_name
from eventspool.spool.segments import SegmentedQueue

PARTITIONS_FILE = "partitions.json"
TOPICS_DIR = "topics"
PENDING = "pending"
FORMAT_FILE = "FORMAT"
# 1: one ring file per queue; 2: a chain of segment files per queue (segments.py). A
# version-1 directory is a version-2 one whose queues have one segment each.
FORMAT_VERSION = 2
_MIGRATION_BATCH = 1000


@dataclass(frozen=True, slots=True)
class QueueRef:
    """One queue with its place: `partition` is None for a topic's pending queue."""

    topic: str
    partition: int | None
    ring: SegmentedQueue


class TopicQueues:
    """The rings of one topic.

    `route` is the compiled routing state that `Spool.send()` writes through without
    any lock: the partition count, reachable partitions, sticky partitioner and the
    rings opened so far. Routing is lock-free for keyed events once the partition count
    is known; while it is unknown, every send takes the topic lock, and moving the
    pending ring holds it throughout, so no new event overtakes an older pending one of
    the same key.
    """

    def __init__(
        self, name: str, directory: Path, registry: QueueRegistry, partition_count: int | None
    ) -> None:
        self.name = name
        self.directory = directory
        self._registry = registry
        self.lock = threading.RLock()
        self.partitions: dict[int, SegmentedQueue] = {}
        self._pending: SegmentedQueue | None = None
        self.route = TopicRoute(
            name,
            partition_count,
            StickyPartitioner(registry.settings.sticky_batch_bytes),
            registry.ids,
            registry.settings.max_event_bytes,
        )

    @property
    def pending(self) -> SegmentedQueue | None:
        """The queue of events waiting for the topic's partition count, if any."""
        return self._pending

    @pending.setter
    def pending(self, ring: SegmentedQueue | None) -> None:
        self._pending = ring
        self._registry.queues_changed()

    @property
    def partition_count(self) -> int | None:
        return self.route.partition_count

    @partition_count.setter
    def partition_count(self, count: int | None) -> None:
        self.route.partition_count = count

    @property
    def available(self) -> frozenset[int] | None:
        return self.route.available

    @available.setter
    def available(self, partitions: frozenset[int] | None) -> None:
        self.route.available = partitions

    @property
    def has_queues(self) -> bool:
        """Whether a queue file was opened: a topic refused its first one has none."""
        return bool(self.partitions) or self.pending is not None

    def partition_ring(self, partition: int, *, admitted: bool = False) -> SegmentedQueue:
        """The queue of `partition`, opened or created; `admitted` events (moved from the
        pending queue) were accepted already, so the disk budget cannot refuse them.

        The route writes into the queue's write segment, and follows it to each new one.
        """
        ring = self.partitions.get(partition)
        if ring is None:
            with self.lock:
                ring = self.partitions.get(partition)
                if ring is None:
                    ring = self._registry.open_queue(
                        self.name,
                        str(partition),
                        admitted,
                        functools.partial(self.route.set_ring, partition),
                    )
                    self.partitions[partition] = ring
                    self.route.set_ring(partition, ring.write_core)
                    self._registry.queues_changed()
        return ring

    def pending_ring(self) -> SegmentedQueue:
        if self.pending is None:
            self.pending = self._registry.open_queue(self.name, PENDING)
        return self.pending

    def append(self, key: bytes | None, payload: bytes, timestamp_ms: int) -> None:
        if self.partition_count is None:
            with self.lock:
                if self.partition_count is None:
                    self.pending_ring().append(payload, timestamp_ms)
                    return
        self.partition_ring(self.route.choose(key, len(payload))).append(payload, timestamp_ms)

    def ring_for(self, key: bytes | None, size: int, held: ExitStack) -> SegmentedQueue:
        """The ring `append` would pick, for a caller that writes to it under its own locks.

        While the partition count is unknown the ring is the pending one, and the topic
        lock is entered into `held`, so the pending ring cannot be moved away before the
        caller has written to it.
        """
        if self.partition_count is None:
            held.enter_context(self.lock)
            if self.partition_count is None:
                return self.pending_ring()
        return self.partition_ring(self.route.choose(key, size))

    def refs(self) -> list[QueueRef]:
        with self.lock:
            refs = [QueueRef(self.name, p, ring) for p, ring in sorted(self.partitions.items())]
            if self.pending is not None:
                refs.append(QueueRef(self.name, None, self.pending))
        return refs

    def close(self) -> None:
        with self.lock:
            for partition, ring in self.partitions.items():
                self.route.set_ring(partition, None)
                ring.close()
            if self.pending is not None:
                self.pending.close()


class QueueRegistry:
    """Every ring of one spool directory; opening it recovers every ring found on disk."""

    def __init__(
        self,
        directory: Path,
        settings: SpoolSettings,
        clock: Clock,
        ids: EventIdGenerator,
        on_fsync: SyncObserver | None = None,
    ) -> None:
        self.directory = directory
        self._on_fsync = on_fsync
        self.settings = settings
        self.clock = clock
        self.ids = ids
        self._lock = threading.Lock()
        self._topics: dict[str, TopicQueues] = {}
        # `refs()` as last listed, with the count of queue changes it saw.
        self._changes = 0
        self._changes_lock = threading.Lock()
        self._listed: tuple[int, tuple[QueueRef, ...]] = (-1, ())
        self._counts: dict[str, int] = load_partition_counts(directory)
        # One thread makes the spare segments of queues with a backlog (segments.py).
        self._spares = ThreadPoolExecutor(1, thread_name_prefix="eventspool-segments")
        self.budget = DiskBudget(
            directory / TOPICS_DIR, settings.max_spool_bytes, settings.max_topics, clock
        )
        check_format(directory)
        try:
            self._open_existing()
        except BaseException:
            self.close()
            raise

    def _open_existing(self) -> None:
        """Open (and so recover) every queue on disk, moving pending ones whose count is known."""
        for topic_dir in sorted((self.directory / TOPICS_DIR).glob("*/")):
            topic = self._topic_locked(topic_dir.name)
            queues = {parse_segment_name(path.name) for path in topic_dir.iterdir()}
            for name in sorted({parsed[0] for parsed in queues if parsed is not None}):
                if name == PENDING:
                    topic.pending_ring()
                else:
                    topic.partition_ring(int(name))
            if topic.pending is not None and topic.partition_count is not None:
                with topic.lock:
                    self._move_pending(topic, topic.pending, topic.partition_count)
                    topic.pending = None

    def open_queue(
        self,
        topic: str,
        name: str,
        admitted: bool = False,
        on_write_core: Callable[[RingCore], None] | None = None,
    ) -> SegmentedQueue:
        """Open the queue `name` of `topic`; creating its first segment must fit in the
        disk budget, unless it is for events accepted already (`admitted`)."""
        settings = self.settings.for_topic(topic)
        space = _TopicSpace(self.budget, topic, HEADER_SIZE + segment_capacity(settings), admitted)
        try:
            return SegmentedQueue(
                self.directory / TOPICS_DIR / topic,
                name,
                settings,
                space,
                self.clock,
                max_payload=self.settings.max_event_bytes,
                on_fsync=self._on_fsync,
                on_write_core=on_write_core,
                background=self._spares.submit,
            )
        except SpoolBudgetError:
            self._forget_if_empty(topic)
            raise

    def _forget_if_empty(self, name: str) -> None:
        """Drop a topic refused its first queue: kept, the sender would ask Kafka for it
        (creating it there, with `create_topics`), once for every name a caller made up."""
        with self._lock:
            topic = self._topics.get(name)
            if topic is not None and not topic.has_queues and name not in self._counts:
                del self._topics[name]

    def topic(self, name: str) -> TopicQueues:
        topic = self._topics.get(name)
        if topic is None:
            with self._lock:
                topic = self._topic_locked(name)
        return topic

    def _topic_locked(self, name: str) -> TopicQueues:
        topic = self._topics.get(name)
        if topic is None:
            topic = TopicQueues(
                name, self.directory / TOPICS_DIR / name, self, self._counts.get(name)
            )
            self._topics[name] = topic
        return topic

    def append_to_each(
        self, topics: Sequence[TopicQueues], key: bytes | None, payload: bytes, timestamp_ms: int
    ) -> None:
        """One event into a queue of each topic: all of them, or none (`atomic_append`).

        `topics` must be distinct and sorted by name: the one order in which every caller
        takes their locks.
        """
        with ExitStack() as held:
            rings = [topic.ring_for(key, len(payload), held) for topic in topics]
            append_to_each(rings, payload, timestamp_ms)

    def topics(self) -> list[TopicQueues]:
        with self._lock:
            return list(self._topics.values())

    def refs(self) -> tuple[QueueRef, ...]:
        """Every queue. Listed anew only once one was opened or let go since: the sender
        asks every round, and listing them took an idle round half of its time."""
        changes = self._changes
        listed = self._listed
        if listed[0] != changes:
            listed = (changes, tuple(ref for topic in self.topics() for ref in topic.refs()))
            self._listed = listed  # one assignment: a pair no other lister can split
        return listed[1]

    def queues_changed(self) -> None:
        """A topic's queue was opened or let go: `refs()` lists them anew."""
        with self._changes_lock:
            self._changes += 1

    def partition_counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    def set_partition_count(self, name: str, count: int) -> None:
        """Record a topic's partition count and move its pending events into partitions.

        Counts only grow, as in Kafka. Moving is crash-safe: an event is appended to its
        partition before it leaves the pending ring, so a crash in between duplicates
        it (removable by event_id) and never loses it.
        """
        if count < 1:
            raise ValueError(f"partition count of {name!r} must be positive, got {count}")
        topic = self.topic(name)
        with topic.lock:
            if topic.partition_count is not None and count <= topic.partition_count:
                return
            if topic.pending is not None:
                self._move_pending(topic, topic.pending, count)
                topic.pending = None
            topic.partition_count = count
            with self._lock:
                self._counts[name] = count
                save_partition_counts(self.directory, self._counts)

    def set_available_partitions(self, name: str, available: frozenset[int] | None) -> None:
        """Partitions whose leader is reachable; keyless events stick only to those.

        None (or an empty set) means no information: any partition may be chosen, as in
        Kafka, because queueing on any partition beats refusing the event.
        """
        self.topic(name).available = available or None

    def move_keyless(self, name: str, source: int, targets: Sequence[int]) -> int:
        """Move the keyless events at the head of partition `source`'s ring to `targets`.

        For a partition whose leader is gone (the sender's failover): keyless events have
        no order to keep, so they may go to any partition. The move stops at the first
        keyed event, which waits for its own partition. Crash-safe as `_move_pending`: an
        event is appended to its new ring before it leaves the old one. The caller must
        be the ring's only reader, and rewinds it after. Returns how many moved.
        """
        if not targets:
            return 0
        topic = self.topic(name)
        ring = topic.partitions.get(source)
        if ring is None:
            return 0
        sticky = StickyPartitioner(self.settings.sticky_batch_bytes)
        moved = 0
        ring.rewind()
        while batch := ring.read_batch(_MIGRATION_BATCH):
            keyless = list(itertools.takewhile(_is_keyless, batch))
            for record in keyless:
                target = targets[sticky.partition(len(targets), len(record.payload))]
                topic.partition_ring(target, admitted=True).append(
                    record.payload, record.timestamp_ms
                )
            if keyless:
                ring.ack(keyless[-1].seq)
                moved += len(keyless)
            if len(keyless) < len(batch):
                break
        ring.rewind()
        return moved

    def _move_pending(self, topic: TopicQueues, pending: SegmentedQueue, count: int) -> None:
        sticky = StickyPartitioner(self.settings.sticky_batch_bytes)
        pending.rewind()
        while batch := pending.read_batch(_MIGRATION_BATCH):
            for record in batch:
                key = decode(record.payload).key
                partition = (
                    sticky.partition(count, len(record.payload))
                    if key is None
                    else partition_for_key(key, count)
                )
                topic.partition_ring(partition, admitted=True).append(
                    record.payload, record.timestamp_ms
                )
            pending.ack(batch[-1].seq)
        pending.delete()

    def close(self) -> None:
        """Close every queue; a spare still being made is deleted once it is done."""
        for topic in self.topics():
            topic.close()
        self._spares.shutdown()


@dataclass(frozen=True, slots=True)
class _TopicSpace:
    """The disk budget as one queue of `topic` sees it (budget.SegmentSpace)."""

    budget: DiskBudget
    topic: str
    first_size: int
    admitted: bool

    def first(self, path: Path, make: Callable[[], int]) -> int:
        return self.budget.create(
            self.topic, path, self.first_size, make, enforce=not self.admitted
        )

    def grow(self, path: Path, size: int, make: Callable[[], int]) -> int | None:
        return self.budget.grow(path, size, make)

    def removed(self, allocated: int) -> None:
        self.budget.removed(allocated)


def check_format(directory: Path) -> None:
    """Refuse a directory written by a newer format; mark an older one as version 2.

    A version-1 directory needs no conversion: each of its ring files is the first
    segment of its queue.
    """
    path = directory / FORMAT_FILE
    try:
        version = int(path.read_text())
    except FileNotFoundError:
        version = 1
    except (OSError, ValueError) as exc:
        raise QueueFileError(str(path), f"unreadable format version: {exc}") from exc
    if version > FORMAT_VERSION:
        raise QueueFileError(
            str(path),
            f"the spool directory has format version {version}; this eventspool reads "
            f"versions up to {FORMAT_VERSION}: open it with the release that wrote it",
        )
    if version < FORMAT_VERSION:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(f"{FORMAT_VERSION}\n")
        os.replace(tmp, path)


def _is_keyless(record: Record) -> bool:
    """Whether a queued event has no key; an undecodable one stays where it is."""
    try:
        return decode(record.payload).key is None
    except ValueError:
        return False


def load_partition_counts(directory: Path) -> dict[str, int]:
    path = directory / PARTITIONS_FILE
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise QueueFileError(str(path), f"unreadable partition cache: {exc}") from exc
    topics = data.get("topics", {}) if isinstance(data, dict) else {}
    return {str(k): int(v) for k, v in topics.items() if isinstance(v, int) and v > 0}


def save_partition_counts(directory: Path, counts: dict[str, int]) -> None:
    """Write the cache atomically: a crash leaves the old file or the new one, never half."""
    path = directory / PARTITIONS_FILE
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"version": 1, "topics": counts}, indent=2, sort_keys=True))
    with tmp.open("rb") as handle:
        os.fsync(handle.fileno())
    os.replace(tmp, path)
