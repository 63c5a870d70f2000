"""The agent's wire protocol: golden bytes pin the format, hypothesis hunts for crashes.

Clients in other languages are written from docs/protocol.md, so the golden frames
below are spelled out by hand from the spec rather than produced by the encoder.
"""

from __future__ import annotations

import contextlib
import itertools

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, given, settings

from eventspool.errors import EventspoolError
from eventspool.wire.protocol import (
    DEFAULT_MAX_FRAME,
    FRAME_HEADER,
    HEADER_SIZE,
    EventResult,
    Frame,
    FrameDecoder,
    FrameTooLargeError,
    FrameType,
    ProtocolError,
    PublishRequest,
    RoutedEvent,
    SendRequest,
    Status,
    WireEvent,
    decode_error,
    decode_publish,
    decode_send,
    decode_send_result,
    encode_error,
    encode_frame,
    encode_publish,
    encode_send,
    encode_send_result,
)

FUZZ = settings(
    max_examples=2000,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

request_ids = st.integers(0, 2**32 - 1)
topics = st.text(max_size=30)
optional_bytes = st.one_of(st.none(), st.binary(max_size=40))
header_lists = st.lists(st.tuples(st.text(max_size=12), optional_bytes), max_size=4)
wire_events = st.builds(
    WireEvent,
    value=optional_bytes,
    key=optional_bytes,
    headers=st.one_of(st.none(), header_lists),
    event_id=st.one_of(st.none(), st.uuids().map(str)),
)
event_lists = st.lists(wire_events, max_size=6)
routed_event_lists = st.lists(st.builds(RoutedEvent, st.text(max_size=20), wire_events), max_size=6)
results = st.builds(EventResult, st.sampled_from(Status), st.text(max_size=60))

# ---- golden bytes ------------------------------------------------------------------

# SEND, request id 7, topic "orders", two events:
#   1. key b"k", value b"v1"
#   2. key b"k", no value (a tombstone), headers [("h", b"x"), ("n", None)]
GOLDEN_SEND = bytes.fromhex(
    "00000034"  # length: 1 type + 4 request id + 47 body = 52
    "01"  # type SEND
    "00000007"  # request id 7
    "0006" + "6f7264657273"  # topic length 6, "orders"
    "00000002"  # 2 events
    "03"  # event 1 flags: key | value
    "00000001" + "6b"  # key length 1, "k"
    "00000002" + "7631"  # value length 2, "v1"
    "05"  # event 2 flags: key | headers (no value: tombstone)
    "00000001" + "6b"  # key length 1, "k"
    "0002"  # 2 headers
    "0001" + "68" + "00000001" + "78"  # "h" = b"x"
    "0001" + "6e" + "ffffffff"  # "n" = null
)
GOLDEN_SEND_EVENTS = [
    WireEvent(b"v1", key=b"k"),
    WireEvent(None, key=b"k", headers=[("h", b"x"), ("n", None)]),
]

# PUBLISH, request id 9, exchange "animals", two events:
#   1. routing key "quick.orange.rabbit", value b"v"
#   2. routing key "" (empty), key b"k", no value (a tombstone)
GOLDEN_PUBLISH = bytes.fromhex(
    "00000035"  # length: 1 type + 4 request id + 48 body = 53
    "04"  # type PUBLISH
    "00000009"  # request id 9
    "0007" + "616e696d616c73"  # exchange length 7, "animals"
    "00000002"  # 2 events
    "0013" + "717569636b2e6f72616e67652e726162626974"  # routing key 19, "quick.orange.rabbit"
    "02"  # event 1 flags: value
    "00000001" + "76"  # value length 1, "v"
    "0000"  # routing key length 0
    "01"  # event 2 flags: key (no value: tombstone)
    "00000001" + "6b"  # key length 1, "k"
)
GOLDEN_PUBLISH_EVENTS = [
    RoutedEvent("quick.orange.rabbit", WireEvent(b"v")),
    RoutedEvent("", WireEvent(None, key=b"k")),
]

EVENT_ID = "0191e2c4-7a10-7000-8a3b-5c2d1e0f4a6b"
_EVENT_ID_HEX = EVENT_ID.encode().hex()

# SEND, request id 3, topic "t", one event: value b"v" and the caller's own event id.
GOLDEN_SEND_WITH_ID = bytes.fromhex(
    "00000036"  # length: 1 type + 4 request id + 49 body = 54
    "01"  # type SEND
    "00000003"  # request id 3
    "0001" + "74"  # topic length 1, "t"
    "00000001"  # 1 event
    "0a"  # flags: value | event_id
    "00000001"
    + "76"  # value length 1, "v"
    + _EVENT_ID_HEX  # the 36 ASCII characters of the id, without a length
)

# SEND_RESULT, request id 7: OK with an event id, then SPOOL_FULL with its message.
GOLDEN_SEND_RESULT = bytes.fromhex(
    "0000003d"  # length: 5 + 56 body = 61
    "81"  # type SEND_RESULT
    "00000007"  # request id 7
    "00000002"  # 2 results
    "00"  # status OK
    "0024"  # text length 36
    "30313931653263342d"  # "0191e2c4-"
    "376131302d"  # "7a10-"
    "373030302d"  # "7000-"
    "386133622d"  # "8a3b-"
    "356332643165306634613662"  # "5c2d1e0f4a6b"
    "01"  # status SPOOL_FULL
    "000a"  # text length 10
    "73706f6f6c2066756c6c"  # "spool full"
)

# ERROR, request id 0 (unknown), MALFORMED, "bad".
GOLDEN_ERROR = bytes.fromhex("0000000b" + "ff" + "00000000" + "04" + "0003" + "626164")

# PING, request id 1, body "hi".
GOLDEN_PING = bytes.fromhex("00000007" + "02" + "00000001" + "6869")


def test_send_frame_golden_bytes() -> None:
    assert encode_send(7, "orders", GOLDEN_SEND_EVENTS) == GOLDEN_SEND
    frames = FrameDecoder().feed(GOLDEN_SEND)
    assert frames == [Frame(FrameType.SEND, 7, GOLDEN_SEND[HEADER_SIZE:])]
    assert decode_send(frames[0].body) == SendRequest("orders", GOLDEN_SEND_EVENTS)


def test_send_frame_with_the_callers_event_id_golden_bytes() -> None:
    events = [WireEvent(b"v", event_id=EVENT_ID)]
    assert encode_send(3, "t", events) == GOLDEN_SEND_WITH_ID
    assert decode_send(GOLDEN_SEND_WITH_ID[HEADER_SIZE:]) == SendRequest("t", events)
    with pytest.raises(ProtocolError, match="not 36 characters"):
        encode_send(3, "t", [WireEvent(b"v", event_id="short")])


def test_publish_frame_golden_bytes() -> None:
    assert encode_publish(9, "animals", GOLDEN_PUBLISH_EVENTS) == GOLDEN_PUBLISH
    (frame,) = FrameDecoder().feed(GOLDEN_PUBLISH)
    assert (frame.type, frame.request_id) == (FrameType.PUBLISH, 9)
    assert decode_publish(frame.body) == PublishRequest("animals", GOLDEN_PUBLISH_EVENTS)


def test_send_result_frame_golden_bytes() -> None:
    golden = [EventResult(Status.OK, EVENT_ID), EventResult(Status.SPOOL_FULL, "spool full")]
    assert encode_send_result(7, golden) == GOLDEN_SEND_RESULT
    (frame,) = FrameDecoder().feed(GOLDEN_SEND_RESULT)
    assert (frame.type, frame.request_id) == (FrameType.SEND_RESULT, 7)
    decoded = decode_send_result(frame.body)
    assert decoded == golden
    assert [result.ok for result in decoded] == [True, False]


def test_error_and_ping_golden_bytes() -> None:
    assert encode_error(0, Status.MALFORMED, "bad") == GOLDEN_ERROR
    assert decode_error(GOLDEN_ERROR[HEADER_SIZE:]) == EventResult(Status.MALFORMED, "bad")
    assert encode_frame(FrameType.PING, 1, b"hi") == GOLDEN_PING


def test_constants_pin_the_format() -> None:
    assert HEADER_SIZE == FRAME_HEADER.size == 9
    assert DEFAULT_MAX_FRAME == 16 * 1024 * 1024
    assert [int(t) for t in FrameType] == [1, 2, 3, 4, 5, 0x81, 0x82, 0x83, 0x85, 0xFF]
    assert [int(s) for s in Status] == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]
    assert issubclass(FrameTooLargeError, ProtocolError)
    assert issubclass(ProtocolError, EventspoolError)


