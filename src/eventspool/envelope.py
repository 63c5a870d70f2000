"""The event envelope: what one spooled event is, and its byte form inside a queue record.

Payload layout (little endian), version 1::

    offset  size  field
    0       1     envelope version (1)
    1       1     flags: bit 0 = headers follow the value
    2       36    event_id, UUIDv7 in its canonical text form (ASCII)
    38      8     create time, ms since the epoch (signed)
    46      4     key length, -1 for no key (signed)
    50      4     value length, -1 for a null value: a tombstone (signed)
    54      ...   key bytes, then value bytes
    then, if flag bit 0: u16 header count, and per header
                  u16 name length, name (UTF-8), i32 value length (-1: null), value bytes

The event_id is kept as text because that same text travels to Kafka in the `event_id`
header and is what consumers deduplicate on.
"""

from __future__ import annotations

import os
import struct
import threading
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from eventspool.clock import SYSTEM_CLOCK, Clock
from eventspool.errors import InvalidEventError

ENVELOPE_VERSION = 1
_FLAG_HEADERS = 0x01
_FIXED = struct.Struct("<BB36sqii")
_HEADER_COUNT = struct.Struct("<H")
_HEADER_NAME = struct.Struct("<H")
_HEADER_VALUE = struct.Struct("<i")
FIXED_SIZE = _FIXED.size
_MAX_HEADER_COUNT = 0xFFFF
_MAX_HEADER_NAME = 0xFFFF

HeaderList = list[tuple[str, bytes | None]]
HeadersInput = Mapping[str, bytes | str | None] | Sequence[tuple[str, bytes | str | None]]


@dataclass(frozen=True, slots=True)
class Event:
    """One event as it was handed to `send()`, with the identity eventspool gave it."""

    event_id: str
    create_time_ms: int
    key: bytes | None
    value: bytes | None
    headers: HeaderList | None = None


def normalize_headers(headers: HeadersInput | None) -> HeaderList | None:
    """Accept the header shapes confluent-kafka accepts: a mapping or (name, value) pairs."""
    if headers is None:
        return None
    if isinstance(headers, Mapping):
        items = list(headers.items())
    elif isinstance(headers, list | tuple):
        items = list(headers)
    else:
        raise InvalidEventError(
            f"headers must be a mapping or a list of (name, value) pairs, "
            f"got {type(headers).__name__}"
        )
    if len(items) > _MAX_HEADER_COUNT:
        raise InvalidEventError(f"{len(items)} headers; at most {_MAX_HEADER_COUNT} are allowed")
    result: HeaderList = []
    for item in items:
        if not isinstance(item, tuple) or len(item) != 2:
            raise InvalidEventError(f"header {item!r} is not a (name, value) pair")
        name, value = item
        if not isinstance(name, str):
            raise InvalidEventError(f"header name {name!r} must be a str")
        try:
            encoded_name = name.encode()
            if isinstance(value, str):
                value = value.encode()
        except UnicodeEncodeError as exc:
            raise InvalidEventError(
                f"header {name!r} is not encodable as UTF-8: {exc.reason}"
            ) from None
        if len(encoded_name) > _MAX_HEADER_NAME:
            raise InvalidEventError(
                f"header name of {len(encoded_name)} bytes; at most {_MAX_HEADER_NAME} allowed"
            )
        if value is not None and not isinstance(value, bytes):
            raise InvalidEventError(
                f"header {name!r} value must be bytes, str or None, got {type(value).__name__}"
            )
        result.append((name, value))
    return result or None


def encode(
    event_id: bytes,
    create_time_ms: int,
    key: bytes | None,
    value: bytes | None,
    headers: HeaderList | None,
) -> bytes:
    """Build the payload; the caller has already checked the types."""
    if key is None and value is not None and not headers:
        return _FIXED.pack(ENVELOPE_VERSION, 0, event_id, create_time_ms, -1, len(value)) + value
    flags = _FLAG_HEADERS if headers else 0
    fixed = _FIXED.pack(
        ENVELOPE_VERSION,
        flags,
        event_id,
        create_time_ms,
        -1 if key is None else len(key),
        -1 if value is None else len(value),
    )
    parts = [fixed]
    if key is not None:
        parts.append(key)
    if value is not None:
        parts.append(value)
    if headers:
        parts.append(_encode_headers(headers))
    return b"".join(parts)


def _encode_headers(headers: HeaderList) -> bytes:
    parts = [_HEADER_COUNT.pack(len(headers))]
    for name, value in headers:
        raw = name.encode()
        parts.append(_HEADER_NAME.pack(len(raw)))
        parts.append(raw)
        parts.append(_HEADER_VALUE.pack(-1 if value is None else len(value)))
        if value is not None:
            parts.append(value)
    return b"".join(parts)


