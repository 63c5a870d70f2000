"""The compiled frame splitter, `split_frames`, on its own: what stops it and what it says.

The protocol's tests check it through `FrameDecoder` against the format, for every cut of
a stream; these check its faults' codes and values, and that random bytes never crash it.
The sanitizer test runs this file against the instrumented build.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from eventspool._core.native import (
    FRAME_FAULT_NONE,
    FRAME_FAULT_TOO_LARGE,
    FRAME_FAULT_TOO_SMALL,
    FRAME_FAULT_UNKNOWN_TYPE,
    Frame,
    split_frames,
)
from eventspool.wire.protocol import FrameType, encode_frame

TYPES = tuple(FrameType(raw) if raw in {t.value for t in FrameType} else None for raw in range(256))
PING = encode_frame(FrameType.PING, 7, b"hi")


def _split(
    data: bytes | bytearray, max_frame: int = 1 << 20
) -> tuple[list[Frame], tuple[int, int, int]]:
    frames: list[Frame] = []
    return frames, split_frames(data, max_frame, TYPES, frames)


@pytest.mark.parametrize(
    ("after", "fault", "value"),
    [
        (b"\x00\x01\x00\x00", FRAME_FAULT_TOO_LARGE, 65536),
        (b"\x00\x00\x00\x04", FRAME_FAULT_TOO_SMALL, 4),
        (b"\x00\x00\x00\x05\x66", FRAME_FAULT_UNKNOWN_TYPE, 0x66),
        (PING[:-1], FRAME_FAULT_NONE, 0),  # a partial frame: wait for more
        (b"\x00\x00\x00", FRAME_FAULT_NONE, 0),
    ],
)
def test_it_stops_at_the_first_frame_it_cannot_return_and_says_why(
    after: bytes, fault: int, value: int
) -> None:
    for data in (PING + after, bytearray(PING + after)):
        frames, result = _split(data, max_frame=65535)
        assert frames == [Frame(FrameType.PING, 7, b"hi")]
        assert result == (len(PING), fault, value)


def test_a_types_table_must_cover_every_byte() -> None:
    with pytest.raises(ValueError, match="256 entries"):
        split_frames(PING, 1 << 20, TYPES[:10], [])


@given(data=st.binary(max_size=400), max_frame=st.integers(5, 600))
def test_random_bytes_never_crash_it(data: bytes, max_frame: int) -> None:
    frames, (consumed, fault, _) = _split(data, max_frame)
    assert 0 <= consumed <= len(data)
    assert sum(4 + 5 + len(frame.body) for frame in frames) == consumed
    assert fault in {
        FRAME_FAULT_NONE,
        FRAME_FAULT_TOO_LARGE,
        FRAME_FAULT_TOO_SMALL,
        FRAME_FAULT_UNKNOWN_TYPE,
    }
