"""The agent's binary protocol: length-prefixed frames carrying batches of events.

Every integer is big endian, as in Kafka, so a client in another language can reuse
the byte handling it already has. Frame, version 1::

    offset  size  field
    0       4     length of what follows: type + request id + body (5 .. max frame)
    4       1     frame type (FrameType)
    5       4     request id, chosen by the client and echoed in the response
    9       n     body, length - 5 bytes

SEND body (type 1)::

    size  field
    2     topic length
    n     topic (UTF-8)
    4     event count
    ...   the events, each:
          1  flags: bit 0 = key present, bit 1 = value present (absent: a null value,
             a tombstone), bit 2 = headers present, bit 3 = the caller's own event_id
             follows; the other bits must be 0
          if bit 0: 4 key length, key bytes
          if bit 1: 4 value length, value bytes
          if bit 2: 2 header count, and per header
                    2 name length, name (UTF-8),
                    4 value length (signed, -1: null), value bytes
          if bit 3: 36 event_id, a UUID's canonical text (ASCII)

PUBLISH body (type 4): a batch of events for one exchange, each with its routing key::

    size  field
    2     exchange length
    n     exchange (UTF-8)
    4     event count
    ...   the events, each:
          2  routing key length, routing key (UTF-8)
          then the event exactly as in SEND: flags, key, value, headers, event_id

SEND_RESULT body (type 0x81), one result per event of the SEND or PUBLISH, in order::

    4     result count
    ...   per result: 1 status (Status), 2 text length, text (UTF-8): the event_id
          when the status is OK, else the error message

PING (2) carries any body; PONG (0x82) echoes it. STATS (3) has an empty body;
STATS_RESULT (0x83) carries a UTF-8 JSON object. AUTH (5) carries a token, as its
UTF-8 bytes; it must be the first frame of a TCP connection to an agent whose
[[access]] rules have tokens, and AUTH_RESULT (0x85, empty body) accepts it. ERROR (0xFF)
reports a refused token (FORBIDDEN, then the agent closes the connection) or a request that
could not be parsed: with request id 0 when the framing itself broke (the agent then
closes the connection), else with the request's id (the connection stays open)::

    1     status (Status)
    2     text length
    n     text (UTF-8)

Decoding never trusts a count or length: each is checked against the bytes that
remain before anything is allocated for it, so a hostile or corrupt peer costs at
most one frame of memory.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum

from eventspool._core.native import (
    EVENT_ID_SIZE,
    FRAME_FAULT_NONE,
    FRAME_FAULT_TOO_LARGE,
    FRAME_FAULT_TOO_SMALL,
    WIRE_FLAG_EVENT_ID,
    WIRE_FLAG_HEADERS,
    WIRE_FLAG_KEY,
    WIRE_FLAG_VALUE,
    WIRE_FRAME_HEADER_SIZE,
    WIRE_MAX_EVENTS_PER_SEND,
    WIRE_PUBLISH,
    WIRE_SEND,
    WIRE_SEND_RESULT,
    WIRE_STATUS_OK,
    encode_batch_frame,
    encode_wire_event,
    split_frames,
)
from eventspool._core.native import (
    Frame as CompiledFrame,
)
from eventspool.envelope import HeaderList
from eventspool.errors import EventspoolError

# The numbers that the agent's compiled intake also reads and writes (the event count
# cap of a SEND, the frame header's size, the event flags, the SEND_RESULT type and the
# OK status) are defined by the compiled core, eventspool/_core/intake.pxi.
DEFAULT_MAX_FRAME = 16 * 1024 * 1024
MAX_EVENTS_PER_SEND = WIRE_MAX_EVENTS_PER_SEND
FRAME_HEADER = struct.Struct(">IBI")
HEADER_SIZE = WIRE_FRAME_HEADER_SIZE
_LENGTH = struct.Struct(">I")
_MIN_LENGTH = HEADER_SIZE - _LENGTH.size
_MAX_LENGTH = 0xFFFF_FFFF
_MAX_REQUEST_ID = 0xFFFF_FFFF

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_I32 = struct.Struct(">i")
_STATUS_TEXT = struct.Struct(">BH")
_MAX_U16 = 0xFFFF
_MAX_U32 = 0xFFFF_FFFF
_MAX_TEXT = _MAX_U16

_KNOWN_FLAGS = WIRE_FLAG_KEY | WIRE_FLAG_VALUE | WIRE_FLAG_HEADERS | WIRE_FLAG_EVENT_ID
_MIN_EVENT = 1
_MIN_ROUTED_EVENT = _U16.size + _MIN_EVENT
_MIN_HEADER = _U16.size + _I32.size
_MIN_RESULT = _STATUS_TEXT.size
# What a SEND (or PUBLISH) frame's length counts besides its topic's and events' bytes:
# type, request id, topic length, event count. Clients split batches by it.
SEND_OVERHEAD = _MIN_LENGTH + _U16.size + _U32.size


class FrameType(IntEnum):
    """The first byte after the length; responses have the high bit set."""

    SEND = WIRE_SEND
    PING = 2
    STATS = 3
    PUBLISH = WIRE_PUBLISH
    AUTH = 5
    SEND_RESULT = WIRE_SEND_RESULT
    PONG = 0x82
    STATS_RESULT = 0x83
    AUTH_RESULT = 0x85
    ERROR = 0xFF


class Status(IntEnum):
    """Outcome of one event in a SEND_RESULT, or the cause in an ERROR frame."""

    OK = WIRE_STATUS_OK
    SPOOL_FULL = 1
    INVALID_TOPIC = 2
    TOO_LARGE = 3
    MALFORMED = 4
    INTERNAL = 5
    SHUTTING_DOWN = 6
    UNKNOWN_EXCHANGE = 7
    UNROUTABLE = 8
    NO_SPACE = 9
    OVER_BUDGET = 10
    FORBIDDEN = 11


# One frame with its length stripped, its body not parsed yet: compiled, since both ends
# make one per request (the frames.pxi of the compiled core).
Frame = CompiledFrame

# The frame type of every byte value; None for those the protocol does not know.
_KNOWN_TYPES = {member.value: member for member in FrameType}
_FRAME_TYPES = tuple(_KNOWN_TYPES.get(raw) for raw in range(256))
_STATUSES = {member.value: member for member in Status}


class ProtocolError(EventspoolError):
    """Bytes that do not follow the protocol, or values it cannot carry.

    On a connection this is fatal: the stream can no longer be trusted to be in step.
    """


class FrameTooLargeError(ProtocolError):
    """A length prefix above the maximum frame size; raised before the body is read."""


@dataclass(frozen=True, slots=True)
class WireEvent:
    """One event as a client sends it; the agent gives it its create time, and its id
    unless the caller chose one (`event_id`, checked when the event is spooled)."""

    value: bytes | None
    key: bytes | None = None
    headers: HeaderList | None = None
    event_id: str | None = None


@dataclass(frozen=True, slots=True)
class SendRequest:
    """A parsed SEND body: a batch of events for one topic."""

    topic: str
    events: list[WireEvent]


@dataclass(frozen=True, slots=True)
class RoutedEvent:
    """One event of a PUBLISH: the event, and the routing key its exchange routes it by."""

    routing_key: str
    event: WireEvent


@dataclass(frozen=True, slots=True)
class PublishRequest:
    """A parsed PUBLISH body: a batch of events for one exchange."""

    exchange: str
    events: list[RoutedEvent]


@dataclass(frozen=True, slots=True)
class EventResult:
    """The outcome of one event, or of a whole request in an ERROR frame."""

    status: Status
    text: str

    @property
    def ok(self) -> bool:
        """True when the event is durably spooled and `text` is its event_id."""
        return self.status == Status.OK


# ---- framing -----------------------------------------------------------------------


class FrameDecoder:
    """Cuts a byte stream into frames, however the stream was split into reads.

    A length prefix is checked as soon as its four bytes arrive, so an oversized or
    garbage frame is refused before its body is buffered: memory stays bounded by the
    maximum frame size plus one read. After any error the decoder stays failed, because
    the stream is out of step and the connection is to be closed.
    """

    def __init__(self, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        if not _MIN_LENGTH <= max_frame <= _MAX_LENGTH:
            raise ValueError(f"max_frame must be within {_MIN_LENGTH}..{_MAX_LENGTH}")
        self._max_frame = max_frame
        self._buffer = bytearray()
        self._failed: ProtocolError | None = None

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as part of a frame."""
        return len(self._buffer)

    def feed(self, data: bytes) -> list[Frame]:
        """Take the next bytes of the stream; return the frames they complete.

        Frames completed earlier in the same call are discarded when an error is
        raised: none of them was acted on, so the client retries them all.
        """
        if self._failed is not None:
            raise ProtocolError(f"decoder already failed: {self._failed}")
        buffer = self._buffer
        if buffer:
            buffer += data
            source: bytes | bytearray = buffer
        else:
            source = data
        frames: list[Frame] = []
        pos, fault, value = split_frames(source, self._max_frame, _FRAME_TYPES, frames)
        if fault != FRAME_FAULT_NONE:
            self._failed = self._fault(fault, value)
            self._buffer = bytearray()
            raise self._failed
        if source is buffer:
            del buffer[:pos]
        elif pos < len(data):
            self._buffer = bytearray(memoryview(data)[pos:])
        return frames

    def _fault(self, fault: int, value: int) -> ProtocolError:
        if fault == FRAME_FAULT_TOO_LARGE:
            return FrameTooLargeError(
                f"frame length {value} exceeds the maximum of {self._max_frame} bytes"
            )
        if fault == FRAME_FAULT_TOO_SMALL:
            return ProtocolError(
                f"frame length {value} is below the minimum of {_MIN_LENGTH} (type and request id)"
            )
        return ProtocolError(f"unknown frame type 0x{value:02x}")