# ---- round trips -----------------------------------------------------------------------


@given(request_id=request_ids, topic=topics, events=event_lists)
def test_send_round_trip(request_id: int, topic: str, events: list[WireEvent]) -> None:
    frames = FrameDecoder().feed(encode_send(request_id, topic, events))
    assert [(f.type, f.request_id) for f in frames] == [(FrameType.SEND, request_id)]
    assert decode_send(frames[0].body) == SendRequest(topic, events)


@given(request_id=request_ids, exchange=topics, events=routed_event_lists)
def test_publish_round_trip(request_id: int, exchange: str, events: list[RoutedEvent]) -> None:
    frames = FrameDecoder().feed(encode_publish(request_id, exchange, events))
    assert [(f.type, f.request_id) for f in frames] == [(FrameType.PUBLISH, request_id)]
    assert decode_publish(frames[0].body) == PublishRequest(exchange, events)


@given(request_id=request_ids, batch=st.lists(results, max_size=8))
def test_send_result_round_trip(request_id: int, batch: list[EventResult]) -> None:
    frames = FrameDecoder().feed(encode_send_result(request_id, batch))
    assert [(f.type, f.request_id) for f in frames] == [(FrameType.SEND_RESULT, request_id)]
    assert decode_send_result(frames[0].body) == batch