def decode_for_kafka(
    payload: bytes,
) -> tuple[bytes, int, bytes | None, bytes | None, HeaderList | None]:
    """(event_id as bytes, create time, key, value, headers): what a Kafka record needs.

    The sender's hot path: without headers it slices the payload instead of building an
    Event, and keeps the id as the bytes the `event_id` header carries.
    """
    version, flags, raw_id, create_ms, key_len, value_len = _FIXED.unpack_from(payload, 0)
    if flags or version != ENVELOPE_VERSION:
        event = decode(payload)
        return raw_id, create_ms, event.key, event.value, event.headers
    pos = FIXED_SIZE
    key = None if key_len < 0 else payload[pos : pos + key_len]
    pos += max(key_len, 0)
    value = None if value_len < 0 else payload[pos : pos + value_len]
    return raw_id, create_ms, key, value, None


def decode(payload: bytes | memoryview) -> Event:
    """Parse a payload written by `encode`; raises ValueError on anything malformed."""
    try:
        return _decode(payload)
    except (struct.error, UnicodeDecodeError) as exc:
        raise ValueError(f"malformed envelope: {exc}") from exc


def _decode(payload: bytes | memoryview) -> Event:
    if len(payload) < FIXED_SIZE:
        raise ValueError(f"envelope of {len(payload)} bytes is shorter than its fixed part")
    version, flags, raw_id, create_ms, key_len, value_len = _FIXED.unpack_from(payload, 0)
    if version != ENVELOPE_VERSION:
        raise ValueError(f"unknown envelope version {version}")
    pos = FIXED_SIZE
    key, pos = _take(payload, pos, key_len)
    value, pos = _take(payload, pos, value_len)
    headers: HeaderList | None = None
    if flags & _FLAG_HEADERS:
        (count,) = _HEADER_COUNT.unpack_from(payload, pos)
        pos += _HEADER_COUNT.size
        headers = []
        for _ in range(count):
            (name_len,) = _HEADER_NAME.unpack_from(payload, pos)
            pos += _HEADER_NAME.size
            name = bytes(payload[pos : pos + name_len]).decode()
            pos += name_len
            (header_len,) = _HEADER_VALUE.unpack_from(payload, pos)
            pos += _HEADER_VALUE.size
            header_value, pos = _take(payload, pos, header_len)
            headers.append((name, header_value))
    if pos != len(payload):
        raise ValueError(f"envelope has {len(payload) - pos} trailing bytes")
    return Event(raw_id.decode("ascii"), create_ms, key, value, headers)


def _take(payload: bytes | memoryview, pos: int, length: int) -> tuple[bytes | None, int]:
    if length == -1:
        return None, pos
    if length < 0 or pos + length > len(payload):
        raise ValueError(f"field of length {length} at offset {pos} overruns the envelope")
    return bytes(payload[pos : pos + length]), pos + length


_COUNTER_TEXT = tuple(f"{n:03x}-" for n in range(4096))
_LIVE_GENERATORS: weakref.WeakSet[EventIdGenerator] = weakref.WeakSet()


class EventIdGenerator:
    """Time-ordered, unique event ids: UUIDv7 (RFC 9562) with a 12-bit counter per millisecond.

    The 62 random bits are drawn once per generator (and again in a forked child), so an
    id costs a string concatenation rather than a random draw. When more than 4096 ids
    are asked for within one millisecond the timestamp runs ahead, as RFC 9562 allows, so
    ids stay unique and sorted.
    """

    def __init__(self, clock: Clock = SYSTEM_CLOCK) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._last_ms = -1
        self._counter = 0
        self._prefix = ""
        self._suffix = ""
        self._reseed()
        _LIVE_GENERATORS.add(self)

    def _reseed(self) -> None:
        rand_b = int.from_bytes(os.urandom(8), "big") & ((1 << 62) - 1)
        tail = (0b10 << 62) | rand_b
        text = f"{tail:016x}"
        self._suffix = f"{text[:4]}-{text[4:]}"
        self._last_ms = -1

    def next_id(self, now_ms: int | None = None) -> str:
        """A new id; pass `now_ms` when the caller has just read the clock anyway."""
        with self._lock:
            now = self._clock.now_ms() if now_ms is None else now_ms
            if now > self._last_ms:
                self._set_ms(now)
                self._counter = 0
            else:
                self._counter += 1
                if self._counter > 0xFFF:
                    self._set_ms(self._last_ms + 1)
                    self._counter = 0
            return self._prefix + _COUNTER_TEXT[self._counter] + self._suffix

    def _set_ms(self, ms: int) -> None:
        self._last_ms = ms
        text = f"{ms & 0xFFFFFFFFFFFF:012x}"
        self._prefix = f"{text[:8]}-{text[8:]}-7"


def _reseed_after_fork() -> None:
    for generator in list(_LIVE_GENERATORS):
        generator._reseed()


os.register_at_fork(after_in_child=_reseed_after_fork)