def encode_frame(type: FrameType, request_id: int, body: bytes) -> bytes:
    """A whole frame: length prefix, type, request id, body."""
    return _frame_header(type, request_id, len(body)) + body


def _frame_header(frame_type: FrameType, request_id: int, body_length: int) -> bytes:
    _check_request_id(request_id)
    length = _MIN_LENGTH + body_length
    if length > _MAX_LENGTH:
        raise ProtocolError(f"frame body of {body_length} bytes is too large for any frame")
    return FRAME_HEADER.pack(length, frame_type, request_id)


def _check_request_id(request_id: int) -> None:
    if not 0 <= request_id <= _MAX_REQUEST_ID:
        raise ProtocolError(f"request id {request_id} does not fit in an unsigned 32-bit field")


# ---- SEND ----------------------------------------------------------------------------


def encode_send(request_id: int, topic: str, events: Sequence[WireEvent]) -> bytes:
    """A whole SEND frame; raises ProtocolError for a value the format cannot carry."""
    payloads = [encode_event(event, index) for index, event in enumerate(events)]
    return encode_send_payloads(request_id, topic, payloads)


def encode_publish(request_id: int, exchange: str, events: Sequence[RoutedEvent]) -> bytes:
    """A whole PUBLISH frame; raises ProtocolError for a value the format cannot carry."""
    payloads = [
        encode_routed(routed.routing_key, encode_event(routed.event, index), index)
        for index, routed in enumerate(events)
    ]
    return encode_publish_payloads(request_id, exchange, payloads)