@given(request_id=request_ids, status=st.sampled_from(Status), text=st.text(max_size=200))
def test_error_round_trip(request_id: int, status: Status, text: str) -> None:
    (frame,) = FrameDecoder().feed(encode_error(request_id, status, text))
    assert (frame.type, frame.request_id) == (FrameType.ERROR, request_id)
    assert decode_error(frame.body) == EventResult(status, text)


def test_empty_and_null_fields_stay_distinct() -> None:
    events = [
        WireEvent(None),
        WireEvent(b""),
        WireEvent(b"", key=b""),
        WireEvent(None, headers=[]),
        WireEvent(b"v", headers=[("", b""), ("", None)]),
    ]
    frame = encode_send(1, "", events)
    assert decode_send(frame[HEADER_SIZE:]) == SendRequest("", events)


def test_long_texts_are_cut_at_a_character_boundary() -> None:
    (frame,) = FrameDecoder().feed(encode_error(3, Status.INTERNAL, "x" * 70_000))
    assert decode_error(frame.body).text == "x" * 65535
    (frame,) = FrameDecoder().feed(encode_error(3, Status.INTERNAL, "é" * 40_000))
    assert decode_error(frame.body).text == "é" * 32767
    long_result = [EventResult(Status.TOO_LARGE, "€" * 30_000)]
    (frame,) = FrameDecoder().feed(encode_send_result(3, long_result))
    assert decode_send_result(frame.body)[0].text == "€" * 21845


def test_unencodable_error_text_does_not_raise() -> None:
    (frame,) = FrameDecoder().feed(encode_error(1, Status.INTERNAL, "bad \udcff name"))
    assert decode_error(frame.body).text == "bad \\udcff name"


@pytest.mark.parametrize(
    ("request_id", "topic", "events"),
    [
        (-1, "t", []),
        (2**32, "t", []),
        (1, "t" * 65536, []),
        (1, "\ud800", []),
        (1, "t", [WireEvent(b"v", headers=[("h", None)] * 65536)]),
        (1, "t", [WireEvent(b"v", headers=[("h" * 65536, None)])]),
    ],
)
def test_encode_send_refuses_what_the_format_cannot_carry(
    request_id: int, topic: str, events: list[WireEvent]
) -> None:
    with pytest.raises(ProtocolError):
        encode_send(request_id, topic, events)


# ---- framing ---------------------------------------------------------------------------

any_frames = st.lists(
    st.builds(Frame, st.sampled_from(FrameType), request_ids, st.binary(max_size=64)),
    max_size=8,
)


def _stream(frames: list[Frame]) -> bytes:
    return b"".join(encode_frame(f.type, f.request_id, f.body) for f in frames)


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({0, len(data), *(cut % (len(data) + 1) for cut in cuts)})
    return [data[a:b] for a, b in itertools.pairwise(points)]


