"""Concurrent writers (and a concurrent reader) on one ring, checked against a model.

The compiled core writes large payloads without the interpreter lock, so several
threads really are inside the ring at once. Whatever the interleaving, every appended
record must be there exactly once, byte-exact, in its writer's order, under the
sequence its append returned, with sequences consecutive overall; and a reopen must
recover exactly what was in the ring.

Each payload describes itself (writer, counter, size, then a pattern derived from
them), so a record that was torn, duplicated or attributed to the wrong sequence
cannot pass for another.
"""

from __future__ import annotations

import hashlib
import itertools
import struct
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

import hypothesis.strategies as st
from hypothesis import event, given, settings

from eventspool.config import MIB, QueueSettings
from eventspool.spool.ring import Record, RingQueue, frame_size

THREADS = 4
MAX_PAYLOAD = 1 << 20
MAX_STEPS = 25
MAX_BATCH = 4
CAPACITY = 64 * MIB
# However hypothesis draws, the writers never fill the ring (a full ring is another
# test): each writer's schedule is cut short where its frames would pass its share.
WRITER_BUDGET = CAPACITY // THREADS
JOIN_TIMEOUT_S = 60.0
assert MAX_BATCH * frame_size(MAX_PAYLOAD) <= WRITER_BUDGET
assert MAX_PAYLOAD <= CAPACITY // 4

# Writer, per-writer counter, size: the start of every payload (as much of it as fits).
_STAMP = struct.Struct("<BII")


class Step(NamedTuple):
    """One call of a writer: `append` of one payload, or `append_many` of several."""

    many: bool
    sizes: tuple[int, ...]


# Tiny payloads (the stamp cut short), mid-sized ones written under the interpreter
# lock, and large ones copied without it.
sizes_st = st.one_of(
    st.integers(1, 16),
    st.integers(17, 65535),
    st.integers(65536, MAX_PAYLOAD),
)
step_st = st.one_of(
    st.builds(lambda size: Step(False, (size,)), sizes_st),
    st.builds(
        lambda sizes: Step(True, tuple(sizes)),
        st.lists(sizes_st, min_size=1, max_size=MAX_BATCH),
    ),
)


def within_budget(steps: list[Step]) -> list[Step]:
    """The longest prefix of `steps` whose frames fit in one writer's share of the ring."""
    used = 0
    for index, step in enumerate(steps):
        used += sum(frame_size(size) for size in step.sizes)
        if used > WRITER_BUDGET:
            return steps[:index]
    return steps


schedule_st = st.lists(
    st.lists(step_st, min_size=1, max_size=MAX_STEPS).map(within_budget),
    min_size=THREADS,
    max_size=THREADS,
)


