"""Child processes for the fault-injection tests: writers meant to die by SIGKILL.

Run from the repository root as ``python -m tests.fault.spool_writer LEDGER ring PATH
SEED``, ``LEDGER segments DIR KIND AT SEED`` or ``LEDGER spool DIR START SEED`` (see
`tests.fault.children`), or as ``disk-full DIR LIMIT``. A killed writer prints ``R <n>``
once its queue is open (producing starts with counter n), then appends each step to
LEDGER after the operation it reports has returned, so the parent knows exactly what was
acknowledged when the kill landed:

    <counter> ring <seq>              ring and segments modes: the append of that counter
                                      returned seq
    <event_id> crash-topic <counter>  spool mode: the send of that counter returned event_id
    <counter> ack-begun <p>           about to acknowledge partition p up to that counter
    <counter> acked <p>               that acknowledgement has returned

The payloads carry their counter and a padding pattern derived from it, so the parent
can tell an intact record from a torn, stale or invented one.
"""

from __future__ import annotations

import json
import os
import random
import resource
import signal
import struct
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from eventspool.clock import SYSTEM_CLOCK
from eventspool.config import QueueSettings, SpoolSettings
from eventspool.envelope import decode
from eventspool.errors import QueueFileError
from eventspool.pipeline import Spool
from eventspool.spool.ring import Record, RingQueue
from eventspool.spool.segments import SegmentedQueue
from eventspool.spool.spares import Background
from eventspool.testing.ledger import LedgerWriter
from tests.fault.children import emit
from tests.spool.segment_support import Space

KIB = 1024
RING_CAPACITY = 256 * KIB
MAX_PADDING = 2000
RING_HIGH_WATER = 60
RING_LOW_WATER = 20
SPOOL_TOPIC = "crash-topic"
RING = "ring"
ACK_BEGUN = "ack-begun"
ACKED = "acked"
SPOOL_PARTITIONS = 3
SPOOL_HIGH_WATER = 40
SPOOL_LOW_WATER = 10
SPOOL_ACK_EVERY = 32
KEY_SPACE = 13

_MAGIC = b"CTR1"
_HEAD = struct.Struct("<4sQI")


SEGMENT_BYTES = 64 * KIB
SEGMENTS_MAX = 12
SEGMENTS_HIGH_WATER = 200  # about four segments of records
SEGMENTS_LOW_WATER = 20


def segment_settings() -> QueueSettings:
    """Segments small enough that a few hundred appends chain and delete several."""
    return QueueSettings(capacity_bytes=SEGMENTS_MAX * SEGMENT_BYTES, segment_bytes=SEGMENT_BYTES)


def open_segments(
    directory: Path, space: Space | None = None, background: Background | None = None
) -> SegmentedQueue:
    return SegmentedQueue(
        directory,
        "0",
        segment_settings(),
        space or Space(),
        SYSTEM_CLOCK,
        max_payload=4 * KIB,
        background=background,
    )


def ring_settings() -> QueueSettings:
    """Small enough that a few hundred appends wrap the ring."""
    return QueueSettings(capacity_bytes=RING_CAPACITY)


def spool_settings() -> SpoolSettings:
    """Small rings so the spool writer also wraps; events must fit four times in one."""
    return SpoolSettings(
        max_event_bytes=16 * KIB, queue=QueueSettings(capacity_bytes=RING_CAPACITY)
    )


