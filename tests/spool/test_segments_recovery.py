"""Recovery of a chain of segments, fed damaged bytes in any of its segments.

What a damaged segment loses stays inside it: every segment gives back a prefix of what
was written to it, in order and byte-exact, the segments after it are read as they
were, nothing that was never written is handed out, and what could not be trusted is
reported. The chain then goes on: records appended after the damage are found again.
"""

from __future__ import annotations

import hashlib
import shutil
import struct
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import hypothesis.strategies as st
from hypothesis import event, given, settings

from eventspool.spool.ring import HEADER_SIZE
from eventspool.spool.segments import SegmentedQueue
from tests.spool.segment_support import SEGMENT, open_queue, segment_files

MAX_PAYLOAD = 3000


def make_payload(seq: int, size: int) -> bytes:
    block = hashlib.blake2b(struct.pack("<QI", seq, size), digest_size=32).digest()
    return (block * (size // len(block) + 1))[:size]


@contextmanager
def scratch() -> Iterator[Path]:
    directory = Path(tempfile.mkdtemp(prefix="segments-recovery-"))
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def fill(directory: Path, sizes: list[int]) -> tuple[list[bytes], dict[str, range]]:
    """Append one payload per size; (payloads by sequence, sequences of each segment file)."""
    payloads = []
    with open_queue(directory, segments=8, max_payload=MAX_PAYLOAD) as queue:
        for seq, size in enumerate(sizes):
            payload = make_payload(seq, size)
            assert queue.append(payload) == seq
            payloads.append(payload)
        spans = {
            segment.ring.path.name: range(segment.ring.head_seq, segment.ring.next_seq)
            for segment in queue._segments
        }
    return payloads, spans


def read_all(queue: SegmentedQueue) -> list[tuple[int, bytes]]:
    out: list[tuple[int, bytes]] = []
    while batch := queue.read_batch(100_000, 1 << 30):
        out.extend((record.seq, record.payload) for record in batch)
    return out


def assert_prefix_of_each_segment(
    found: list[tuple[int, bytes]], payloads: list[bytes], spans: dict[str, range]
) -> None:
    for seq, payload in found:
        assert payload == payloads[seq], f"record {seq} is not what was written"
    seqs = [seq for seq, _ in found]
    assert seqs == sorted(set(seqs)), "out of order or twice"
    for span in spans.values():
        kept = [seq for seq in seqs if seq in span]
        assert kept == list(span[: len(kept)]), f"segment {span} lost a record in its middle"


sizes_st = st.lists(st.integers(1, MAX_PAYLOAD), min_size=60, max_size=150)
damage_st = st.tuples(
    st.sampled_from(["flip", "zero", "garbage"]),
    st.integers(0, 10_000),  # which segment (modulo), and where
    st.integers(0, SEGMENT - 1),
    st.integers(1, 4000),
    st.binary(min_size=1, max_size=64),
)


@settings(max_examples=150, deadline=None)
@given(sizes=sizes_st, damage=damage_st, seed=st.integers(0, 2**32 - 1))
def test_damage_in_one_segment_stays_in_it(
    sizes: list[int], damage: tuple[str, int, int, int, bytes], seed: int
) -> None:
    kind, which, offset, length, garbage = damage
    with scratch() as directory:
        payloads, spans = fill(directory, sizes)
        names = sorted(spans)
        victim = directory / names[which % len(names)]
        data = bytearray(victim.read_bytes())
        start = HEADER_SIZE + offset
        if kind == "flip":
            data[start] ^= 1 << (seed % 8)
        elif kind == "zero":
            data[start : start + length] = bytes(len(data[start : start + length]))
        else:
            data[start : start + len(garbage)] = garbage
        victim.write_bytes(bytes(data[: HEADER_SIZE + SEGMENT]))
        with open_queue(directory, segments=8, max_payload=MAX_PAYLOAD) as queue:
            found = read_all(queue)
            assert_prefix_of_each_segment(found, payloads, spans)
            lost = len(payloads) - len(found)
            if lost:
                event("records lost to the damage")
                assert queue.recovery.corrupt_tail
            kept = {seq for seq, _ in found}
            for name, span in spans.items():
                assert name == victim.name or set(span) <= kept, f"damage spread to {name}"
            queue.rewind()
            nxt = queue.next_seq
            extra = [make_payload(nxt + i, 100 + i) for i in range(70)]  # into a new segment
            for payload in extra:
                queue.append(payload)
        with open_queue(directory, segments=8, max_payload=MAX_PAYLOAD) as queue:
            again = read_all(queue)
        assert again[: len(found)] == found
        assert [p for _, p in again[len(found) :]] == extra


def test_a_torn_tail_at_a_segment_boundary(tmp_path: Path) -> None:
    """The last record of a sealed segment torn by a crash: it is lost and counted, the
    next segment reads on from its first record, and nothing stale comes back."""
    sizes = [1000] * 100  # 63 in segment 0, the rest in segment 1
    payloads, spans = fill(tmp_path, sizes)
    first = tmp_path / "0.queue"
    data = bytearray(first.read_bytes())
    last_frame = HEADER_SIZE + 62 * 1032
    data[last_frame + 40 : last_frame + 48] = b"\xff" * 8  # a half-written payload
    first.write_bytes(bytes(data))
    with open_queue(tmp_path, segments=8) as queue:
        found = read_all(queue)
        assert [seq for seq, _ in found] == [*range(62), *range(63, 100)]
        assert queue.recovery.corrupt_tail and queue.recovery.skipped_records == 1
        assert queue.stats().skipped_total == 1
        queue.ack(found[-1][0])
        assert segment_files(tmp_path) == ["0.1.queue"]
    assert_prefix_of_each_segment(found, payloads, spans)
