"""What a handler receives: one Kafka record, with the envelope's identity pulled out.

`Record` itself is built by the compiled core, where a worker makes one per event.
"""

from __future__ import annotations

from typing import Any

from confluent_kafka import TIMESTAMP_CREATE_TIME

from eventspool._core.native import EVENT_ID_HEADER, Record

__all__ = [
    "HeaderPairs",
    "RawRecord",
    "Record",
    "WireRecord",
    "record_from_raw",
    "wire_from_raw",
    "wire_record",
]

# (topic, partition, offset, key, value, headers, create_time_ms, event_id): the form a
# record crosses the process boundary in, cheaper to pickle than a Record.
HeaderPairs = list[tuple[str, bytes | None]]
WireRecord = tuple[
    str, int, int, bytes | None, bytes | None, HeaderPairs | None, int | None, str | None
]
# (offset, key, value, headers, (timestamp type, timestamp)): a record as the poll thread
# takes it from confluent_kafka, unparsed; the worker that runs it makes the Record.
RawRecord = tuple[int, bytes | None, bytes | None, HeaderPairs | None, tuple[int, int]]


def wire_record(message: Any) -> WireRecord:
    """Flatten a confluent_kafka Message; the create time falls back to the header."""
    headers = message.headers()
    create_time_ms, event_id = _identity(headers, message.timestamp())
    return (
        message.topic(),
        message.partition(),
        message.offset(),
        message.key(),
        message.value(),
        headers,
        create_time_ms,
        event_id,
    )


def wire_from_raw(topic: str, partition: int, raw: RawRecord) -> WireRecord:
    offset, key, value, headers, timestamp = raw
    create_time_ms, event_id = _identity(headers, timestamp)
    return (topic, partition, offset, key, value, headers, create_time_ms, event_id)


def record_from_raw(topic: str, partition: int, raw: RawRecord, attempt: int) -> Record:
    return Record(*wire_from_raw(topic, partition, raw), attempt=attempt)


def _identity(
    headers: HeaderPairs | None, timestamp: tuple[int, int]
) -> tuple[int | None, str | None]:
    """(create time in ms, event id) from the envelope's headers, else the record's
    create timestamp."""
    event_id = None
    create_time_ms = None
    if headers:
        for name, value in headers:
            if name == EVENT_ID_HEADER and value is not None:
                event_id = value.decode("ascii", "replace")
            elif name == "create_time" and value is not None:
                create_time_ms = _int_or_none(value)
    timestamp_type, stamp = timestamp
    if create_time_ms is None and timestamp_type == TIMESTAMP_CREATE_TIME:
        create_time_ms = stamp
    return create_time_ms, event_id


def _int_or_none(raw: bytes) -> int | None:
    try:
        return int(raw)
    except ValueError:
        return None
