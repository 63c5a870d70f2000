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
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from crc32c import crc32c

from eventspool.clock import SYSTEM_CLOCK, Clock
from eventspool.config import Durability, FullPolicy, QueueSettings
from eventspool.errors import (
    CorruptQueueError,
    EventTooLargeError,
    InvalidEventError,
    QueueFileError,
    SpoolClosedError,
    SpoolFullError,
)
from eventspool.metrics import FSYNC_SECONDS

MAGIC = b"EVSPRING"
FORMAT_VERSION = 1
HEADER_SIZE = 4096
PAGE = 4096

_STATIC = struct.Struct("<8sIIQ")
_STATIC_CRC_OFFSET = _STATIC.size
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_HINT_OFFSET = 32
_SLOT = struct.Struct("<QQQQQQ")
_SLOT_OFFSETS = (64, 128)
_SLOT_CRC_OFFSET = _SLOT.size

_FRAME_LENGTH = struct.Struct("<I")
_FRAME_BODY = struct.Struct("<QQII")
FRAME_HEADER_SIZE = 8 + _FRAME_BODY.size
_FRAME_FULL = struct.Struct("<IIQQII")
_PADDING_FLAG = 0x8000_0000
_LENGTH_MASK = 0x7FFF_FFFF


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


@dataclass(slots=True)
class _Slot:
    counter: int
    head: int
    head_seq: int
    generation: int
    dropped: int
    skipped: int


