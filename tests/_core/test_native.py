"""The compiled core's byte work against published vectors, not against itself."""

from __future__ import annotations

import os
import platform
import uuid
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from eventspool._core.native import EventIdGenerator, crc32c, crc32c_hardware, crc32c_portable
from eventspool.clock import ManualClock
from eventspool.config import QueueSettings
from eventspool.spool.ring import RingQueue

# RFC 3720 (iSCSI), appendix B.4, and the common check value of CRC-32C.
CRC32C_VECTORS: list[tuple[bytes, int]] = [
    (b"", 0x00000000),
    (b"123456789", 0xE3069283),
    (bytes(32), 0x8A9136AA),
    (b"\xff" * 32, 0x62A8AB43),
    (bytes(range(32)), 0x46DD794E),
    (bytes(range(31, -1, -1)), 0x113FDB5C),
]


def test_crc32c_matches_published_vectors() -> None:
    for data, expected in CRC32C_VECTORS:
        assert crc32c(data) == expected
        assert crc32c_portable(data) == expected


def test_the_crc32_instruction_is_used_exactly_when_the_cpu_has_it() -> None:
    flags = Path("/proc/cpuinfo").read_text().split()
    assert crc32c_hardware() == ("sse4_2" in flags and platform.machine() == "x86_64")


@given(st.binary(max_size=4096), st.integers(0, 2**32 - 1), st.integers(0, 7))
def test_hardware_and_portable_crc_agree_at_any_alignment(
    data: bytes, seed: int, skew: int
) -> None:
    view = memoryview(b"\0" * skew + data)[skew:]
    assert crc32c(view, seed) == crc32c_portable(view, seed)


@given(st.binary(max_size=512), st.binary(max_size=512))
def test_crc32c_continues_across_pieces(first: bytes, second: bytes) -> None:
    assert crc32c(second, crc32c(first)) == crc32c(first + second)


def test_large_buffers_checksum_the_same_without_the_interpreter_lock() -> None:
    data = os.urandom(3 * 65536 + 5)
    assert crc32c(data) == crc32c_portable(data)


def test_event_ids_are_uuidv7_text_ordered_and_carry_the_clock() -> None:
    clock = ManualClock(1_700_000_000_123)
    generator = EventIdGenerator(clock)
    ids = [generator.next_id() for _ in range(5000)]
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)
    first = uuid.UUID(ids[0])
    assert (first.version, first.variant) == (7, uuid.RFC_4122)
    assert first.int >> 80 == 1_700_000_000_123
    # 5000 ids in one millisecond: the counter (4096 per ms) made the time run ahead.
    assert uuid.UUID(ids[-1]).int >> 80 == 1_700_000_000_124


def test_a_reseeded_generator_gives_other_random_bits() -> None:
    generator = EventIdGenerator()
    before = generator.next_id(1000)
    generator.reseed()
    after = generator.next_id(1000)
    assert before[:18] == after[:18]
    assert before[19:] != after[19:]


def test_append_many_refuses_what_is_not_bytes_before_writing_any(tmp_path: Path) -> None:
    with RingQueue.open(tmp_path / "0.queue", QueueSettings(capacity_bytes=65536)) as ring:
        with pytest.raises(TypeError, match="bytes"):
            ring.append_many([b"fine", bytearray(b"not bytes")])  # type: ignore[list-item]
        assert ring.depth == 0