def encode_event(event: WireEvent, index: int = 0) -> bytes:
    """One event as a SEND body carries it; `index` names it in the error."""
    try:
        return encode_wire_event(event.value, event.key, event.headers, event.event_id)
    except (ValueError, TypeError) as exc:
        raise ProtocolError(f"event {index}: {exc}") from None


def encode_routed(routing_key: str, payload: bytes, index: int = 0) -> bytes:
    """One event of a PUBLISH body: its routing key, then the event (`encode_event`)."""
    raw_routing_key = _encode_name(routing_key, f"event {index}: routing key")
    return _U16.pack(len(raw_routing_key)) + raw_routing_key + payload


def encode_send_payloads(request_id: int, topic: str, payloads: Sequence[bytes]) -> bytes:
    """A whole SEND frame of events encoded already, as a client queues them."""
    return _encode_batch(FrameType.SEND, request_id, _encode_name(topic, "topic"), payloads)


def encode_publish_payloads(request_id: int, exchange: str, payloads: Sequence[bytes]) -> bytes:
    """A whole PUBLISH frame of events encoded already, each after its routing key."""
    return _encode_batch(
        FrameType.PUBLISH, request_id, _encode_name(exchange, "exchange"), payloads
    )


def _encode_batch(
    frame_type: FrameType, request_id: int, raw_name: bytes, payloads: Sequence[bytes]
) -> bytes:
    """SEND and PUBLISH: a name, a count, the events."""
    if len(payloads) > _MAX_U32:
        raise ProtocolError(f"{len(payloads)} events; at most {_MAX_U32} fit in one request")
    _check_request_id(request_id)
    frame = encode_batch_frame(frame_type, request_id, raw_name, list(payloads))
    if frame is None:
        body_length = _U16.size + len(raw_name) + _U32.size + sum(map(len, payloads))
        raise ProtocolError(f"frame body of {body_length} bytes is too large for any frame")
    return frame


