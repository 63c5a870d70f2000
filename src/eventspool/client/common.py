"""What both clients share: the argument checks of `send()` and the size of an event.

Checking on the caller's side means a bad argument fails its own call, never a batch
written for other callers.
"""

from __future__ import annotations

from eventspool.agent.protocol import WireEvent
from eventspool.config import validate_topic
from eventspool.envelope import HeadersInput, normalize_headers
from eventspool.errors import InvalidEventError


def wire_event(
    topic: str, value: bytes | None, key: bytes | str | None, headers: HeadersInput | None
) -> WireEvent:
    """Check the arguments as `Client.send()` does, so both clients raise the same errors.

    A key the blocking client cannot encode, and a topic name, are checked here as
    `Spool.send()` checks them: a bad argument must fail its own call, never a batch
    written for other callers. The agent applies the same topic rule, so the error and its
    message are the ones the agent would have sent back.
    """
    if value is not None and type(value) is not bytes:
        raise InvalidEventError(f"value must be bytes or None, got {type(value).__name__}")
    raw_key: bytes | None
    if isinstance(key, str):
        try:
            raw_key = key.encode()
        except UnicodeEncodeError as exc:
            raise InvalidEventError(
                f"key for topic {topic!r} is not encodable as UTF-8: {exc.reason}"
            ) from None
    elif key is None or type(key) is bytes:
        raw_key = key
    else:
        raise InvalidEventError(
            f"key for topic {topic!r} must be bytes, str or None, got {type(key).__name__}"
        )
    event = WireEvent(value, raw_key, normalize_headers(headers))
    validate_topic(topic)
    return event


def wire_size(event: WireEvent) -> int:
    """Bytes the event takes in a SEND body, to keep frames under the agent's maximum."""
    size = 1
    if event.key is not None:
        size += 4 + len(event.key)
    if event.value is not None:
        size += 4 + len(event.value)
    if event.headers is not None:
        size += 2
        for name, value in event.headers:
            size += 2 + len(name.encode()) + 4 + (0 if value is None else len(value))
    return size