def make_payload(writer: int, counter: int, size: int) -> bytes:
    """The payload a writer appends as its `counter`-th record: stamp, then a pattern."""
    stamp = _STAMP.pack(writer, counter, size)
    block = hashlib.blake2b(stamp, digest_size=64).digest()
    return (stamp + block * (size // len(block) + 1))[:size]


def writer_payloads(writer: int, steps: Sequence[Step]) -> list[list[bytes]]:
    counter = 0
    calls: list[list[bytes]] = []
    for step in steps:
        calls.append([make_payload(writer, counter + i, size) for i, size in enumerate(step.sizes)])
        counter += len(step.sizes)
    return calls


@contextmanager
def fine_switching() -> Iterator[None]:
    """Let the interpreter switch threads often, so that small appends interleave too."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


class StartLine:
    """A barrier, then a spin until every thread is past it.

    A barrier alone wakes its threads one after the other, and a writer of a few small
    records is done before the next one is even awake: spinning (and letting go of the
    interpreter lock) keeps all of them runnable until the last one arrives.
    """

    def __init__(self, parties: int) -> None:
        self.parties = parties
        self.barrier = threading.Barrier(parties)
        self.lock = threading.Lock()
        self.arrived = 0

    def wait(self) -> None:
        self.barrier.wait(timeout=JOIN_TIMEOUT_S)
        with self.lock:
            self.arrived += 1
        deadline = time.monotonic() + JOIN_TIMEOUT_S
        while self.arrived < self.parties:
            assert time.monotonic() < deadline, "the other threads never arrived"
            time.sleep(0)


class Writer(threading.Thread):
    """Appends its calls in order once the barrier opens; logs (sequence, payload)."""

    def __init__(
        self,
        ring: RingQueue,
        steps: Sequence[Step],
        calls: list[list[bytes]],
        start: StartLine,
    ) -> None:
        super().__init__(daemon=True)
        self.ring = ring
        self.steps = steps
        self.calls = calls
        self.start_line = start
        self.log: list[tuple[int, bytes]] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.start_line.wait()
            for step, payloads in zip(self.steps, self.calls, strict=True):
                if step.many:
                    first = self.ring.append_many(payloads)
                    self.log.extend(enumerate(payloads, start=first))
                else:
                    self.log.append((self.ring.append(payloads[0]), payloads[0]))
                # Let another thread in: whoever holds the interpreter lock would
                # otherwise take the ring's lock again before any waiter wakes.
                time.sleep(0)
        except BaseException as exc:
            self.error = exc


class Reader(threading.Thread):
    """Reads (and every `ack_every` batches acknowledges) while the writers write."""

    def __init__(
        self,
        ring: RingQueue,
        total: int,
        *,
        max_records: int,
        max_bytes: int,
        ack_every: int,
        start: StartLine,
    ) -> None:
        super().__init__(daemon=True)
        self.ring = ring
        self.total = total
        self.max_records = max_records
        self.max_bytes = max_bytes
        self.ack_every = ack_every
        self.start_line = start
        self.received: list[Record] = []
        self.acked_up_to = -1
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.start_line.wait()
            deadline = time.monotonic() + JOIN_TIMEOUT_S
            batches = 0
            while len(self.received) < self.total:
                assert time.monotonic() < deadline, "reader timed out"
                batch = self.ring.read_batch(self.max_records, self.max_bytes)
                if not batch:
                    time.sleep(0.0002)
                    continue
                assert len(batch) <= self.max_records
                self.received.extend(batch)
                batches += 1
                if batches % self.ack_every == 0:
                    self.ring.ack(batch[-1].seq)
                    self.acked_up_to = batch[-1].seq
        except BaseException as exc:
            self.error = exc


def run_threads(threads: Sequence[Writer | Reader]) -> None:
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(JOIN_TIMEOUT_S)
        assert not thread.is_alive(), f"{thread.name} did not finish"
    for thread in threads:
        if thread.error is not None:
            raise thread.error


def check_logs(logs: Sequence[Sequence[tuple[int, bytes]]]) -> None:
    """The sequences append returned: consecutive overall, increasing within a writer."""
    seqs = sorted(seq for log in logs for seq, _ in log)
    assert seqs == list(range(len(seqs))), "append sequences are not 0, 1, 2, ... once each"
    for log in logs:
        own = [seq for seq, _ in log]
        assert own == sorted(own), "a writer's records got sequences out of its order"


def check_stream(
    records: Sequence[Record], logs: Sequence[Sequence[tuple[int, bytes]]], start: int = 0
) -> None:
    """`records` are exactly the logged appends from sequence `start` on, in order.

    Each record is attributed by its own first byte (the writer) and must be that
    writer's next record: same sequence as append returned, same bytes.
    """
    total = sum(len(log) for log in logs)
    assert [r.seq for r in records] == list(range(start, total)), (
        "sequences read are not consecutive"
    )
    cursors = [sum(1 for seq, _ in log if seq < start) for log in logs]
    for record in records:
        writer = record.payload[0]
        assert writer < len(logs), f"record {record.seq} names no writer"
        assert cursors[writer] < len(logs[writer]), f"writer {writer} has an extra record"
        seq, payload = logs[writer][cursors[writer]]
        if len(record.payload) >= _STAMP.size:
            _, counter, size = _STAMP.unpack_from(record.payload)
            assert (counter, size) == (cursors[writer], len(record.payload)), (
                f"record {record.seq} is out of writer {writer}'s order or cut short"
            )
        assert record.seq == seq, (
            f"writer {writer}'s record read at {record.seq}, appended at {seq}"
        )
        assert record.payload == payload, f"record {record.seq} is not byte-exact"
        cursors[writer] += 1
    assert cursors == [len(log) for log in logs], "records are missing"


def note_interleaving(logs: Sequence[Sequence[tuple[int, bytes]]]) -> None:
    """Tell how much the writers' records interleave (shown by --hypothesis-show-statistics)."""
    owners = [
        writer for _, writer in sorted((seq, w) for w, log in enumerate(logs) for seq, _ in log)
    ]
    switches = sum(a != b for a, b in itertools.pairwise(owners))
    event("writers interleaved" if switches >= len(logs) else "writers took turns")
    if any(len(payload) >= 1 << 16 for log in logs for _, payload in log):
        event("payloads copied without the interpreter lock")


def open_ring(path: Path) -> RingQueue:
    one_ring = QueueSettings(capacity_bytes=CAPACITY, segment_bytes=CAPACITY)
    return RingQueue.open(path, one_ring, max_payload=MAX_PAYLOAD)


@settings(max_examples=15)
@given(schedule=schedule_st)
def test_concurrent_writers(schedule: list[list[Step]]) -> None:
    with tempfile.TemporaryDirectory(prefix="ring-concurrency-") as directory:
        path = Path(directory) / "0.queue"
        ring = open_ring(path)
        try:
            start = StartLine(THREADS)
            writers = [
                Writer(ring, steps, writer_payloads(index, steps), start)
                for index, steps in enumerate(schedule)
            ]
            with fine_switching():
                run_threads(writers)
            logs = [writer.log for writer in writers]
            check_logs(logs)
            note_interleaving(logs)
            total = sum(len(log) for log in logs)
            assert ring.next_seq == total
            records = ring.read_batch(100_000, 1 << 30)
            check_stream(records, logs)
            assert ring.read_batch(100_000, 1 << 30) == []
        finally:
            ring.close()

        with open_ring(path) as reopened:
            assert not reopened.recovery.corrupt_tail
            assert reopened.recovery.skipped_records == 0
            assert reopened.recovery.records == total
            assert reopened.recovery.bytes == sum(frame_size(len(r.payload)) for r in records)
            again = reopened.read_batch(100_000, 1 << 30)
            assert [(r.seq, r.payload) for r in again] == [(r.seq, r.payload) for r in records]


@settings(max_examples=12)
@given(
    schedule=schedule_st,
    max_records=st.integers(1, 20),
    max_bytes=st.integers(1, 2 * MAX_PAYLOAD),
    ack_every=st.integers(1, 3),
)
def test_concurrent_writers_and_reader(
    schedule: list[list[Step]], max_records: int, max_bytes: int, ack_every: int
) -> None:
    """A reader hands records out and acknowledges them while the writers append."""
    total = sum(len(step.sizes) for steps in schedule for step in steps)
    with tempfile.TemporaryDirectory(prefix="ring-concurrency-") as directory:
        path = Path(directory) / "0.queue"
        ring = open_ring(path)
        try:
            start = StartLine(THREADS + 1)
            writers = [
                Writer(ring, steps, writer_payloads(index, steps), start)
                for index, steps in enumerate(schedule)
            ]
            reader = Reader(
                ring,
                total,
                max_records=max_records,
                max_bytes=max_bytes,
                ack_every=ack_every,
                start=start,
            )
            with fine_switching():
                run_threads([*writers, reader])
            logs = [writer.log for writer in writers]
            check_logs(logs)
            note_interleaving(logs)
            check_stream(reader.received, logs)
            kept = total - (reader.acked_up_to + 1)
            assert ring.depth == kept
            assert ring.head_seq == reader.acked_up_to + 1
            assert ring.unread == 0
        finally:
            ring.close()

        with open_ring(path) as reopened:
            assert not reopened.recovery.corrupt_tail
            assert reopened.recovery.skipped_records == 0
            assert reopened.recovery.records == kept
            assert reopened.head_seq == reader.acked_up_to + 1
            assert reopened.next_seq == total
            again = reopened.read_batch(100_000, 1 << 30)
            check_stream(again, logs, start=reader.acked_up_to + 1)