def _encode_name(text: str, what: str) -> bytes:
    try:
        raw = text.encode()
    except UnicodeEncodeError as exc:
        raise ProtocolError(f"{what} {text!r} is not encodable as UTF-8: {exc.reason}") from None
    if len(raw) > _MAX_U16:
        raise ProtocolError(f"{what} of {len(raw)} bytes; at most {_MAX_U16} are allowed")
    return raw


def decode_send(body: bytes) -> SendRequest:
    """Parse a SEND body; raises ProtocolError on anything malformed, naming where."""
    topic, events, _ = _decode_batch(body, "SEND", "topic", routed=False)
    return SendRequest(topic, events)


def decode_publish(body: bytes) -> PublishRequest:
    """Parse a PUBLISH body; raises ProtocolError on anything malformed, naming where."""
    exchange, events, routing_keys = _decode_batch(body, "PUBLISH", "exchange", routed=True)
    return PublishRequest(
        exchange,
        [RoutedEvent(key, event) for key, event in zip(routing_keys, events, strict=True)],
    )


def _decode_batch(
    body: bytes, request: str, name: str, *, routed: bool
) -> tuple[str, list[WireEvent], list[str]]:
    """The name, the events and (PUBLISH only) their routing keys of a SEND or PUBLISH."""
    size = len(body)
    target, pos = _read_text(body, 0, f"{request}: {name}")
    if size - pos < _U32.size:
        raise ProtocolError(f"{request}: body of {size} bytes ends before the event count")
    (count,) = _U32.unpack_from(body, pos)
    pos += _U32.size
    if count > MAX_EVENTS_PER_SEND:
        raise ProtocolError(
            f"{request}: {count} events in one request; at most {MAX_EVENTS_PER_SEND} are accepted"
        )
    if count * (_MIN_ROUTED_EVENT if routed else _MIN_EVENT) > size - pos:
        raise ProtocolError(
            f"{request}: {count} events announced but only {size - pos} bytes follow"
        )
    events: list[WireEvent] = []
    routing_keys: list[str] = []
    for index in range(count):
        if pos >= size:
            raise ProtocolError(f"{request}: body ends before event {index} of {count}")
        if routed:
            routing_key, pos = _read_text(body, pos, f"{request}: event {index}: routing key")
            routing_keys.append(routing_key)
            if pos >= size:
                raise ProtocolError(f"{request}: body ends inside event {index} of {count}")
        flags = body[pos]
        pos += 1
        if flags & ~_KNOWN_FLAGS:
            raise ProtocolError(f"{request}: event {index} has unknown flag bits 0x{flags:02x}")
        key: bytes | None = None
        value: bytes | None = None
        headers: HeaderList | None = None
        if flags & WIRE_FLAG_KEY:
            key, pos = _read_u32_bytes(body, pos, index, "key", request)
        if flags & WIRE_FLAG_VALUE:
            value, pos = _read_u32_bytes(body, pos, index, "value", request)
        if flags & WIRE_FLAG_HEADERS:
            headers, pos = _read_headers(body, pos, index, request)
        event_id: str | None = None
        if flags & WIRE_FLAG_EVENT_ID:
            if size - pos < EVENT_ID_SIZE:
                raise ProtocolError(f"{request}: body ends inside event {index}'s event_id")
            event_id = body[pos : pos + EVENT_ID_SIZE].decode("latin-1")
            pos += EVENT_ID_SIZE
        events.append(WireEvent(value, key, headers, event_id))
    if pos != size:
        raise ProtocolError(f"{request}: {size - pos} trailing bytes after {count} events")
    return target, events, routing_keys


def _read_u32_bytes(
    body: bytes, pos: int, index: int, what: str, request: str
) -> tuple[bytes, int]:
    size = len(body)
    if size - pos < _U32.size:
        raise ProtocolError(f"{request}: event {index}: body ends inside the {what} length")
    (length,) = _U32.unpack_from(body, pos)
    pos += _U32.size
    end = pos + length
    if end > size:
        raise ProtocolError(
            f"{request}: event {index}: {what} of {length} bytes at offset {pos} overruns "
            f"the body of {size} bytes"
        )
    return body[pos:end], end


