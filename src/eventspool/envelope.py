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

The byte work is done by the compiled core (eventspool._core.native); this module keeps
the checks and errors callers see.

The event_id is kept as text because that same text travels to Kafka in the `event_id`
header and is what consumers deduplicate on.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from eventspool._core import native
from eventspool._core.native import ENVELOPE_FIXED_SIZE, ENVELOPE_MAX_HEADERS, EVENT_ID_HEADER
from eventspool.errors import InvalidEventError

# Bytes of an envelope before its key: the compiled core, which builds envelopes, defines it.
FIXED_SIZE = ENVELOPE_FIXED_SIZE
_MAX_HEADER_NAME = 0xFFFF
_CANONICAL_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_NIL_UUID = "00000000-0000-0000-0000-000000000000"

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
    if len(items) > ENVELOPE_MAX_HEADERS:
        raise InvalidEventError(f"{len(items)} headers; at most {ENVELOPE_MAX_HEADERS} are allowed")
    result: HeaderList = []
    for item in items:
        if not isinstance(item, tuple) or len(item) != 2:
            raise InvalidEventError(f"header {item!r} is not a (name, value) pair")
        name, value = item
        if not isinstance(name, str):
            raise InvalidEventError(f"header name {name!r} must be a str")
        if name == EVENT_ID_HEADER:
            raise InvalidEventError(
                f"header {EVENT_ID_HEADER!r} is eventspool's own: every event gets one with "
                "the id send() returns, and Kafka would carry both; to choose the id, give "
                "the event's own event_id (send(..., event_id=...) in Python, the "
                '"event_id" field of an HTTP or --json event object)'
            )
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


def caller_event_id(event_id: object) -> str:
    """A caller's own event id, checked: a UUID in its canonical 36-character text form.

    Reusing the id of an event that may have been spooled already (a retry after a crash)
    lets consumers, `eventspool.verify` and the Spark archive drop the copy. Upper-case
    hex digits are lowered, so both spellings of one UUID deduplicate. The nil UUID is
    refused: it is what an unset id field usually holds.
    """
    if isinstance(event_id, uuid.UUID):
        text = str(event_id)
    elif isinstance(event_id, str):
        text = event_id.lower()
    else:
        raise InvalidEventError(
            f"event_id must be a str or uuid.UUID, got {type(event_id).__name__}"
        )
    if not _CANONICAL_UUID.fullmatch(text) or text == _NIL_UUID:
        raise InvalidEventError(
            f"event_id {event_id!r} is not a UUID in its 36-character text form "
            "(8-4-4-4-12 hex digits, e.g. str(uuid.uuid4()); not the nil UUID)"
        )
    return text


def encode(
    event_id: bytes,
    create_time_ms: int,
    key: bytes | None,
    value: bytes | None,
    headers: HeaderList | None,
) -> bytes:
    """Build the payload; the caller has already checked the types."""
    return native.encode(event_id, create_time_ms, key, value, headers)


def decode_for_kafka(
    payload: bytes,
) -> tuple[bytes, int, bytes | None, bytes | None, HeaderList | None]:
    """(event_id as bytes, create time, key, value, headers): what a Kafka record needs.

    Keeps the id as the bytes the `event_id` header carries. Raises ValueError on a
    payload that is not an envelope.
    """
    return native.decode_for_kafka(payload)


def decode(payload: bytes | memoryview) -> Event:
    """Parse a payload written by `encode`; raises ValueError on anything malformed."""
    return Event(*native.decode_fields(payload))


EventIdGenerator = native.EventIdGenerator
