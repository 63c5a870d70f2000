"""The envelope codec and the event id generator."""

from __future__ import annotations

import contextlib
import uuid
from pathlib import Path

import hypothesis.strategies as st
import pytest
from hypothesis import given

from eventspool.clock import ManualClock
from eventspool.envelope import (
    Event,
    EventIdGenerator,
    caller_event_id,
    decode,
    encode,
    normalize_headers,
)
from eventspool.errors import InvalidEventError
from eventspool.pipeline import Spool

header_lists = st.lists(
    st.tuples(st.text(max_size=20), st.one_of(st.none(), st.binary(max_size=50))), max_size=5
)


@given(
    key=st.one_of(st.none(), st.binary(max_size=100)),
    value=st.one_of(st.none(), st.binary(max_size=500)),
    headers=st.one_of(st.none(), header_lists),
    create_ms=st.integers(-(2**63), 2**63 - 1),
)
def test_round_trip(
    key: bytes | None,
    value: bytes | None,
    headers: list[tuple[str, bytes | None]] | None,
    create_ms: int,
) -> None:
    event_id = EventIdGenerator().next_id()
    payload = encode(event_id.encode(), create_ms, key, value, headers)
    assert decode(payload) == Event(event_id, create_ms, key, value, headers or None)


def test_tombstone_differs_from_empty_value() -> None:
    event_id = EventIdGenerator().next_id().encode()
    tombstone = decode(encode(event_id, 1, b"k", None, None))
    empty = decode(encode(event_id, 1, b"k", b"", None))
    assert tombstone.value is None
    assert empty.value == b""


@given(st.binary(max_size=200))
def test_decode_rejects_garbage_with_value_error(garbage: bytes) -> None:
    """Garbage decodes to an event or raises ValueError, never anything else."""
    with contextlib.suppress(ValueError):
        assert isinstance(decode(garbage), Event)


@given(st.binary(min_size=1, max_size=60))
def test_decode_of_truncated_headers_is_a_value_error(tail: bytes) -> None:
    """The last header cut short, whatever shorter bytes end it: never an event."""
    payload = encode(b"0" * 36, 1, None, b"v", [("name", b"value")])
    with pytest.raises(ValueError):
        decode(payload[:-3] + tail[:2])


def test_decode_rejects_truncated_payload() -> None:
    payload = encode(EventIdGenerator().next_id().encode(), 1, b"key", b"value", None)
    with pytest.raises(ValueError, match="overruns"):
        decode(payload[:-1])
    with pytest.raises(ValueError, match="trailing"):
        decode(payload + b"x")


def test_ids_are_uuid7_unique_and_sorted_even_past_4096_per_millisecond() -> None:
    clock = ManualClock()
    generator = EventIdGenerator(clock)
    ids = [generator.next_id() for _ in range(10_000)]
    assert len(set(ids)) == len(ids)
    assert ids == sorted(ids)
    parsed = uuid.UUID(ids[0])
    assert parsed.version == 7
    assert parsed.variant == uuid.RFC_4122
    assert int(ids[0][:8] + ids[0][9:13], 16) == clock.now_ms()
    clock.advance(1.0)
    later = generator.next_id()
    assert later > ids[-1]
    assert int(later[:8] + later[9:13], 16) == clock.now_ms()


def test_two_generators_never_collide() -> None:
    clock = ManualClock()
    first, second = EventIdGenerator(clock), EventIdGenerator(clock)
    assert first.next_id() != second.next_id()


def test_headers_accept_mapping_and_pairs_and_reject_bad_shapes() -> None:
    assert normalize_headers({"a": "b", "c": None}) == [("a", b"b"), ("c", None)]
    assert normalize_headers([("a", b"b")]) == [("a", b"b")]
    assert normalize_headers({}) is None
    with pytest.raises(InvalidEventError, match="must be bytes"):
        normalize_headers({"a": 1})  # type: ignore[dict-item]
    with pytest.raises(InvalidEventError, match="pair"):
        normalize_headers([("a", b"b", b"c")])  # type: ignore[list-item]


def test_a_header_named_event_id_is_refused_not_doubled(tmp_path: Path) -> None:
    with pytest.raises(InvalidEventError, match=r"eventspool's own.*send\(\.\.\., event_id="):
        normalize_headers({"trace": "t", "event_id": "mine"})
    with Spool(tmp_path) as spool:
        spool.set_partition_count("orders", 1)
        with pytest.raises(InvalidEventError, match="'event_id' is eventspool's own"):
            spool.send("orders", b"x", headers=[("event_id", b"mine")])
        assert spool.unacknowledged() == 0
        assert spool.send("orders", b"x", headers={"Event_Id": b"other case is a header"})


@given(st.uuids())
def test_every_uuid_is_a_valid_caller_event_id_in_either_spelling(chosen: uuid.UUID) -> None:
    if chosen.int == 0:
        return
    text = str(chosen)
    assert caller_event_id(chosen) == caller_event_id(text) == caller_event_id(text.upper())
    assert caller_event_id(text) == text


@given(st.text(max_size=40))
def test_a_caller_event_id_is_accepted_only_in_the_canonical_uuid_form(text: str) -> None:
    try:
        checked = caller_event_id(text)
    except InvalidEventError as exc:
        assert "not a UUID" in str(exc)
        return
    assert str(uuid.UUID(checked)) == checked == text.lower()
    assert checked != "00000000-0000-0000-0000-000000000000"


def test_caller_event_id_refusals_name_the_rule() -> None:
    with pytest.raises(InvalidEventError, match=r"must be a str or uuid\.UUID, got int"):
        caller_event_id(17)
    with pytest.raises(InvalidEventError, match="not the nil UUID"):
        caller_event_id(uuid.UUID(int=0))
    with pytest.raises(InvalidEventError, match="8-4-4-4-12"):
        caller_event_id(uuid.uuid4().hex)
