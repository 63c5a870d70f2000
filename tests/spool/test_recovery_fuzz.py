"""The recovery scan of the compiled ring, fed damaged and random bytes.

Whatever a disk or a crash leaves in the record area, opening the ring must not crash
(the scan runs in C, over a memory map) and must not hand out a record that was never
written: what comes back is always a prefix of the records that were queued, in order
and byte-exact, and the records it cannot trust are counted as skipped. Only a damaged
*header* may refuse the open, with CorruptQueueError, and then the file is untouched.
A read-only open must not change a byte of the file; a writable one must leave it so
that records appended after the damage are found again, and nothing else.
"""

from __future__ import annotations

import hashlib
import itertools
import random
import shutil
import struct
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import hypothesis.strategies as st
from hypothesis import event, given, note, settings

from eventspool.config import QueueSettings
from eventspool.errors import CorruptQueueError
from eventspool.spool.ring import HEADER_SIZE, Record, RingQueue, frame_size

CAPACITY = 65536
MAX_PAYLOAD = 6000
SETTINGS = QueueSettings(capacity_bytes=CAPACITY)
FILE_SIZE = HEADER_SIZE + CAPACITY
READ_ALL = (100_000, 1 << 30)

_FRAME = struct.Struct("<IIQQII")
_PADDING_FLAG = 0x8000_0000

# Where the warm-up leaves the tail: 0 to 2 laps on, often close to the end of the area.
warmup_st = st.builds(
    lambda laps, position: laps * CAPACITY + position,
    st.integers(0, 2),
    st.one_of(st.integers(0, CAPACITY - 1), st.integers(CAPACITY - 2 * MAX_PAYLOAD, CAPACITY)),
)
sizes_st = st.lists(
    st.one_of(st.integers(1, 64), st.integers(1, MAX_PAYLOAD)), min_size=1, max_size=60
)