@given(frames=any_frames, cuts=st.lists(st.integers(0, 2**16), max_size=20))
def test_any_split_of_the_stream_yields_the_same_frames(
    frames: list[Frame], cuts: list[int]
) -> None:
    stream = _stream(frames)
    decoder = FrameDecoder()
    got: list[Frame] = []
    for chunk in _split(stream, cuts):
        got.extend(decoder.feed(chunk))
    assert got == frames
    assert decoder.buffered == 0


def test_byte_at_a_time() -> None:
    frames = [
        Frame(FrameType.SEND, 7, GOLDEN_SEND[HEADER_SIZE:]),
        Frame(FrameType.PING, 0, b""),
        Frame(FrameType.STATS_RESULT, 2**32 - 1, b"{}"),
    ]
    stream = _stream(frames)
    decoder = FrameDecoder()
    got: list[Frame] = []
    for index in range(len(stream)):
        got.extend(decoder.feed(stream[index : index + 1]))
        assert decoder.buffered == index + 1 - len(_stream(got))
    assert got == frames
    assert decoder.buffered == 0


def test_partial_frame_is_held() -> None:
    decoder = FrameDecoder()
    assert decoder.feed(GOLDEN_PING + GOLDEN_ERROR[:5]) == [Frame(FrameType.PING, 1, b"hi")]
    assert decoder.buffered == 5
    assert decoder.feed(GOLDEN_ERROR[5:]) == [Frame(FrameType.ERROR, 0, GOLDEN_ERROR[9:])]
    assert decoder.buffered == 0


def test_oversized_length_prefix_raises_before_the_body_is_buffered() -> None:
    decoder = FrameDecoder()
    decoder.feed(b"\x01\x00")
    assert decoder.buffered == 2
    with pytest.raises(FrameTooLargeError, match="16777217"):
        decoder.feed(b"\x00\x01")  # 16 MiB + 1
    assert decoder.buffered == 0
    with pytest.raises(ProtocolError):
        decoder.feed(b"\x00" * 100)
    assert decoder.buffered == 0


def test_max_frame_is_inclusive() -> None:
    body = b"b" * 59
    frame = encode_frame(FrameType.PING, 1, body)  # length 64
    assert FrameDecoder(max_frame=64).feed(frame) == [Frame(FrameType.PING, 1, body)]
    decoder = FrameDecoder(max_frame=63)
    with pytest.raises(FrameTooLargeError):
        decoder.feed(frame[:4])


def test_large_frame_within_the_limit_is_not_refused() -> None:
    body = bytes(1 << 20)
    frame = encode_frame(FrameType.PONG, 9, body)
    decoder = FrameDecoder()
    got: list[Frame] = []
    for start in range(0, len(frame), 65536):
        got.extend(decoder.feed(frame[start : start + 65536]))
    assert got == [Frame(FrameType.PONG, 9, body)]


@pytest.mark.parametrize("length", [0, 1, 4])
def test_length_below_the_fixed_part_is_a_protocol_error(length: int) -> None:
    with pytest.raises(ProtocolError) as info:
        FrameDecoder().feed(length.to_bytes(4, "big"))
    assert not isinstance(info.value, FrameTooLargeError)


@pytest.mark.parametrize("frame_type", [0, 6, 0x80, 0x84, 0xFE])
def test_unknown_frame_type_is_refused_as_soon_as_it_arrives(frame_type: int) -> None:
    decoder = FrameDecoder()
    with pytest.raises(ProtocolError, match="unknown frame type"):
        decoder.feed(b"\x00\x00\x00\x05" + bytes((frame_type,)))


def test_invalid_max_frame() -> None:
    with pytest.raises(ValueError, match="max_frame"):
        FrameDecoder(max_frame=4)


# ---- malformed bodies ------------------------------------------------------------------