def _read_headers(body: bytes, pos: int, index: int, request: str) -> tuple[HeaderList, int]:
    size = len(body)
    if size - pos < _U16.size:
        raise ProtocolError(f"{request}: event {index}: body ends inside the header count")
    (count,) = _U16.unpack_from(body, pos)
    pos += _U16.size
    if count * _MIN_HEADER > size - pos:
        raise ProtocolError(
            f"{request}: event {index}: {count} headers announced but only {size - pos} "
            "bytes follow"
        )
    headers: HeaderList = []
    for number in range(count):
        where = f"{request}: event {index}: header {number}"
        name, pos = _read_text(body, pos, f"{where} name")
        if size - pos < _I32.size:
            raise ProtocolError(f"{where}: body ends inside the value length")
        (length,) = _I32.unpack_from(body, pos)
        pos += _I32.size
        if length == -1:
            headers.append((name, None))
            continue
        end = pos + length
        if length < 0 or end > size:
            raise ProtocolError(
                f"{where}: value length {length} at offset {pos} is invalid for a body "
                f"of {size} bytes"
            )
        headers.append((name, body[pos:end]))
        pos = end
    return headers, pos


def _read_text(body: bytes, pos: int, what: str) -> tuple[str, int]:
    """A u16-length-prefixed UTF-8 string."""
    size = len(body)
    if size - pos < _U16.size:
        raise ProtocolError(f"{what}: body ends inside the length at offset {pos}")
    (length,) = _U16.unpack_from(body, pos)
    pos += _U16.size
    end = pos + length
    if end > size:
        raise ProtocolError(
            f"{what}: {length} bytes at offset {pos} overrun the body of {size} bytes"
        )
    try:
        text = body[pos:end].decode()
    except UnicodeDecodeError as exc:
        raise ProtocolError(f"{what} is not valid UTF-8: {exc.reason}") from None
    return text, end


# ---- SEND_RESULT and ERROR -------------------------------------------------------------


def encode_send_result(request_id: int, results: Sequence[EventResult]) -> bytes:
    """A whole SEND_RESULT frame; over-long texts are cut, never refused."""
    if len(results) > _MAX_U32:
        raise ProtocolError(f"{len(results)} results; at most {_MAX_U32} fit in one frame")
    parts = [b"", _U32.pack(len(results))]
    for result in results:
        raw = encode_text(result.text)
        parts.append(_STATUS_TEXT.pack(result.status, len(raw)))
        parts.append(raw)
    body_length = sum(len(part) for part in parts)
    parts[0] = _frame_header(FrameType.SEND_RESULT, request_id, body_length)
    return b"".join(parts)


def decode_send_result(body: bytes) -> list[EventResult]:
    """Parse a SEND_RESULT body; raises ProtocolError on anything malformed."""
    size = len(body)
    if size < _U32.size:
        raise ProtocolError(f"SEND_RESULT: body of {size} bytes ends before the count")
    (count,) = _U32.unpack_from(body, 0)
    pos = _U32.size
    if count * _MIN_RESULT > size - pos:
        raise ProtocolError(
            f"SEND_RESULT: {count} results announced but only {size - pos} bytes follow"
        )
    results: list[EventResult] = []
    for index in range(count):
        result, pos = _read_result(body, pos, f"SEND_RESULT: result {index}")
        results.append(result)
    if pos != size:
        raise ProtocolError(f"SEND_RESULT: {size - pos} trailing bytes after {count} results")
    return results


def encode_error(request_id: int, status: Status, text: str) -> bytes:
    """A whole ERROR frame; request id 0 when the failing request's id is unknown."""
    raw = encode_text(text)
    body = _STATUS_TEXT.pack(status, len(raw)) + raw
    return encode_frame(FrameType.ERROR, request_id, body)


def decode_error(body: bytes) -> EventResult:
    """Parse an ERROR body into its status and message."""
    result, pos = _read_result(body, 0, "ERROR")
    if pos != len(body):
        raise ProtocolError(f"ERROR: {len(body) - pos} trailing bytes")
    return result


def _read_result(body: bytes, pos: int, what: str) -> tuple[EventResult, int]:
    if len(body) - pos < _STATUS_TEXT.size:
        raise ProtocolError(f"{what}: body ends inside the status at offset {pos}")
    raw_status = body[pos]
    status = _STATUSES.get(raw_status)
    if status is None:
        raise ProtocolError(f"{what}: unknown status {raw_status}")
    text, pos = _read_text(body, pos + 1, f"{what} text")
    return EventResult(status, text), pos


def encode_text(text: str) -> bytes:
    """UTF-8, cut at a character boundary to fit a u16 length: error texts never fail."""
    raw = text.encode("utf-8", "backslashreplace")
    if len(raw) <= _MAX_TEXT:
        return raw
    end = _MAX_TEXT
    while end > 0 and raw[end] & 0xC0 == 0x80:
        end -= 1
    return raw[:end]
