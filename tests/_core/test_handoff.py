"""The consumer's hand-off ring, `Handoff`, against a model of what it may hold.

Two Handoff objects over one buffer stand for the poll process and a worker. Whatever
order puts and takes come in, a blob taken is the blob put, and a put never overwrites
one not taken yet: it returns None when there is no room. The sanitizer test runs this
file against the instrumented build.
"""

from __future__ import annotations

import multiprocessing
from collections import deque

import pytest
from hypothesis import given
from hypothesis import strategies as st

from eventspool._core.native import Handoff

HEADER = 64


def _ends(size: int) -> tuple[Handoff, Handoff]:
    buffer = bytearray(HEADER + size)
    return Handoff(buffer), Handoff(buffer)


@given(
    size=st.integers(1, 64),
    steps=st.lists(st.one_of(st.integers(0, 80), st.none()), max_size=60),
)
def test_a_blob_taken_is_the_blob_put_and_room_is_never_overcounted(
    size: int, steps: list[int | None]
) -> None:
    """A step is a put of that many bytes, or None: take the oldest blob."""
    writer, reader = _ends(size)
    waiting: deque[tuple[int, bytes]] = deque()
    taken_to = written_to = 0
    for number, step in enumerate(steps):
        if step is None:
            if waiting:
                start, blob = waiting.popleft()
                assert reader.take(start, len(blob)) == blob
                taken_to = start + len(blob)
            continue
        blob = bytes([number % 251 + 1]) * step
        put_at = writer.put(blob)
        at = written_to % size
        padded = written_to + (size - at if at + step > size else 0)
        fits = step <= size and padded + step - taken_to <= size
        if put_at is None:
            assert not fits
        else:
            assert fits
            assert put_at == padded
            written_to = put_at + step
            waiting.append((put_at, blob))
    for start, blob in waiting:
        assert reader.take(start, len(blob)) == blob


def test_the_room_a_take_frees_is_used_again_and_a_full_ring_refuses() -> None:
    writer, reader = _ends(100)
    assert writer.capacity == 100
    assert writer.put(b"a" * 40) == 0
    assert writer.put(b"b" * 40) == 40
    assert writer.put(b"c" * 40) is None  # 20 bytes left at the end, none at the start
    assert reader.take(0, 40) == b"a" * 40
    assert writer.put(b"c" * 40) == 100  # skips the 20 at the end, starts over at 0
    assert writer.put(b"d" * 10) is None  # 40..80 still holds b
    assert reader.take(40, 40) == b"b" * 40
    assert writer.put(b"d" * 50) is None  # the skipped end counts until c is taken
    assert reader.take(100, 40) == b"c" * 40
    assert writer.put(b"d" * 50) == 140
    assert reader.take(140, 50) == b"d" * 50
    assert writer.put(b"e" * 101) is None  # larger than the ring: the pipe's job


def test_a_reader_that_opens_the_ring_later_starts_where_the_writer_is() -> None:
    buffer = bytearray(HEADER + 32)
    writer = Handoff(buffer)
    start = writer.put(b"x" * 8)
    assert start == 0
    assert Handoff(buffer).take(start, 8) == b"x" * 8
    assert Handoff(buffer).put(b"y" * 8) == 8  # a writer made now starts after it


def test_a_slice_outside_the_ring_or_a_buffer_it_cannot_use_is_refused() -> None:
    _writer, reader = _ends(16)
    with pytest.raises(ValueError, match="no blob of 17 bytes"):
        reader.take(0, 17)
    with pytest.raises(ValueError, match="no blob of -1 bytes"):
        reader.take(0, -1)
    with pytest.raises(ValueError, match="needs more than 64 bytes"):
        Handoff(bytearray(HEADER))
    with pytest.raises(BufferError):
        Handoff(b"read-only" * 10)
    with pytest.raises(ValueError, match="8-byte aligned"):
        Handoff(memoryview(bytearray(HEADER + 16))[1:])


def test_the_ring_works_over_shared_memory_of_a_process_context() -> None:
    buffer = multiprocessing.get_context("forkserver").RawArray("b", HEADER + 1024)
    writer, reader = Handoff(buffer), Handoff(buffer)
    start = writer.put(b"shared" * 10)
    assert start is not None
    assert reader.take(start, 60) == b"shared" * 10
