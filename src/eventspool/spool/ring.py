"""One queue file: a preallocated, memory-mapped ring of framed records.

File layout, format version 1 (little endian)::

    offset  size  field
    0       8     magic b"EVSPRING"
    8       4     format version
    12      4     header size (4096)
    16      8     capacity of the record area in bytes (a multiple of 4096)
    24      4     crc32c of bytes 0..24
    32      8     write hint: the sequence after the last committed append (advisory,
                  used only to count what a recovery could not find)
    64      64    position slot A
    128     64    position slot B
    4096    ...   record area, `capacity` bytes

A position slot holds the acknowledged read position. The two slots are written in
turn; at open the valid slot with the higher counter wins, so a crash while one is
written leaves the other intact::

    0   8  counter
    8   8  head position: logical byte offset of the oldest record still queued
    16  8  head sequence: the sequence of that record
    24  8  generation: incremented at every writable open
    32  8  records dropped by the drop_oldest policy, in total
    40  8  records skipped by recoveries, in total
    48  4  crc32c of bytes 0..48

Records sit at logical byte positions that only grow; position p is stored at
4096 + p % capacity. A record never wraps: when it does not fit before the end of
the area, a padding frame (or, when fewer than 32 bytes remain, nothing) fills the gap::

    0   4  payload length; bit 31 marks a padding frame that runs to the end of the area
    4   4  crc32c of bytes 8..32+length, seeded with the length word
    8   8  sequence (one more than the previous record's; padding repeats the next one)
    16  8  append time, ms since the epoch
    24  4  generation of the writer
    28  4  zero
    32  n  payload, then padding to a multiple of 8

A record becomes visible when its length word is written, and that word is written
last. Recovery scans from the acknowledged position and accepts a record only if its
CRC matches, its sequence is the next one, and its generation is not older than the
previous record's nor newer than the file's: stale records of an earlier lap and the
remains of a record torn by a crash all fail one of these tests. The scan stops at the
first failure; everything before it is kept and nothing after it is trusted.
"""

from __future__ import annotations

import errno
import mmap
import os
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from eventspool._core.native import (
    ACK_NOT_HANDED_OUT,
    APPEND_BAD_LENGTH,
    APPEND_CLOSED,
    MAP_CREATE,
    MAP_RESERVE,
    RING_FRAME_HEADER_SIZE,
    RING_HEADER_SIZE,
    RING_PAGE,
    RING_SLOT_OFFSETS,
    MappedFile,
    RingCore,
    crc32c,
)
from eventspool.clock import SYSTEM_CLOCK, Clock
from eventspool.config import Durability, FullPolicy, QueueSettings
from eventspool.errors import (
    CorruptQueueError,
    DiskFullError,
    EventTooLargeError,
    InvalidEventError,
    QueueFileError,
    SpoolClosedError,
    SpoolFullError,
)

# Told the seconds each fdatasync took: the spool's assembly passes a metrics observer.
SyncObserver = Callable[[float], None]

MAGIC = b"EVSPRING"
FORMAT_VERSION = 1
# The sizes and offsets that the compiled core frames records by are defined there.
HEADER_SIZE = RING_HEADER_SIZE
PAGE = RING_PAGE
FRAME_HEADER_SIZE = RING_FRAME_HEADER_SIZE

_STATIC = struct.Struct("<8sIIQ")
_STATIC_CRC_OFFSET = _STATIC.size
_U32 = struct.Struct("<I")
_SLOT = struct.Struct("<QQQQQQ")
_SLOT_OFFSETS = RING_SLOT_OFFSETS
_SLOT_CRC_OFFSET = _SLOT.size


def segment_capacity(settings: QueueSettings) -> int:
    """The record area of one ring file: `segment_bytes`, never more than the queue's
    maximum (`capacity_bytes`), in whole pages."""
    size = min(settings.segment_bytes, settings.capacity_bytes)
    return (size + PAGE - 1) // PAGE * PAGE


def frame_size(payload_length: int) -> int:
    """Bytes a record of this payload occupies in the ring."""
    return (FRAME_HEADER_SIZE + payload_length + 7) & ~7


@dataclass(frozen=True, slots=True)
class Record:
    seq: int
    timestamp_ms: int
    payload: bytes