def make_payload(counter: int, padding: int) -> bytes:
    """A payload whose every byte is predictable from the counter and padding length."""
    pattern = counter.to_bytes(8, "little")
    pad = (pattern * (padding // 8 + 1))[:padding]
    return _HEAD.pack(_MAGIC, counter, padding) + pad


def parse_payload(payload: bytes) -> int:
    """The counter of an intact payload; ValueError for anything `make_payload` did not make."""
    if len(payload) < _HEAD.size:
        raise ValueError(f"payload of {len(payload)} bytes is too short")
    magic, counter, padding = _HEAD.unpack_from(payload, 0)
    if magic != _MAGIC:
        raise ValueError(f"bad payload magic {magic!r}")
    if payload != make_payload(counter, padding):
        raise ValueError(f"payload of counter {counter} is damaged")
    return int(counter)


def key_for(counter: int) -> bytes:
    return b"key-%d" % (counter % KEY_SPACE)


def headers_for(counter: int) -> list[tuple[str, bytes | None]]:
    return [("counter", str(counter).encode()), ("empty", None)]


def run_ring(ledger: LedgerWriter, path: Path, seed: int) -> None:
    """Append to one ring as fast as possible, acknowledging old records to wrap it."""
    rng = random.Random(seed)
    ring = RingQueue.open(path, ring_settings())
    counter = ring.next_seq
    emit(f"R {counter}")
    while True:
        seq = ring.append(make_payload(counter, rng.randrange(MAX_PADDING)))
        ledger.append(str(counter), RING, str(seq))
        counter += 1
        if ring.depth > RING_HIGH_WATER:
            batch = ring.read_batch(max_records=ring.depth - RING_LOW_WATER, max_bytes=1 << 30)
            for record in batch:
                if parse_payload(record.payload) != record.seq:
                    raise SystemExit(f"record {record.seq} reads back as another counter")
            last = batch[-1].seq
            ledger.append(str(last), ACK_BEGUN, "0")
            ring.ack(last)
            ledger.append(str(last), ACKED, "0")


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


class _KillingSpace(Space):
    """The disk budget as the queue sees it, killing this process in the `at`-th segment
    creation (`create`) or deletion (`delete`): before, during or after the file work."""

    def __init__(self, kind: str, at: int, rng: random.Random) -> None:
        super().__init__()
        self.kind, self.at, self._rng = kind, at, rng
        self.grown = self.deleted = 0

    def grow(self, path: Path, size: int, make: Callable[[], int]) -> int | None:
        self.grown += 1
        if self.kind != "create" or self.grown != self.at:
            return super().grow(path, size, make)
        moment = self._rng.choice(("before", "during", "after"))
        if moment == "before":
            _die()
        if moment == "during":
            threading.Timer(self._rng.uniform(0, 0.003), _die).start()
        super().grow(path, size, make)
        while True:
            _die()

    def deleting(self) -> None:
        """An acknowledgement that deletes a segment is about to start."""
        self.deleted += 1
        if self.kind == "delete" and self.deleted == self.at:
            if self._rng.random() < 0.5:
                threading.Timer(self._rng.uniform(0, 0.001), _die).start()
            else:
                self.kind = "delete-after-unlink"

    def removed(self, allocated: int) -> None:
        super().removed(allocated)
        if self.kind == "delete-after-unlink":
            _die()


def run_segments(ledger: LedgerWriter, directory: Path, kind: str, at: int, seed: int) -> None:
    """run_ring over a chain of small segments, killed inside a segment's creation or
    deletion (see _KillingSpace), so the chain grows and shrinks by several each lap.
    Spares are made on a background thread, as in a spool, so a creation killed may be
    a spare's, and a deletion a recycling."""
    rng = random.Random(seed)
    space = _KillingSpace(kind, at, rng)
    queue = open_segments(directory, space, ThreadPoolExecutor(1).submit)
    counter = queue.next_seq
    emit(f"R {counter}")
    while True:
        seq = queue.append(make_payload(counter, rng.randrange(MAX_PADDING)))
        ledger.append(str(counter), RING, str(seq))
        counter += 1
        if queue.depth > SEGMENTS_HIGH_WATER:
            queue.rewind()
            batch: list[Record] = []
            while len(batch) < queue.depth - SEGMENTS_LOW_WATER:
                batch += queue.read_batch(queue.depth - SEGMENTS_LOW_WATER - len(batch), 1 << 30)
            for record in batch:
                if parse_payload(record.payload) != record.seq:
                    raise SystemExit(f"record {record.seq} reads back as another counter")
            last = batch[-1].seq
            ledger.append(str(last), ACK_BEGUN, "0")
            space.deleting()
            queue.ack(last)
            ledger.append(str(last), ACKED, "0")


def run_spool(ledger: LedgerWriter, directory: Path, start: int, seed: int) -> None:
    """Send keyed events to a 3-partition topic as fast as possible, acknowledging old ones."""
    rng = random.Random(seed)
    spool = Spool(directory, settings=spool_settings())
    spool.set_partition_count(SPOOL_TOPIC, SPOOL_PARTITIONS)
    counter = start
    emit(f"R {counter}")
    while True:
        value = make_payload(counter, rng.randrange(MAX_PADDING))
        event_id = spool.send(SPOOL_TOPIC, value, key_for(counter), headers_for(counter))
        ledger.append(event_id, SPOOL_TOPIC, str(counter))
        counter += 1
        if counter % SPOOL_ACK_EVERY:
            continue
        for ref in spool.queues():
            ring = ref.ring
            if ref.partition is None or ring.depth <= SPOOL_HIGH_WATER:
                continue
            batch = ring.read_batch(max_records=ring.depth - SPOOL_LOW_WATER, max_bytes=1 << 30)
            value_of_last = decode(batch[-1].payload).value
            assert value_of_last is not None
            last = parse_payload(value_of_last)
            ledger.append(str(last), ACK_BEGUN, str(ref.partition))
            ring.ack(batch[-1].seq)
            ledger.append(str(last), ACKED, str(ref.partition))


def run_disk_full(directory: Path, limit: int) -> None:
    """Send to a new topic while RLIMIT_FSIZE forbids its queue file; report as JSON."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    settings = SpoolSettings(max_event_bytes=4 * KIB, queue=QueueSettings(capacity_bytes=64 * KIB))
    result: dict[str, object] = {}
    with Spool(directory, settings=settings) as spool:
        spool.set_partition_count("old", 1)
        result["old_ids"] = [spool.send("old", b"old-%d" % i, b"k") for i in range(5)]
        soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
        try:
            spool.send("new", b"first try")
        except QueueFileError as exc:
            result["error"] = type(exc).__name__
            result["message"] = str(exc)
            result["error_path"] = exc.path
        else:
            result["error"] = None
        result["files_while_full"] = sorted(
            str(p.relative_to(directory)) for p in (directory / "topics").rglob("*") if p.is_file()
        )
        (ring,) = [ref.ring for ref in spool.queues() if ref.topic == "old"]
        ring.rewind()
        result["old_values_while_full"] = [
            (decode(r.payload).value or b"").decode() for r in ring.read_batch()
        ]
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        result["new_id"] = spool.send("new", b"second try")
    emit(json.dumps(result))


def main(argv: list[str]) -> None:
    if argv[0] == "disk-full":
        run_disk_full(Path(argv[1]), int(argv[2]))
        return
    ledger_path, mode, target, *rest = argv
    ledger = LedgerWriter(Path(ledger_path))
    if mode == "ring":
        run_ring(ledger, Path(target), int(rest[0]))
    elif mode == "segments":
        run_segments(ledger, Path(target), rest[0], int(rest[1]), int(rest[2]))
    elif mode == "spool":
        run_spool(ledger, Path(target), int(rest[0]), int(rest[1]))
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