_GOLDEN_SEND_BODY = GOLDEN_SEND[HEADER_SIZE:]


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"", "length"),
        (b"\x00\x01t", "event count"),
        (b"\x00\x02\xff\xfe\x00\x00\x00\x00", "UTF-8"),
        (b"\x00\x01t\xff\xff\xff\xff", "at most 10000"),
        (b"\x00\x01t\x00\x00\x00\x01\x10", "flag"),
        (b"\x00\x01t\x00\x00\x00\x01\x08" + b"0" * 35, "inside event 0's event_id"),
        (b"\x00\x01t\x00\x00\x00\x01\x80", "flag"),
        (b"\x00\x01t\x00\x00\x00\x01\x02\x00\x00\x00\x05abc", "overruns"),
        (b"\x00\x01t\x00\x00\x00\x01\x01\x00\x00", "key length"),
        (b"\x00\x01t\x00\x00\x00\x01\x04\xff\xff", "announced"),
        (b"\x00\x01t\x00\x00\x00\x01\x04\x00\x01\x00\x01h\xff\xff\xff\xfe", "invalid"),
        (b"\x00\x01t\x00\x00\x00\x01\x04\x00\x01\x00\x01\xff\xff\xff\xff\xff", "UTF-8"),
        (b"\x00\x01t\x00\x00\x00\x00\x00", "trailing"),
        (_GOLDEN_SEND_BODY[:-1], "value length"),
        (_GOLDEN_SEND_BODY + b"\x00", "trailing"),
    ],
)
def test_decode_send_rejects_malformed_bodies(body: bytes, reason: str) -> None:
    with pytest.raises(ProtocolError, match=reason):
        decode_send(body)


_GOLDEN_PUBLISH_BODY = GOLDEN_PUBLISH[HEADER_SIZE:]
# Exchange "x", 2 events announced, then only the first: empty routing key, key b"k".
_TWO_EVENTS_ONE_KEYED = b"\x00\x01x\x00\x00\x00\x02" + b"\x00\x00\x01\x00\x00\x00\x01k"


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"", "PUBLISH: exchange"),
        (b"\x00\x01x\x00\x00\x00\x01\x00", "announced"),
        (b"\x00\x01x\x00\x00\x00\x01\x00\x00\x10", "PUBLISH: event 0 has unknown flag"),
        (b"\x00\x01x\x00\x00\x00\x01\x00\x05abc", "routing key: 5 bytes"),
        (b"\x00\x01x\x00\x00\x00\x01\x00\x01\xff\x02", "routing key is not valid UTF-8"),
        (_TWO_EVENTS_ONE_KEYED, "before event 1 of 2"),
        (_TWO_EVENTS_ONE_KEYED + b"\x00\x00", "inside event 1 of 2"),
        (_GOLDEN_PUBLISH_BODY[:-1], "PUBLISH: event 1: key of 1 bytes"),
        (_GOLDEN_PUBLISH_BODY + b"\x00", "trailing"),
    ],
)
def test_decode_publish_rejects_malformed_bodies(body: bytes, reason: str) -> None:
    with pytest.raises(ProtocolError, match=reason):
        decode_publish(body)


def test_encode_publish_refuses_a_routing_key_the_format_cannot_carry() -> None:
    with pytest.raises(ProtocolError, match="event 0: routing key"):
        encode_publish(1, "x", [RoutedEvent("k" * 65536, WireEvent(b"v"))])


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"\x00\x00\x00\x01",
        b"\xff\xff\xff\xff\x00\x00\x00",
        b"\x00\x00\x00\x01\x0c\x00\x00",  # unknown status
        b"\x00\x00\x00\x01\x00\x00\x02\xc3",  # truncated text
        b"\x00\x00\x00\x01\x00\x00\x01\xc3",  # half a UTF-8 character
        b"\x00\x00\x00\x00\x00",  # trailing
    ],
)
def test_decode_send_result_rejects_malformed_bodies(body: bytes) -> None:
    with pytest.raises(ProtocolError):
        decode_send_result(body)


@pytest.mark.parametrize("body", [b"", b"\x04\x00", b"\x0c\x00\x00", b"\x04\x00\x00\x00"])
def test_decode_error_rejects_malformed_bodies(body: bytes) -> None:
    with pytest.raises(ProtocolError):
        decode_error(body)


# ---- fuzzing: only ProtocolError may escape --------------------------------------------

_INDEX = st.integers(0, 511)

# Mutations of a valid encoding: flipped bits, counts and lengths off by a little,
# cut short, bytes lost or gained. Indices wrap around the data they apply to.
mutations = st.lists(
    st.one_of(
        st.tuples(st.just("flip"), _INDEX, st.integers(1, 255)),
        st.tuples(st.just("add"), _INDEX, st.sampled_from([1, 2, 3, 0x80, 0xFD, 0xFE, 0xFF])),
        st.tuples(st.just("truncate"), _INDEX, st.just(0)),
        st.tuples(st.just("delete"), _INDEX, st.integers(1, 8)),
        st.tuples(st.just("insert"), _INDEX, st.integers(0, 255)),
        st.tuples(st.just("extend"), st.integers(1, 16), st.integers(0, 255)),
    ),
    min_size=1,
    max_size=4,
)