@dataclass(frozen=True, slots=True)
class RecoveryReport:
    """What opening a ring found: how much it kept and what it could not trust."""

    records: int
    bytes: int
    skipped_records: int
    corrupt_tail: bool
    stop_reason: str


@dataclass(frozen=True, slots=True)
class RingStats:
    path: str
    capacity: int
    depth: int
    bytes: int
    oldest_age_ms: int | None
    head_seq: int
    read_seq: int
    next_seq: int
    head_position: int
    tail_position: int
    generation: int
    dropped: int
    skipped_total: int


class _GroupCommit:
    """Shares one fdatasync among every writer waiting for durability.

    The first waiter syncs; writers arriving during that sync wait for the next one,
    which then covers all of them. `os.fdatasync` lets go of the interpreter lock, so
    other writers go on meanwhile.
    """

    def __init__(self, fd: int, on_sync: SyncObserver | None) -> None:
        self._fd = fd
        self._on_sync = on_sync
        self._cond = threading.Condition()
        self._synced_seq = -1
        self._syncing = False
        self.syncs = 0

    def wait_durable(self, seq: int, latest_seq: int) -> None:
        with self._cond:
            while self._synced_seq < seq:
                if self._syncing:
                    self._cond.wait()
                    continue
                self._syncing = True
                target = max(seq, latest_seq)
                self._cond.release()
                started = time.perf_counter()
                try:
                    os.fdatasync(self._fd)
                finally:
                    if self._on_sync is not None:
                        self._on_sync(time.perf_counter() - started)
                    self._cond.acquire()
                    self._syncing = False
                    self._cond.notify_all()
                self._synced_seq = max(self._synced_seq, target)
                self.syncs += 1


