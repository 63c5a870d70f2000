"""The checks every `send()` argument passes, in the clients and in `Spool` alike.

A bad argument must fail its own call, never a batch written for other callers, and its
message must be the same whichever way the event was sent.
"""

from __future__ import annotations

import uuid

from eventspool._core.native import CHECKED_TOPICS, common_event_payload, encode_wire_event
from eventspool.config import validate_topic
from eventspool.envelope import HeadersInput, caller_event_id, normalize_headers
from eventspool.errors import EventspoolError, InvalidEventError


def bad_value(value: object, kind: str, name: object) -> InvalidEventError:
    """The error for a value that is not bytes or None; `kind` and `name` ("topic",
    "orders") only make the message."""
    return InvalidEventError(
        f"value for {kind} {name!r} must be bytes or None, got {type(value).__name__}"
        + (": encode it first, e.g. value.encode()" if isinstance(value, str) else "")
    )


def text_key(key: object, kind: str, name: object) -> bytes:
    """A str key as UTF-8; anything else that is not bytes or None is an error.

    Formatting the message only on failure keeps the cost off every send with a str key.
    """
    if not isinstance(key, str):
        raise InvalidEventError(
            f"key for {kind} {name!r} must be bytes, str or None, got {type(key).__name__}"
        )
    try:
        return key.encode()
    except UnicodeEncodeError as exc:
        raise InvalidEventError(
            f"key for {kind} {name!r} is not encodable as UTF-8: {exc.reason}"
        ) from None


def one_target(topic: object, exchange: object) -> None:
    """A send goes to a topic or through an exchange, never both."""
    if topic is not None:
        raise InvalidEventError(
            f"send() got topic {topic!r} and exchange {exchange!r}: give one of them "
            "(topic=None to route through the exchange)"
        )


#: What `send_many()` takes per event: a value, or (value, key), (value, key, headers) or
#: (value, key, headers, event_id).
BatchEvent = (
    bytes
    | None
    | tuple[bytes | None, bytes | str | None]
    | tuple[bytes | None, bytes | str | None, HeadersInput | None]
    | tuple[bytes | None, bytes | str | None, HeadersInput | None, str | uuid.UUID | None]
)
BatchFields = tuple[bytes | None, bytes | str | None, HeadersInput | None, str | uuid.UUID | None]

#: One event's fate in `send_many()`: its event_id, or the error that refused it.
Outcome = str | EventspoolError


def split_batch_event(item: BatchEvent) -> BatchFields:
    """(value, key, headers, event_id) of one `send_many()` event."""
    if isinstance(item, tuple):
        if len(item) == 2:
            return item[0], item[1], None, None
        if len(item) == 3:
            return item[0], item[1], item[2], None
        if len(item) == 4:
            return item
        raise InvalidEventError(
            f"a send_many() event is a value or a (value, key[, headers[, event_id]]) tuple, "
            f"got a tuple of {len(item)}"
        )
    return item, None, None, None


def event_payload(
    topic: str | None,
    value: bytes | None,
    key: bytes | str | None,
    headers: HeadersInput | None,
    event_id: str | uuid.UUID | None = None,
) -> bytes:
    """Check the arguments as `Client.send()` does; the event as a SEND body carries it.

    A key the blocking client cannot encode, and a topic name, are checked here as
    `Spool.send()` checks them: a bad argument must fail its own call, never a batch
    written for other callers. The agent applies the same topic rule, so the error and its
    message are the ones the agent would have sent back. The event is encoded here too,
    so what waits for a frame is one bytes object, not an object per field.
    """
    payload = common_event_payload(topic, value, key, headers, event_id)
    if payload is not None:
        return payload
    payload = wire_event(value, key, headers, event_id, "topic", topic)
    if type(topic) is not str or topic not in CHECKED_TOPICS:
        _check_topic(topic)
    return payload


def _check_topic(topic: str | None) -> None:
    checked = validate_topic(topic)
    if len(CHECKED_TOPICS) < _CHECKED_TOPICS_MAX:
        CHECKED_TOPICS.add(checked)


# How many checked topic names `CHECKED_TOPICS` keeps; past it, a name is checked each time.
_CHECKED_TOPICS_MAX = 1024


def wire_event(  # noqa: PLR0917  # send()'s own parameters, in its order
    value: bytes | None,
    key: bytes | str | None,
    headers: HeadersInput | None,
    event_id: str | uuid.UUID | None,
    kind: str,
    name: object,
) -> bytes:
    """The event as the wire carries it; `kind` and `name` only make error messages."""
    if value is not None and type(value) is not bytes:
        raise bad_value(value, kind, name)
    raw_key = key if key is None or type(key) is bytes else text_key(key, kind, name)
    header_list = None if headers is None else normalize_headers(headers)
    checked_id = None if event_id is None else caller_event_id(event_id)
    try:
        return encode_wire_event(value, raw_key, header_list, checked_id)
    except ValueError as exc:  # a size no frame can carry
        raise InvalidEventError(f"event for {kind} {name!r}: {exc}") from None