def _mutate(data: bytes, steps: list[tuple[str, int, int]]) -> bytes:
    out = bytearray(data)
    for op, where, arg in steps:
        index = where % (len(out) + 1)
        if op in ("flip", "add") and index < len(out):
            out[index] = out[index] ^ arg if op == "flip" else (out[index] + arg) & 0xFF
        elif op == "truncate":
            del out[index:]
        elif op == "delete":
            del out[index : index + arg]
        elif op == "insert":
            out[index:index] = bytes((arg,))
        elif op == "extend":
            out += bytes((arg,)) * where
    return bytes(out)


valid_frames = st.one_of(
    st.builds(encode_send, request_ids, topics, event_lists),
    st.builds(encode_send_result, request_ids, st.lists(results, max_size=4)),
    st.builds(encode_error, request_ids, st.sampled_from(Status), st.text(max_size=20)),
    st.builds(encode_frame, st.sampled_from(FrameType), request_ids, st.binary(max_size=20)),
)


def _decode_body(frame: Frame) -> None:
    if frame.type is FrameType.SEND:
        decode_send(frame.body)
    elif frame.type is FrameType.SEND_RESULT:
        decode_send_result(frame.body)
    elif frame.type is FrameType.ERROR:
        decode_error(frame.body)


def _drive(stream: bytes, cuts: list[int], max_frame: int) -> None:
    """Feed like a connection would: stop at the first ProtocolError, parse each body."""
    decoder = FrameDecoder(max_frame)
    for chunk in _split(stream, cuts):
        try:
            frames = decoder.feed(chunk)
        except ProtocolError:
            assert decoder.buffered == 0
            return
        assert decoder.buffered < 4 + max_frame
        for frame in frames:
            with contextlib.suppress(ProtocolError):
                _decode_body(frame)


@FUZZ
@given(body=st.binary(max_size=200))
def test_fuzz_decode_bodies_with_random_bytes(body: bytes) -> None:
    for decode in (decode_send, decode_send_result, decode_error):
        with contextlib.suppress(ProtocolError):
            decode(body)


@FUZZ
@given(topic=topics, events=event_lists, steps=mutations)
def test_fuzz_decode_send_with_mutated_bodies(
    topic: str, events: list[WireEvent], steps: list[tuple[str, int, int]]
) -> None:
    body = _mutate(encode_send(1, topic, events)[HEADER_SIZE:], steps)
    with contextlib.suppress(ProtocolError):
        decode_send(body)


@FUZZ
@given(
    stream=st.binary(max_size=300),
    cuts=st.lists(st.integers(0, 2**16), max_size=6),
    max_frame=st.sampled_from([5, 64, DEFAULT_MAX_FRAME]),
)
def test_fuzz_decoder_with_random_bytes(stream: bytes, cuts: list[int], max_frame: int) -> None:
    _drive(stream, cuts, max_frame)


@FUZZ
@given(
    frames=st.lists(valid_frames, min_size=1, max_size=4),
    steps=mutations,
    cuts=st.lists(st.integers(0, 2**16), max_size=6),
    max_frame=st.sampled_from([64, 512, DEFAULT_MAX_FRAME]),
)
def test_fuzz_decoder_with_mutated_frames(
    frames: list[bytes], steps: list[tuple[str, int, int]], cuts: list[int], max_frame: int
) -> None:
    _drive(_mutate(b"".join(frames), steps), cuts, max_frame)


def test_huge_counts_fail_fast_without_allocating() -> None:
    with pytest.raises(ProtocolError, match="at most 10000"):
        decode_send(b"\x00\x00\xff\xff\xff\xff" + bytes(16))
    with pytest.raises(ProtocolError, match="announced"):
        decode_send(b"\x00\x00\x00\x00\x27\x10" + bytes(16))
    with pytest.raises(ProtocolError, match="announced"):
        decode_send(b"\x00\x00\x00\x00\x00\x01\x04\xff\xff" + bytes(16))
    with pytest.raises(ProtocolError, match="announced"):
        decode_send_result(b"\xff\xff\xff\xff" + bytes(16))