class RingQueue:
    """A durable FIFO of byte payloads with sequence numbers, in one file.

    Thread-safe. `append` returns once the record is in the file (and, with `fsync`
    durability, written back). `read_batch` hands records out in order without removing
    them; `ack` removes them for good. After a crash, reopening yields every record that
    was appended and not acknowledged; records read but not acknowledged are read again.

    The bytes are framed by the compiled core (`core`); this class keeps the policy:
    what a full queue does, durability, and the errors callers see.
    """

    def __init__(
        self,
        path: Path,
        fd: int,
        settings: QueueSettings,
        clock: Clock,
        max_payload: int,
        *,
        writable: bool,
        on_fsync: SyncObserver | None = None,
        mapping: MappedFile | None = None,
    ) -> None:
        # `mapping`: the file mapped already (segment_files.create_spare_ring).
        self.path = path
        self.settings = settings
        self._clock = clock
        self._fd = fd
        self._writable = writable
        size = os.fstat(fd).st_size if mapping is None else mapping.size
        if size < HEADER_SIZE + PAGE:
            raise CorruptQueueError(str(path), f"file is {size} bytes, too short for a queue")
        access = mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ
        self._mm: mmap.mmap | MappedFile = (
            mmap.mmap(fd, size, access=access) if mapping is None else mapping
        )
        capacity = self._read_static_header(size)
        # Writers that wait for room under `block` sleep here; ack() wakes them.
        self._space = threading.Condition()
        self._commit = (
            _GroupCommit(fd, on_fsync) if settings.durability is Durability.FSYNC else None
        )
        self.core = RingCore(
            self._mm,
            capacity,
            self._read_slot(),
            max_payload,
            settings.full_policy is FullPolicy.DROP_OLDEST,
            self._commit is None,
            writable,
        )
        self.recovery = self._scan()
        if writable:
            self.core.start_writing(self.recovery.skipped_records, self.recovery.corrupt_tail)

    # ---- opening ---------------------------------------------------------------

    @classmethod
    def open(
        cls,
        path: Path,
        settings: QueueSettings | None = None,
        *,
        max_payload: int = 1_000_000,
        clock: Clock = SYSTEM_CLOCK,
        create: bool = True,
        writable: bool = True,
        on_fsync: SyncObserver | None = None,
    ) -> RingQueue:
        """Open the ring at `path`, creating it as one segment of `settings` if absent.

        `on_fsync` is told each fdatasync's duration in seconds (metrics, above storage).
        Raises QueueFileError if the file cannot be created (disk full) and
        CorruptQueueError if its header cannot be trusted.
        """
        settings = settings or QueueSettings()
        if create and writable and not path.exists():
            create_file(path, segment_capacity(settings))
        flags = os.O_RDWR if writable else os.O_RDONLY
        try:
            fd = os.open(path, flags)
        except OSError as exc:
            raise QueueFileError(str(path), f"cannot open: {exc.strerror}") from exc
        try:
            return cls(path, fd, settings, clock, max_payload, writable=writable, on_fsync=on_fsync)
        except BaseException:
            os.close(fd)
            raise

    def _read_static_header(self, size: int) -> int:
        magic, version, header_size, capacity = _STATIC.unpack_from(self._mm, 0)
        name = str(self.path)
        if magic != MAGIC:
            raise CorruptQueueError(name, f"bad magic {magic!r}: not an eventspool queue file")
        (stored_crc,) = _U32.unpack_from(self._mm, _STATIC_CRC_OFFSET)
        if stored_crc != crc32c(memoryview(self._mm)[0:_STATIC_CRC_OFFSET]):
            raise CorruptQueueError(name, "header checksum mismatch; refusing to guess positions")
        if version != FORMAT_VERSION:
            raise CorruptQueueError(name, f"format version {version} is not supported")
        if header_size != HEADER_SIZE or capacity % PAGE or HEADER_SIZE + capacity != size:
            raise CorruptQueueError(
                name, f"header says capacity {capacity} but the file is {size} bytes"
            )
        return int(capacity)

    def _read_slot(self) -> tuple[int, int, int, int, int, int]:
        """The position slot with the higher counter of the two whose checksum holds."""
        best: tuple[int, int, int, int, int, int] | None = None
        for offset in _SLOT_OFFSETS:
            fields = _SLOT.unpack_from(self._mm, offset)
            (stored,) = _U32.unpack_from(self._mm, offset + _SLOT_CRC_OFFSET)
            if stored != crc32c(memoryview(self._mm)[offset : offset + _SLOT.size]):
                continue
            if best is None or fields[0] > best[0]:
                best = fields
        if best is None:
            raise CorruptQueueError(
                str(self.path), "both copies of the read position are damaged; refusing to reset"
            )
        return best

    def _scan(self) -> RecoveryReport:
        """Find the end of the valid records after the acknowledged position.

        A frame that fails validation where the write hint says no record was ever
        written is what an earlier lap left past the tail: a clean end, not damage.
        """
        core = self.core
        records, failed, stop, hint = core.scan()
        seq = core.next_seq
        plausible = seq <= hint <= seq + core.capacity // FRAME_HEADER_SIZE
        skipped = hint - seq if plausible else 0
        corrupt = failed and (skipped > 0 or not plausible)
        if corrupt:
            reason = f"record at position {stop} (sequence {seq}) failed validation"
        elif skipped:
            reason = f"records {seq}..{hint - 1} were written but are unreadable"
        else:
            reason = "clean end"
        return RecoveryReport(records, stop - core.head, skipped, corrupt or skipped > 0, reason)

    # ---- writing ---------------------------------------------------------------

    def append(self, payload: bytes, timestamp_ms: int | None = None) -> int:
        """Append one record; returns its sequence once it is as durable as configured.

        Payloads must not be empty: a zero length word is how the ring marks its end.
        """
        ts = self._clock.now_ms() if timestamp_ms is None else timestamp_ms
        seq = self.core.append(payload, ts)
        if seq < 0:
            seq = self._append_refused(payload, ts, seq)
        self.wait_durable(seq)
        return seq

    def wait_durable(self, seq: int) -> None:
        """Return once record `seq` is as durable as configured (group commit under fsync)."""
        if self._commit is not None:
            self._commit.wait_durable(seq, self.core.next_seq - 1)

    def _append_refused(self, payload: bytes, ts: int, status: int) -> int:
        """Apply the policy to an append the core refused: raise, or wait for room."""
        if status == APPEND_BAD_LENGTH:
            raise self.bad_length(len(payload))
        if status == APPEND_CLOSED:
            raise SpoolClosedError(f"queue {self.path} is closed")
        if self.settings.full_policy is not FullPolicy.BLOCK:
            raise self.full_error()
        deadline = self._clock.monotonic() + self.settings.block_timeout_s
        with self._space:
            while True:
                seq = self.core.append(payload, ts)
                if seq >= 0:
                    return seq
                if seq == APPEND_CLOSED:
                    raise SpoolClosedError(f"queue {self.path} is closed")
                remaining = deadline - self._clock.monotonic()
                if remaining <= 0:
                    raise self.full_error()
                self._space.wait(remaining)

    def append_many(self, payloads: list[bytes], timestamp_ms: int | None = None) -> int:
        """Append records in order under one lock and one sync; returns the first sequence.

        When the queue fills under `reject` or `block`, the exception is raised and the
        records appended before it stay appended.
        """
        max_payload = self.core.max_payload
        for payload in payloads:
            if not 0 < len(payload) <= max_payload:
                raise self.bad_length(len(payload))
        ts = self._clock.now_ms() if timestamp_ms is None else timestamp_ms
        first, written, status = self.core.append_many(payloads, ts)
        try:
            for payload in payloads[written:] if status else ():
                seq = self.core.append(payload, ts)
                if seq < 0:
                    self._append_refused(payload, ts, seq)
        finally:
            last = self.core.next_seq - 1
            if last >= first:
                self.wait_durable(last)
        return int(first)

    def full_error(self) -> SpoolFullError:
        core = self.core
        return SpoolFullError(
            f"queue {self.path.name} is full: {core.tail - core.head} of {core.capacity} bytes "
            f"hold {core.next_seq - core.head_seq} unsent records "
            f"(policy {self.settings.full_policy.value})"
        )

    def bad_length(self, length: int) -> InvalidEventError:
        if not length:
            return InvalidEventError("a queue record must not be empty")
        return EventTooLargeError(
            f"record of {length} bytes exceeds the maximum of {self.core.max_payload} "
            f"for queue {self.path.name}"
        )

    # ---- reading ---------------------------------------------------------------

    def read_batch(self, max_records: int = 500, max_bytes: int = 1 << 20) -> list[Record]:
        """Hand out the next records after those already handed out, without removing them.

        Returns at least one record when any is waiting, even one larger than `max_bytes`.
        """
        return [Record(*fields) for fields in self.core.read_records(max_records, max_bytes)]

    def rewind(self) -> None:
        """Hand out again every record not yet acknowledged (after a failed send)."""
        self.core.rewind()

    def ack(self, up_to_seq: int) -> None:
        """Remove every record up to and including `up_to_seq` for good.

        Acknowledging a record already removed (acknowledged, or dropped by drop_oldest
        while it was being sent) does nothing: the position never moves back.
        """
        if self.core.ack(up_to_seq) == ACK_NOT_HANDED_OUT:
            raise ValueError(
                f"cannot acknowledge sequence {up_to_seq} of {self.path.name}: "
                f"only records below {self.core.read_seq} were handed out"
            )
        if self.settings.full_policy is FullPolicy.BLOCK:
            with self._space:
                self._space.notify_all()

    # ---- state -----------------------------------------------------------------

    @property
    def capacity(self) -> int:
        return int(self.core.capacity)

    @property
    def is_open(self) -> bool:
        return not self.core.closed

    @property
    def head_seq(self) -> int:
        """Sequence of the oldest record not yet acknowledged."""
        return int(self.core.head_seq)

    @property
    def depth(self) -> int:
        return int(self.core.next_seq - self.core.head_seq)

    @property
    def next_seq(self) -> int:
        return int(self.core.next_seq)

    @property
    def unread(self) -> int:
        return int(self.core.next_seq - self.core.read_seq)

    @property
    def syncs(self) -> int:
        return self._commit.syncs if self._commit is not None else 0

    def stats(self) -> RingStats:
        core = self.core
        oldest_ts = core.oldest_timestamp()
        return RingStats(
            path=str(self.path),
            capacity=core.capacity,
            depth=core.next_seq - core.head_seq,
            bytes=core.tail - core.head,
            oldest_age_ms=None if oldest_ts < 0 else max(0, self._clock.now_ms() - oldest_ts),
            head_seq=core.head_seq,
            read_seq=core.read_seq,
            next_seq=core.next_seq,
            head_position=core.head,
            tail_position=core.tail,
            generation=core.generation,
            dropped=core.dropped,
            skipped_total=core.skipped,
        )

    def close(self) -> None:
        """Persist the read position and release the file; later calls raise SpoolClosedError."""
        if self.core.closed:
            return
        self.core.close()
        with self._space:
            self._space.notify_all()
        if self._writable and self._commit is not None:
            os.fdatasync(self._fd)
        self._mm.close()
        os.close(self._fd)

    def __enter__(self) -> RingQueue:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def create_file(
    path: Path,
    capacity: int,
    head_seq: int = 0,
    dropped: int = 0,
    skipped: int = 0,
    *,
    sync: bool = True,
) -> int:
    """Create a queue file completely or not at all, its first record to be `head_seq`;
    returns the bytes it takes on disk (st_blocks, what the disk budget counts).

    The space is reserved with posix_fallocate, never left sparse: a write into a hole
    of a full disk through mmap is a SIGBUS, while fallocate fails cleanly with ENOSPC.
    A segment that continues a queue (segments.py) starts at the sequence where the one
    before it stopped and carries the queue's `dropped` and `skipped` totals. Without
    `sync` nothing is synced: a killed process still leaves the whole file or none, but
    a power cut may lose its header (segments.py says when that is safe).
    """
    capacity = (capacity + PAGE - 1) // PAGE * PAGE
    tmp = path.with_name(path.name + ".tmp")
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o640)
    except OSError as exc:
        raise creation_error(path, HEADER_SIZE + capacity, MAP_CREATE, exc.errno) from exc
    try:
        try:
            os.posix_fallocate(fd, 0, HEADER_SIZE + capacity)
        except OSError as exc:
            raise creation_error(path, HEADER_SIZE + capacity, MAP_RESERVE, exc.errno) from exc
        os.pwrite(fd, ring_header(capacity, head_seq, dropped, skipped), 0)
        if sync:
            os.fsync(fd)
        allocated = os.fstat(fd).st_blocks * 512
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    os.close(fd)
    os.replace(tmp, path)
    if sync:
        fsync_directory(path.parent)
    return int(allocated)