def make_payload(seq: int, size: int) -> bytes:
    """A payload no other sequence has: a pattern derived from the sequence and size."""
    block = hashlib.blake2b(struct.pack("<QI", seq, size), digest_size=32).digest()
    return (block * (size // len(block) + 1))[:size]


@dataclass(frozen=True)
class Written:
    """What went into a ring: every payload (index = sequence) and where its frame is."""

    payloads: list[bytes]
    offsets: list[int]  # of each frame in the record area (not in the file)
    head: int  # first sequence not acknowledged
    tail: int  # offset in the area just after the last frame

    @property
    def queued(self) -> list[tuple[int, bytes]]:
        return list(enumerate(self.payloads))[self.head :]


def open_ring(path: Path, writable: bool) -> RingQueue:
    if writable:
        return RingQueue.open(path, SETTINGS, max_payload=MAX_PAYLOAD)
    return RingQueue.open(path, create=False, writable=False)


@dataclass(frozen=True)
class History:
    """How a ring is filled before it is damaged; see fill_ring."""

    sizes: list[int]
    warmup: int = 0
    reopens: frozenset[int] = frozenset()
    final_acks: int = 0


def fill_ring(path: Path, history: History) -> Written:
    """Append one payload per size, acknowledging the oldest whenever one does not fit.

    First, records of about `warmup` bytes in all are appended and acknowledged at
    once, to move the head along: the queued records may straddle the end of the area,
    and the area holds stale frames and payloads of earlier laps. The ring is reopened
    before the records in `reopens` (so frames of several generations), and finally
    `final_acks` more of what is queued are acknowledged.
    """
    warmup = history.warmup
    warm: list[int] = []
    while sum(map(frame_size, warm)) < warmup:
        warm.append(max(1, min(MAX_PAYLOAD, warmup - sum(map(frame_size, warm)) - 32)))
    payloads: list[bytes] = []
    offsets: list[int] = []
    head = 0
    ring = open_ring(path, writable=True)
    try:
        for seq, size in enumerate(warm + history.sizes):
            if seq in history.reopens:
                ring.close()
                ring = open_ring(path, writable=True)
                assert ring.recovery.records == seq - head
                assert ring.recovery.skipped_records == 0
            payload = make_payload(seq, size)
            while not ring.core.fits(frame_size(size)):
                (oldest,) = ring.read_batch(1, 1)
                ring.ack(oldest.seq)
                head += 1
            assert ring.append(payload) == seq
            payloads.append(payload)
            offsets.append((ring.core.tail - frame_size(size)) % CAPACITY)
            if seq < len(warm):
                ring.read_batch(1, 1)
                ring.ack(seq)
                head += 1
        acks = min(history.final_acks, len(payloads) - head)
        if acks:
            batch = ring.read_batch(acks, 1 << 30)
            ring.ack(batch[-1].seq)
            head += acks
        tail = ring.core.tail % CAPACITY
    finally:
        ring.close()
    return Written(payloads, offsets, head, tail)


@contextmanager
def scratch_file() -> Iterator[Path]:
    directory = Path(tempfile.mkdtemp(prefix="recovery-fuzz-"))
    try:
        yield directory / "0.queue"
    finally:
        shutil.rmtree(directory, ignore_errors=True)


# ---- damage ------------------------------------------------------------------------


@dataclass(frozen=True)
class Overwrite:
    offset: int
    data: bytes

    def apply(self, area: bytearray) -> None:
        chunk = self.data[: CAPACITY - self.offset]
        area[self.offset : self.offset + len(chunk)] = chunk


@dataclass(frozen=True)
class Zero:
    """Zeroes a range, as a write that never reached the disk would leave it."""

    offset: int
    length: int

    def apply(self, area: bytearray) -> None:
        end = min(CAPACITY, self.offset + self.length)
        area[self.offset : end] = bytes(end - self.offset)


@dataclass(frozen=True)
class FlipBit:
    offset: int
    bit: int

    def apply(self, area: bytearray) -> None:
        area[self.offset] ^= 1 << self.bit


@dataclass(frozen=True)
class Copy:
    """Copies bytes within the area: one frame over another, or any range."""

    source: int
    target: int
    length: int

    def apply(self, area: bytearray) -> None:
        length = min(self.length, CAPACITY - self.source, CAPACITY - self.target)
        area[self.target : self.target + length] = area[self.source : self.source + length]


Damage = Overwrite | Zero | FlipBit | Copy


def damage_st(written: Written) -> st.SearchStrategy[Damage]:
    """Damage anywhere in the area, or aimed at the frames that matter and their headers.

    The aimed offsets are the frames still queued and the end of the last one (where
    the scan must stop); the offset within a frame favours its 32-byte header.
    """
    frames = [(written.offsets[seq], len(p)) for seq, p in written.queued]
    aims = sorted({offset for offset, _ in frames} | {written.tail})
    anywhere = st.integers(0, CAPACITY - 1)
    aimed = st.builds(
        lambda base, delta: min(base + delta, CAPACITY - 1),
        st.sampled_from(aims),
        st.one_of(st.integers(0, 31), st.integers(0, MAX_PAYLOAD)),
    )
    offset_st = st.one_of(anywhere, aimed)
    options: list[st.SearchStrategy[Damage]] = [
        st.builds(Overwrite, offset_st, st.binary(min_size=1, max_size=64)),
        st.builds(Zero, offset_st, st.integers(1, CAPACITY)),
        st.builds(FlipBit, offset_st, st.integers(0, 7)),
        st.builds(Copy, anywhere, anywhere, st.integers(1, 4096)),
    ]
    if frames:
        frame_st = st.sampled_from(frames)
        options.append(
            st.builds(
                lambda source, target: Copy(source[0], target, frame_size(source[1])),
                frame_st,
                st.sampled_from(aims),
            )
        )
    return st.one_of(options)


# ---- checks --------------------------------------------------------------------------


def read_everything(ring: RingQueue) -> list[Record]:
    records = ring.read_batch(*READ_ALL)
    assert ring.read_batch(*READ_ALL) == [], "read_batch held records back"
    return records


def assert_prefix(records: list[Record], written: Written) -> None:
    """The records are the first ones still queued, in order, byte for byte."""
    got = [(r.seq, r.payload) for r in records]
    assert got == written.queued[: len(got)], "recovery handed out a record never written"


def assert_recovered(ring: RingQueue, records: list[Record], written: Written) -> None:
    """A prefix came back, the report agrees, and whatever was lost is counted."""
    assert_prefix(records, written)
    report = ring.recovery
    assert report.records == len(records)
    assert report.bytes >= sum(frame_size(len(r.payload)) for r in records)
    lost = len(written.queued) - len(records)
    # The header's write hint (undamaged here) says how many records there were.
    assert report.skipped_records == lost
    assert report.corrupt_tail or not lost
    assert ring.head_seq == written.head
    assert ring.next_seq == written.head + len(records)


def reopen_after_append(path: Path, records: list[Record], written: Written) -> None:
    """After a writable recovery, new records follow the kept ones, and nothing else does."""
    extra: list[tuple[int, bytes]] = []
    with open_ring(path, writable=True) as ring:
        kept = read_everything(ring)
        assert [(r.seq, r.payload) for r in kept] == [(r.seq, r.payload) for r in records]
        for index, size in enumerate((1, 100, 1000)):
            if not ring.core.fits(frame_size(size)):
                break
            seq = ring.next_seq
            payload = make_payload(10_000 + index, size)
            assert ring.append(payload) == seq
            extra.append((seq, payload))
    with open_ring(path, writable=True) as ring:
        assert not ring.recovery.corrupt_tail
        assert ring.recovery.skipped_records == 0
        again = [(r.seq, r.payload) for r in read_everything(ring)]
        assert again == [(r.seq, r.payload) for r in records] + extra


# ---- tests -----------------------------------------------------------------------------


history_st = st.builds(
    History,
    sizes=sizes_st,
    warmup=warmup_st,
    reopens=st.frozensets(st.integers(1, 100), max_size=3),
    final_acks=st.one_of(st.just(0), st.integers(0, 10)),
)


@settings(max_examples=300)
@given(history=history_st, writable=st.booleans(), data=st.data())
def test_damaged_record_area(history: History, writable: bool, data: st.DataObject) -> None:
    with scratch_file() as path:
        written = fill_ring(path, history)
        damage = data.draw(st.lists(damage_st(written), min_size=1, max_size=4), label="damage")
        image = bytearray(path.read_bytes())
        area = image[HEADER_SIZE:]
        for item in damage:
            item.apply(area)
        image[HEADER_SIZE:] = area
        path.write_bytes(image)
        note(f"queued {len(written.queued)} records from {written.head}, tail at {written.tail}")

        with open_ring(path, writable) as ring:
            records = read_everything(ring)
            assert_recovered(ring, records, written)
            event("records lost" if len(records) < len(written.queued) else "records all kept")
            event(
                "scan failed validation"
                if ring.recovery.stop_reason != "clean end"
                else "scan ended clean"
            )
        if any(b < a for a, b in itertools.pairwise(written.offsets[written.head :])):
            event("queued records wrap around")
        if not writable:
            assert path.read_bytes() == image, "a read-only open changed the file"
        else:
            reopen_after_append(path, records, written)


@settings(max_examples=200)
@given(
    sizes=st.lists(st.integers(1, MAX_PAYLOAD), max_size=30),
    seed=st.integers(0, 2**64 - 1),
    plant=st.sampled_from(["none", "record", "padding"]),
    writable=st.booleans(),
)
def test_random_record_area(sizes: list[int], seed: int, plant: str, writable: bool) -> None:
    """A record area of pure random bytes, after a ring that held records and sent them all.

    The head sits wherever those records left it. `plant` writes, at the head, a frame
    header the scan cannot reject before checking its CRC (the right sequence and
    generation), so that random lengths reach the length and CRC checks too.
    """
    with scratch_file() as path:
        written = fill_ring(path, History(sizes, final_acks=len(sizes)))
        assert written.queued == []
        image = bytearray(path.read_bytes())
        rng = random.Random(seed)
        image[HEADER_SIZE:] = rng.randbytes(CAPACITY)
        if plant != "none":
            offset = HEADER_SIZE + written.tail
            if plant == "padding":  # a padding frame's length is the room left
                word = _PADDING_FLAG | (FILE_SIZE - offset)
            else:
                word = rng.choice([rng.getrandbits(31) or 1, rng.randint(1, MAX_PAYLOAD)])
            # Generation 1: that of fill_ring's one writable open.
            frame = _FRAME.pack(word, rng.getrandbits(32), written.head, 0, 1, 0)
            image[offset : offset + _FRAME.size] = frame[: FILE_SIZE - offset]
        path.write_bytes(image)

        with open_ring(path, writable) as ring:
            records = read_everything(ring)
            assert records == [], "random bytes passed for a record"
            assert ring.recovery.records == 0
            assert ring.head_seq == ring.next_seq == written.head
            clean = ring.recovery.stop_reason == "clean end"
            event(f"plant {plant}: {'clean end' if clean else 'failed validation'}")
        if not writable:
            assert path.read_bytes() == image, "a read-only open changed the file"
        else:
            reopen_after_append(path, [], written)


@settings(max_examples=150)
@given(
    sizes=st.lists(st.integers(1, 3000), min_size=1, max_size=40),
    final_acks=st.integers(0, 10),
    damage=st.lists(
        st.one_of(
            st.builds(Overwrite, st.integers(0, 255), st.binary(min_size=1, max_size=16)),
            st.builds(FlipBit, st.integers(0, 191), st.integers(0, 7)),
            st.builds(Zero, st.integers(0, 191), st.integers(1, 64)),
        ),
        min_size=1,
        max_size=3,
    ),
    writable=st.booleans(),
)
def test_damaged_header(
    sizes: list[int], final_acks: int, damage: list[Damage], writable: bool
) -> None:
    """A damaged header either refuses the open, untouched, or yields only written records.

    Losing one position slot falls back to the other, written one update earlier, so
    records already acknowledged may come back (at least once delivery), or records
    may be lost if the older head now lies under newer ones; but any record that does
    come back is under its own sequence and byte-exact.
    """
    with scratch_file() as path:
        written = fill_ring(path, History(sizes, final_acks=final_acks))
        image = bytearray(path.read_bytes())
        header = image[:HEADER_SIZE]
        for item in damage:
            item.apply(header)
        image[:HEADER_SIZE] = header
        path.write_bytes(image)

        try:
            ring = open_ring(path, writable)
        except CorruptQueueError:
            assert path.read_bytes() == image, "a refused open changed the file"
            return
        with ring:
            records = read_everything(ring)
            got = [(r.seq, r.payload) for r in records]
            if got:
                first = got[0][0]
                assert got == list(enumerate(written.payloads))[first : first + len(got)]
        if not writable:
            assert path.read_bytes() == image, "a read-only open changed the file"


def test_clean_reopen_after_a_wrap_reports_no_damage() -> None:
    """Nothing damaged, nothing lost: the reopen must not call the ring damaged.

    Past the tail of a ring that wrapped lie the bytes of earlier laps, here the middle
    of an old payload of ordinary text. The scan stops there, and the write hint says
    no record is missing: a clean end, not the DAMAGED that `spool inspect` would show.
    """
    text = (b'{"user": 12345, "action": "click", "page": "/home"}\n' * 200)[:MAX_PAYLOAD]
    with scratch_file() as path:
        with open_ring(path, writable=True) as ring:
            for _ in range(10):  # frames of 6032 bytes: 60320 of the 65536
                ring.append(text)
            ring.ack(ring.read_batch(10, 1 << 30)[-1].seq)
            ring.append(text[:5500])  # does not fit before the end: padding, then 0..5536
        with open_ring(path, writable=False) as ring:
            assert [r.payload for r in read_everything(ring)] == [text[:5500]]
            assert ring.recovery.skipped_records == 0
            assert ring.recovery.stop_reason == "clean end"
            assert not ring.recovery.corrupt_tail
