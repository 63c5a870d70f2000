"""The client's compiled event encoder, `encode_wire_event`, against the protocol's format.

Every generated event must decode, through the protocol module's Python decoder, to the
fields it was encoded from; the bytes of one event are spelled out field by field; what
the format cannot carry is refused with the field named. The sanitizer test runs this
file against the instrumented build.
"""

from __future__ import annotations

import enum
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from eventspool._core.native import CHECKED_TOPICS, common_event_payload, encode_wire_event
from eventspool.config import validate_topic
from eventspool.wire.checks import event_payload, wire_event
from eventspool.wire.protocol import WireEvent, decode_send, encode_send_payloads

EVENT_ID = "0190a5c3-7e1f-7a00-8c2b-3d4e5f607182"

fields = st.one_of(st.none(), st.binary(max_size=200))
header_lists = st.one_of(
    st.none(),
    st.lists(st.tuples(st.text(max_size=20), st.one_of(st.none(), st.binary(max_size=50)))),
)
event_ids = st.one_of(st.none(), st.uuids().map(str))


@given(
    events=st.lists(st.tuples(fields, fields, header_lists, event_ids), max_size=8),
    topic=st.text(max_size=10),
)
def test_what_it_encodes_the_protocols_decoder_reads_back(
    events: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]] | None, str]],
    topic: str,
) -> None:
    payloads = [encode_wire_event(*event) for event in events]
    frame = encode_send_payloads(1, topic, payloads)
    request = decode_send(frame[9:])
    assert request.topic == topic
    assert request.events == [WireEvent(*event) for event in events]


def test_one_event_golden_bytes() -> None:
    payload = encode_wire_event(b"v1", b"k", [("h", b"x"), ("n", None)], EVENT_ID)
    assert (
        payload
        == bytes.fromhex(
            "0f"  # flags: key | value | headers | event_id
            "00000001" + "6b"  # key length 1, "k"
            "00000002" + "7631"  # value length 2, "v1"
            "0002"  # 2 headers
            "0001" + "68" + "00000001" + "78"  # "h" = b"x"
            "0001" + "6e" + "ffffffff"  # "n" = null
        )
        + EVENT_ID.encode()
    )
    assert encode_wire_event(None, None, None, None) == b"\x00"
    assert encode_wire_event(b"", None, [], None) == bytes.fromhex("06000000000000")


@pytest.mark.parametrize(
    ("headers", "event_id", "reason"),
    [
        ([("h", None)] * 65536, None, "65536 headers; at most 65535"),
        ([("h" * 65536, None)], None, "header name of 65536 bytes"),
        ([("\ud800", None)], None, "header name '\\\\ud800' is not encodable as UTF-8"),
        (None, "short", "event_id 'short' is not 36 characters"),
    ],
)
def test_it_refuses_what_the_format_cannot_carry(
    headers: list[tuple[str, bytes | None]] | None, event_id: str | None, reason: str
) -> None:
    with pytest.raises(ValueError, match=reason):
        encode_wire_event(b"v", None, headers, event_id)


def test_a_header_that_is_not_a_str_and_bytes_pair_is_a_type_error() -> None:
    with pytest.raises(TypeError):
        encode_wire_event(b"v", None, [(b"name", b"v")], None)  # type: ignore[list-item]
    with pytest.raises(TypeError):
        encode_wire_event(b"v", None, [("name", "text")], None)  # type: ignore[list-item]


class _Name(enum.StrEnum):
    TRACE = "trace"


class _Value(bytes):
    pass


class _Pair(tuple):  # type: ignore[type-arg]
    """A header whose indexing disagrees with its iteration."""

    def __getitem__(self, index: Any) -> Any:
        return b"x" * 4096 if index == 1 else super().__getitem__(index)


def test_subclasses_of_str_and_bytes_are_headers_like_any_other() -> None:
    payload = encode_wire_event(b"v", None, [(_Name.TRACE, _Value(b"id"))], None)
    assert payload == encode_wire_event(b"v", None, [("trace", b"id")], None)


def test_each_header_is_read_once() -> None:
    """The bytes measured are the bytes copied, whatever the pair's indexing says."""
    payload = encode_wire_event(b"v", None, [_Pair(("h", b"v"))], None)
    assert payload == encode_wire_event(b"v", None, [("h", b"v")], None)


_ANY_ARGUMENT = st.one_of(
    st.none(),
    st.binary(max_size=20),
    st.text(max_size=10),
    st.integers(),
    st.just([("trace", b"t")]),
    st.just(EVENT_ID),
)


@given(
    topic=st.one_of(st.sampled_from(["orders", "payments", "not checked yet"]), _ANY_ARGUMENT),
    value=_ANY_ARGUMENT,
    key=_ANY_ARGUMENT,
    headers=st.one_of(st.none(), _ANY_ARGUMENT),
    event_id=st.one_of(st.none(), _ANY_ARGUMENT),
)
def test_the_compiled_common_event_never_differs_from_the_python_checks(
    topic: Any, value: Any, key: Any, headers: Any, event_id: Any
) -> None:
    """`common_event_payload` takes only what `event_payload` accepts, and encodes it as
    it does: anything else (a bad argument, an unchecked topic) is left to the checks."""
    event_payload("orders", None, None, None)  # checked once, as a first send does
    event_payload("payments", None, None, None)
    common = common_event_payload(topic, value, key, headers, event_id)
    plain = {type(None), bytes}
    shaped = type(value) in plain and type(key) in plain and headers is None and event_id is None
    if common is None:
        checked = type(topic) is str and topic in CHECKED_TOPICS
        assert not (shaped and checked)  # the common event takes this path
        return
    assert shaped
    assert topic in CHECKED_TOPICS  # never a name the rule has not passed
    validate_topic(topic)  # raises for a name the rule refuses
    assert common == wire_event(value, key, headers, event_id, "topic", topic)


def test_the_common_event_is_encoded_in_one_call_once_its_topic_was_checked() -> None:
    # The set is bounded: tests run before in this process may have filled it. Emptied,
    # it only makes the next sends check their topics again.
    CHECKED_TOPICS.clear()
    topic = "checked-by-the-first-send"
    assert common_event_payload(topic, b"v", b"k", None, None) is None
    first = event_payload(topic, b"v", b"k", None, None)
    assert common_event_payload(topic, b"v", b"k", None, None) == first
    assert common_event_payload(topic, b"v", "k", None, None) is None  # a str key: Python's