def ring_header(capacity: int, head_seq: int = 0, dropped: int = 0, skipped: int = 0) -> bytes:
    """The header page of a new ring file: the static header, and slot B holding the
    position (slot A all zeros fails its checksum, so slot B is read)."""
    static = _STATIC.pack(MAGIC, FORMAT_VERSION, HEADER_SIZE, capacity)
    header = bytearray(HEADER_SIZE)
    header[0 : len(static)] = static
    _U32.pack_into(header, _STATIC_CRC_OFFSET, crc32c(static))
    slot = _SLOT.pack(1, 0, head_seq, 0, dropped, skipped)
    header[_SLOT_OFFSETS[1] : _SLOT_OFFSETS[1] + len(slot)] = slot
    _U32.pack_into(header, _SLOT_OFFSETS[1] + _SLOT_CRC_OFFSET, crc32c(slot))
    return bytes(header)


def creation_error(path: Path, size: int, step: int, error: int | None) -> QueueFileError:
    """What callers see when creating a queue file failed at `step` (MAP_CREATE,
    MAP_RESERVE, MAP_MAP) with errno `error`: a full disk is a DiskFullError."""
    reason = os.strerror(error) if error else "unknown error"
    if step == MAP_CREATE:
        return QueueFileError(str(path), f"cannot create: {reason}")
    if step == MAP_RESERVE and error == errno.ENOSPC:
        return DiskFullError(str(path), f"cannot reserve {size} bytes: no space left on device")
    if step == MAP_RESERVE:
        return QueueFileError(str(path), f"cannot reserve {size} bytes: {reason}")
    return QueueFileError(str(path), f"cannot map {size} bytes: {reason}")


def allocated_bytes(path: Path) -> int:
    """Bytes the file takes on disk (st_blocks): what the disk budget counts."""
    return os.stat(path).st_blocks * 512


def fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
