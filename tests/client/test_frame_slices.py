"""The one rule both clients cut a batch into frames by: every frame within the maximum
and the event cap, the events in order, an oversized event alone in its frame."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from eventspool.wire.batching import frame_slices
from eventspool.wire.protocol import MAX_EVENTS_PER_SEND, SEND_OVERHEAD


@given(
    name=st.text(min_size=1, max_size=20),
    sizes=st.lists(st.integers(min_value=1, max_value=400), max_size=300),
    max_frame_bytes=st.integers(min_value=SEND_OVERHEAD, max_value=5_000),
)
def test_frames_hold_every_event_in_order_within_the_maximum(
    name: str, sizes: list[int], max_frame_bytes: int
) -> None:
    slices = frame_slices(name, sizes, max_frame_bytes)
    covered = [index for cut in slices for index in range(len(sizes))[cut]]
    assert covered == list(range(len(sizes)))
    overhead = SEND_OVERHEAD + len(name.encode())
    for cut in slices:
        frame = sizes[cut]
        assert frame
        assert len(frame) == 1 or overhead + sum(frame) <= max_frame_bytes


def test_a_frame_fills_up_to_the_maximum_then_the_next_one_starts() -> None:
    overhead = SEND_OVERHEAD + len(b"orders")
    slices = frame_slices("orders", [10, 10, 10, 10], overhead + 20)
    assert slices == [slice(0, 2), slice(2, 4)]


def test_an_event_too_large_for_any_frame_goes_alone_in_its_own() -> None:
    overhead = SEND_OVERHEAD + len(b"orders")
    slices = frame_slices("orders", [5, 1_000, 5], overhead + 100)
    assert slices == [slice(0, 1), slice(1, 2), slice(2, 3)]


def test_no_frame_carries_more_events_than_the_agent_takes_in_one_request() -> None:
    count = MAX_EVENTS_PER_SEND + 1
    slices = frame_slices("orders", [1] * count, 1 << 30)
    assert slices == [slice(0, MAX_EVENTS_PER_SEND), slice(MAX_EVENTS_PER_SEND, count)]


def test_no_events_make_no_frames() -> None:
    assert frame_slices("orders", [], 1 << 20) == []