class _GroupCommit:
    """Shares one fdatasync among every writer waiting for durability.

    The first waiter syncs; writers arriving during that sync wait for the next one,
    which then covers all of them.
    """

    def __init__(self, fd: int) -> None:
        self._fd = fd
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
                try:
                    with FSYNC_SECONDS.time():
                        os.fdatasync(self._fd)
                finally:
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
    ) -> None:
        self.path = path
        self.settings = settings
        self._clock = clock
        self._fd = fd
        self._writable = writable
        size = os.fstat(fd).st_size
        if size < HEADER_SIZE + PAGE:
            raise CorruptQueueError(str(path), f"file is {size} bytes, too short for a queue")
        access = mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ
        self._mm = mmap.mmap(fd, size, access=access)
        self._capacity = self._read_static_header(size)
        self._max_payload = min(max_payload, self._capacity // 4)
        self._lock = threading.Lock()
        self._space = threading.Condition(self._lock)
        self._closed = False
        self._commit = _GroupCommit(fd) if settings.durability is Durability.FSYNC else None
        slot = self._read_slot()
        self._slot = slot
        self._generation = slot.generation
        self._head = slot.head
        self._head_seq = slot.head_seq
        self.recovery = self._scan(slot)
        self._read = self._head
        self._read_seq = self._head_seq
        if writable:
            slot.generation += 1
            self._generation = slot.generation
            slot.skipped += self.recovery.skipped_records
            if self.recovery.corrupt_tail:
                self._scrub_free_space()
            self._persist_head()
            _U64.pack_into(self._mm, _HINT_OFFSET, self._next_seq)

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
    ) -> RingQueue:
        """Open the ring at `path`, creating it with `settings.capacity_bytes` if absent.

        Raises QueueFileError if the file cannot be created (disk full) and
        CorruptQueueError if its header cannot be trusted.
        """
        settings = settings or QueueSettings()
        if create and writable and not path.exists():
            _create_file(path, settings.capacity_bytes)
        flags = os.O_RDWR if writable else os.O_RDONLY
        try:
            fd = os.open(path, flags)
        except OSError as exc:
            raise QueueFileError(str(path), f"cannot open: {exc.strerror}") from exc
        try:
            return cls(path, fd, settings, clock, max_payload, writable=writable)
        except BaseException:
            os.close(fd)
            raise

    def _read_static_header(self, size: int) -> int:
        magic, version, header_size, capacity = _STATIC.unpack_from(self._mm, 0)
        name = str(self.path)
        if magic != MAGIC:
            raise CorruptQueueError(name, f"bad magic {magic!r}: not an eventspool queue file")
        (stored_crc,) = _U32.unpack_from(self._mm, _STATIC_CRC_OFFSET)
        if stored_crc != crc32c(self._mm[0:_STATIC_CRC_OFFSET]):
            raise CorruptQueueError(name, "header checksum mismatch; refusing to guess positions")
        if version != FORMAT_VERSION:
            raise CorruptQueueError(name, f"format version {version} is not supported")
        if header_size != HEADER_SIZE or capacity % PAGE or HEADER_SIZE + capacity != size:
            raise CorruptQueueError(
                name, f"header says capacity {capacity} but the file is {size} bytes"
            )
        return int(capacity)

    def _read_slot(self) -> _Slot:
        best: _Slot | None = None
        for offset in _SLOT_OFFSETS:
            fields = _SLOT.unpack_from(self._mm, offset)
            (stored,) = _U32.unpack_from(self._mm, offset + _SLOT_CRC_OFFSET)
            if stored != crc32c(self._mm[offset : offset + _SLOT.size]):
                continue
            slot = _Slot(*fields)
            if best is None or slot.counter > best.counter:
                best = slot
        if best is None:
            raise CorruptQueueError(
                str(self.path), "both copies of the read position are damaged; refusing to reset"
            )
        return best

    def _scan(self, slot: _Slot) -> RecoveryReport:
        """Find the end of the valid records after the acknowledged position."""
        mm = self._mm
        cap = self._capacity
        pos = slot.head
        seq = slot.head_seq
        prev_generation = 0
        records = 0
        reason = "clean end"
        corrupt = False
        while pos - slot.head < cap:
            phys = pos % cap
            room = cap - phys
            if room < FRAME_HEADER_SIZE:
                pos += room
                continue
            base = HEADER_SIZE + phys
            length_word, crc, frame_seq, _, generation, zero = _FRAME_FULL.unpack_from(mm, base)
            length = length_word & _LENGTH_MASK
            is_padding = bool(length_word & _PADDING_FLAG)
            if length_word == 0:
                break
            if frame_seq < seq or generation < prev_generation:
                break
            end = base + FRAME_HEADER_SIZE + (0 if is_padding else length)
            if (
                frame_seq != seq
                or generation > slot.generation
                or zero != 0
                or (is_padding and length != room)
                or (not is_padding and frame_size(length) > room)
                or crc != crc32c(mm[base + 8 : end], length_word)
            ):
                reason = f"record at position {pos} (sequence {seq}) failed validation"
                corrupt = True
                break
            prev_generation = generation
            if is_padding:
                pos += room
                continue
            pos += frame_size(length)
            seq += 1
            records += 1
        self._tail = pos
        self._next_seq = seq
        (hint,) = _U64.unpack_from(mm, _HINT_OFFSET)
        plausible = seq <= hint <= seq + cap // FRAME_HEADER_SIZE
        skipped = hint - seq if plausible else 0
        if skipped and not corrupt:
            reason = f"records {seq}..{hint - 1} were written but are unreadable"
        return RecoveryReport(records, pos - slot.head, skipped, corrupt or skipped > 0, reason)

    def _scrub_free_space(self) -> None:
        """Zero everything after the recovered tail, once, after a damaged tail was found.

        What lies there is garbage or records that could not be verified; left in place,
        a later scan starting beyond the rewritten part could take them for valid.
        """
        cap = self._capacity
        start = self._tail % cap
        free = cap - (self._tail - self._head)
        first = min(free, cap - start)
        self._mm[HEADER_SIZE + start : HEADER_SIZE + start + first] = bytes(first)
        if free > first:
            self._mm[HEADER_SIZE : HEADER_SIZE + free - first] = bytes(free - first)

    # ---- writing ---------------------------------------------------------------

    def append(self, payload: bytes, timestamp_ms: int | None = None) -> int:
        """Append one record; returns its sequence once it is as durable as configured.

        Payloads must not be empty: a zero length word is how the ring marks its end.
        This is the hot path of every send, hence written flat.
        """
        length = len(payload)
        if not 0 < length <= self._max_payload:
            raise self._bad_length(length)
        ts = self._clock.now_ms() if timestamp_ms is None else timestamp_ms
        size = (FRAME_HEADER_SIZE + length + 7) & ~7
        with self._lock:
            if self._closed:
                raise SpoolClosedError(f"queue {self.path} is closed")
            cap = self._capacity
            tail = self._tail
            if cap - tail % cap < size or cap - (tail - self._head) < size:
                self._make_room(size, ts)
                tail = self._tail
            seq = self._next_seq
            base = HEADER_SIZE + tail % cap
            mm = self._mm
            body = _FRAME_BODY.pack(seq, ts, self._generation, 0) + payload
            mm[base + 8 : base + 8 + len(body)] = body
            _U32.pack_into(mm, base + 4, crc32c(body, length))
            _U32.pack_into(mm, base, length)
            self._tail = tail + size
            self._next_seq = seq + 1
            _U64.pack_into(mm, _HINT_OFFSET, seq + 1)
        if self._commit is not None:
            self._commit.wait_durable(seq, self._next_seq - 1)
        return seq

    def append_many(self, payloads: list[bytes], timestamp_ms: int | None = None) -> int:
        """Append records in order under one lock and one sync; returns the first sequence.

        When the queue fills under `reject` or `block`, the exception is raised and the
        records appended before it stay appended.
        """
        for payload in payloads:
            if not 0 < len(payload) <= self._max_payload:
                raise self._bad_length(len(payload))
        ts = self._clock.now_ms() if timestamp_ms is None else timestamp_ms
        with self._lock:
            if self._closed:
                raise SpoolClosedError(f"queue {self.path} is closed")
            first = self._next_seq
            for payload in payloads:
                self._write_locked(payload, ts)
            last = self._next_seq - 1
        if self._commit is not None and last >= first:
            self._commit.wait_durable(last, last)
        return first

    def _fits(self, size: int) -> bool:
        """Whether a record of `size` bytes fits at the tail without dropping anything."""
        cap = self._capacity
        room = cap - self._tail % cap
        needed = size + (room if room < size else 0)
        return cap - (self._tail - self._head) >= needed

    def _bad_length(self, length: int) -> InvalidEventError:
        if not length:
            return InvalidEventError("a queue record must not be empty")
        return EventTooLargeError(
            f"record of {length} bytes exceeds the maximum of {self._max_payload} "
            f"for queue {self.path.name}"
        )

    def _write_locked(self, payload: bytes, ts: int) -> int:
        length = len(payload)
        size = frame_size(length)
        cap = self._capacity
        if cap - self._tail % cap < size or cap - (self._tail - self._head) < size:
            self._make_room(size, ts)
        seq = self._next_seq
        base = HEADER_SIZE + self._tail % cap
        body = _FRAME_BODY.pack(seq, ts, self._generation, 0) + payload
        self._mm[base + 8 : base + 8 + len(body)] = body
        _U32.pack_into(self._mm, base + 4, crc32c(body, length))
        _U32.pack_into(self._mm, base, length)
        self._tail += size
        self._next_seq = seq + 1
        _U64.pack_into(self._mm, _HINT_OFFSET, seq + 1)
        return seq

    def _make_room(self, size: int, ts: int) -> None:
        """Free space for a record of `size` bytes by the full-queue policy, then pad.

        On return the record fits at the tail without wrapping. The space needed is
        computed again after every wait: other writers may have moved the tail meanwhile.
        """
        cap = self._capacity
        policy = self.settings.full_policy
        deadline: float | None = None
        dropped = False
        while True:
            room = cap - self._tail % cap
            needed = size + (room if room < size else 0)
            if cap - (self._tail - self._head) >= needed:
                break
            if policy is FullPolicy.DROP_OLDEST:
                self._drop_head()
                dropped = True
                continue
            if policy is FullPolicy.BLOCK:
                if self._closed:
                    raise SpoolClosedError(f"queue {self.path} is closed")
                now = self._clock.monotonic()
                if deadline is None:
                    deadline = now + self.settings.block_timeout_s
                if now < deadline:
                    self._space.wait(deadline - now)
                    continue
            raise SpoolFullError(
                f"queue {self.path.name} is full: {self._tail - self._head} of {cap} bytes "
                f"hold {self._next_seq - self._head_seq} unsent records (policy {policy.value})"
            )
        if dropped:
            self._persist_head()
        if room < size:
            if room >= FRAME_HEADER_SIZE:
                self._write_padding(HEADER_SIZE + self._tail % cap, room, ts)
            self._tail += room

    def _write_padding(self, base: int, room: int, ts: int) -> None:
        mm = self._mm
        body = _FRAME_BODY.pack(self._next_seq, ts, self._generation, 0)
        word = _PADDING_FLAG | room
        mm[base + 8 : base + 8 + len(body)] = body
        _U32.pack_into(mm, base + 4, crc32c(body, word))
        _U32.pack_into(mm, base, word)

    def _drop_head(self) -> None:
        self._head = self._next_position(self._head)
        self._head_seq += 1
        self._slot.dropped += 1
        if self._read_seq < self._head_seq:
            self._read = self._head
            self._read_seq = self._head_seq

    def _skip_padding(self, pos: int) -> int:
        """Move past padding at `pos`, so it points at a record (or the tail)."""
        cap = self._capacity
        while pos < self._tail:
            phys = pos % cap
            room = cap - phys
            if room < FRAME_HEADER_SIZE:
                pos += room
                continue
            (word,) = _FRAME_LENGTH.unpack_from(self._mm, HEADER_SIZE + phys)
            if not word & _PADDING_FLAG:
                break
            pos += room
        return pos

    def _next_position(self, pos: int) -> int:
        """The position after the record at (or after padding at) `pos`."""
        pos = self._skip_padding(pos)
        (length,) = _FRAME_LENGTH.unpack_from(self._mm, HEADER_SIZE + pos % self._capacity)
        return pos + frame_size(length)

    def _persist_head(self) -> None:
        slot = self._slot
        slot.counter += 1
        slot.head = self._head
        slot.head_seq = self._head_seq
        offset = _SLOT_OFFSETS[slot.counter % 2]
        _SLOT.pack_into(
            self._mm,
            offset,
            slot.counter,
            slot.head,
            slot.head_seq,
            slot.generation,
            slot.dropped,
            slot.skipped,
        )
        _U32.pack_into(
            self._mm, offset + _SLOT_CRC_OFFSET, crc32c(self._mm[offset : offset + _SLOT.size])
        )

    # ---- reading ---------------------------------------------------------------

    def read_batch(self, max_records: int = 500, max_bytes: int = 1 << 20) -> list[Record]:
        """Hand out the next records after those already handed out, without removing them.

        Returns at least one record when any is waiting, even one larger than `max_bytes`.
        """
        out: list[Record] = []
        mm = self._mm
        cap = self._capacity
        with self._lock:
            pos = self._read
            seq = self._read_seq
            total = 0
            while seq < self._next_seq and len(out) < max_records:
                pos = self._skip_padding(pos)
                base = HEADER_SIZE + pos % cap
                (length,) = _FRAME_LENGTH.unpack_from(mm, base)
                if out and total + length > max_bytes:
                    break
                frame_seq, ts, _, _ = _FRAME_BODY.unpack_from(mm, base + 8)
                start = base + FRAME_HEADER_SIZE
                out.append(Record(frame_seq, ts, mm[start : start + length]))
                total += length
                pos += frame_size(length)
                seq += 1
            self._read = pos
            self._read_seq = seq
        return out

    def rewind(self) -> None:
        """Hand out again every record not yet acknowledged (after a failed send)."""
        with self._lock:
            self._read = self._head
            self._read_seq = self._head_seq

    def ack(self, up_to_seq: int) -> None:
        """Remove every record up to and including `up_to_seq` for good.

        Acknowledging a record already removed (acknowledged, or dropped by drop_oldest
        while it was being sent) does nothing: the position never moves back.
        """
        with self._lock:
            if up_to_seq < self._head_seq:
                return
            if up_to_seq >= self._read_seq:
                raise ValueError(
                    f"cannot acknowledge sequence {up_to_seq} of {self.path.name}: "
                    f"only records below {self._read_seq} were handed out"
                )
            while self._head_seq <= up_to_seq:
                self._head = self._next_position(self._head)
                self._head_seq += 1
            self._persist_head()
            if self.settings.full_policy is FullPolicy.BLOCK:
                self._space.notify_all()

    # ---- state -----------------------------------------------------------------

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def is_open(self) -> bool:
        return not self._closed

    @property
    def head_seq(self) -> int:
        """Sequence of the oldest record not yet acknowledged."""
        return self._head_seq

    @property
    def depth(self) -> int:
        return self._next_seq - self._head_seq

    @property
    def next_seq(self) -> int:
        return self._next_seq

    @property
    def unread(self) -> int:
        return self._next_seq - self._read_seq

    @property
    def syncs(self) -> int:
        return self._commit.syncs if self._commit is not None else 0

    def stats(self) -> RingStats:
        with self._lock:
            oldest: int | None = None
            if self._next_seq > self._head_seq:
                pos = self._skip_padding(self._head)
                base = HEADER_SIZE + pos % self._capacity
                _, ts, _, _ = _FRAME_BODY.unpack_from(self._mm, base + 8)
                oldest = max(0, self._clock.now_ms() - ts)
            return RingStats(
                path=str(self.path),
                capacity=self._capacity,
                depth=self._next_seq - self._head_seq,
                bytes=self._tail - self._head,
                oldest_age_ms=oldest,
                head_seq=self._head_seq,
                read_seq=self._read_seq,
                next_seq=self._next_seq,
                head_position=self._head,
                tail_position=self._tail,
                generation=self._generation,
                dropped=self._slot.dropped,
                skipped_total=self._slot.skipped,
            )

    def close(self) -> None:
        """Persist the read position and release the file; later calls raise SpoolClosedError."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._space.notify_all()
            if self._writable:
                self._persist_head()
                if self._commit is not None:
                    os.fdatasync(self._fd)
            self._mm.close()
            os.close(self._fd)

    def __enter__(self) -> RingQueue:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def append_to_each(rings: Sequence[RingQueue], payload: bytes, timestamp_ms: int) -> None:
    """Append one payload to every ring, or to none of them; returns once all are durable.

    Every ring's lock is taken, in the order given, before anything is written; the
    record is written only when each ring has room for it (`drop_oldest` rings always
    make room). A ring full under `reject` raises SpoolFullError; under `block` the locks
    are let go while that ring drains, up to its `block_timeout_s`, and everything is
    checked again. Callers pass the rings in one global order (the spool sorts by topic),
    or two concurrent calls could deadlock.

    A crash in the middle of the writes may leave the record in some rings only: the
    call never returned, so nobody was told it succeeded.
    """
    length = len(payload)
    size = frame_size(length)
    for ring in rings:
        if not 0 < length <= ring._max_payload:
            raise ring._bad_length(length)
    deadline: float | None = None
    seqs: list[int] = []
    while True:
        full: RingQueue | None = None
        with ExitStack() as held:
            for ring in rings:
                held.enter_context(ring._lock)
            for ring in rings:
                if ring._closed:
                    raise SpoolClosedError(f"queue {ring.path} is closed")
                if ring.settings.full_policy is not FullPolicy.DROP_OLDEST and not ring._fits(size):
                    full = ring
                    break
            else:
                seqs = [ring._write_locked(payload, timestamp_ms) for ring in rings]
        if full is None:
            break
        where = f"{full.path.parent.name}/{full.path.name}"
        now = full._clock.monotonic()
        if deadline is None:
            deadline = now + full.settings.block_timeout_s
        if full.settings.full_policy is FullPolicy.REJECT or now >= deadline:
            raise SpoolFullError(
                f"queue {where} is full (policy {full.settings.full_policy.value}): "
                f"the event was written to none of its {len(rings)} queues"
            )
        with full._space:
            if not full._closed and not full._fits(size):
                full._space.wait(deadline - now)
    for ring, seq in zip(rings, seqs, strict=True):
        if ring._commit is not None:
            ring._commit.wait_durable(seq, ring._next_seq - 1)


def _create_file(path: Path, capacity: int) -> None:
    """Create a queue file completely or not at all.

    The space is reserved with posix_fallocate, never left sparse: a write into a hole
    of a full disk through mmap is a SIGBUS, while fallocate fails cleanly with ENOSPC.
    """
    capacity = (capacity + PAGE - 1) // PAGE * PAGE
    tmp = path.with_name(path.name + ".tmp")
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o640)
    except OSError as exc:
        raise QueueFileError(str(path), f"cannot create: {exc.strerror}") from exc
    try:
        try:
            os.posix_fallocate(fd, 0, HEADER_SIZE + capacity)
        except OSError as exc:
            reason = "no space left on device" if exc.errno == errno.ENOSPC else exc.strerror
            raise QueueFileError(
                str(path), f"cannot reserve {HEADER_SIZE + capacity} bytes: {reason}"
            ) from exc
        static = _STATIC.pack(MAGIC, FORMAT_VERSION, HEADER_SIZE, capacity)
        header = bytearray(HEADER_SIZE)
        header[0 : len(static)] = static
        _U32.pack_into(header, _STATIC_CRC_OFFSET, crc32c(static))
        slot = _SLOT.pack(1, 0, 0, 0, 0, 0)
        header[_SLOT_OFFSETS[1] : _SLOT_OFFSETS[1] + len(slot)] = slot
        _U32.pack_into(header, _SLOT_OFFSETS[1] + _SLOT_CRC_OFFSET, crc32c(slot))
        os.pwrite(fd, bytes(header), 0)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    os.close(fd)
    os.replace(tmp, path)
    _fsync_directory(path.parent)


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
