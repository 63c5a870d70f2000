"""Read a topic back, as `kcat -C` does: assigned partitions, no consumer group.

Nothing is committed and no group is joined, so reading never moves anyone's offsets.
Without `follow` the read stops at each partition's end as it was when the read began,
found with the exact-end probe (the embedded broker's high watermark lags), so it ends.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, Consumer, KafkaError, TopicPartition

from eventspool.endoffsets import probe_config, true_end_offsets, watermarks
from eventspool.kafkalog import librdkafka_logger
from eventspool.topics import METADATA_TIMEOUT_S, TopicError, partitions_of

#: Where each partition's read begins: its first record, its end, an offset (clamped to
#: what the partition holds) or, when negative, that many records before its end.
Start = int | Literal["beginning", "end"]

#: The plain output: one line per record.
DEFAULT_FORMAT = r"%t/%p@%o key=%k headers=%h value=%s\n"

# A reader waits for new records, so let the broker hold a fetch (librdkafka's default)
# instead of the probe's busy 10 ms; a broker answers at once when records are there.
_READ_SETTINGS = {"fetch.wait.max.ms": 500, "auto.offset.reset": "earliest"}
_POLL_S = 0.5
# Without --follow, the records up to the ends are there: this long with none is a fault.
_STALL_S = 30.0


@dataclass(frozen=True, slots=True)
class Record:
    """One record read back; `timestamp` in ms since the epoch, None if the broker has none."""

    topic: str
    partition: int
    offset: int
    timestamp: int | None
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]

    @classmethod
    def of(cls, message: Any) -> Record:
        kind, timestamp = message.timestamp()
        return cls(
            message.topic(),
            message.partition(),
            message.offset(),
            None if kind == TIMESTAMP_NOT_AVAILABLE else timestamp,
            message.key(),
            message.value(),
            tuple(message.headers() or ()),
        )


def parse_start(text: str) -> Start:
    """`beginning`, `end`, an offset N or -N (N records before the end), as kcat's -o."""
    if text == "beginning":
        return "beginning"
    if text == "end":
        return "end"
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{text!r}: expected beginning, end, N or -N") from None


def first_offset(start: Start, low: int, end: int) -> int:
    """The offset a partition holding [low, end) is read from."""
    if start == "beginning":
        return low
    if start == "end":
        return end
    wanted = end + start if start < 0 else start
    return min(max(wanted, low), end)


def read(
    kafka: Mapping[str, Any],
    topic: str,
    start: Start = "beginning",
    *,
    follow: bool = False,
    count: int | None = None,
) -> Iterator[Record]:
    """The records of *topic* from *start*, partitions interleaved as they arrive; up to
    the ends as they are now, or for ever with *follow*; at most *count*.

    `kafka` holds librdkafka settings, at least `bootstrap.servers`. Raises TopicError
    for a topic that does not exist, at once.
    """
    # The caller's settings too (fetch sizes, isolation), under the probe's group-less ones.
    settings = probe_config(kafka, **_READ_SETTINGS, logger=librdkafka_logger())
    consumer: Any = Consumer({**kafka, **settings})
    try:
        ids = partitions_of(consumer, kafka["bootstrap.servers"], topic)[topic]
        ends = {
            p: end for (_, p), end in true_end_offsets(kafka, [(topic, p) for p in ids]).items()
        }
        starts = {p: first_offset(start, _low(consumer, topic, p), ends[p]) for p in ids}
        unread = {p for p in ids if starts[p] < ends[p]}
        reading = ids if follow else sorted(unread)
        if not reading:
            return
        consumer.assign([TopicPartition(topic, p, starts[p]) for p in reading])
        yield from _records(consumer, None if follow else (ends, unread), count)
    finally:
        consumer.close()


def _low(consumer: Any, topic: str, partition: int) -> int:
    """The first offset the partition still holds (retention may have deleted the rest)."""
    return watermarks(consumer, topic, partition, time.monotonic() + METADATA_TIMEOUT_S)[0]


def _records(
    consumer: Any, bounds: tuple[dict[int, int], set[int]] | None, count: int | None
) -> Iterator[Record]:
    """Poll until *count* records, or with *bounds* (the ends, the partitions not read to
    theirs yet) until every partition reached its end."""
    returned = 0
    heard = time.monotonic()
    while bounds is None or bounds[1]:
        messages = consumer.consume(500, _POLL_S)
        if messages:
            heard = time.monotonic()
        elif bounds is not None and time.monotonic() - heard > _STALL_S:
            raise TopicError(f"no record came for {_STALL_S:g} s before the end was reached")
        for message in messages:
            if not _is_record(message, bounds):
                continue
            yield Record.of(message)
            returned += 1
            if returned == count:
                return


def _is_record(message: Any, bounds: tuple[dict[int, int], set[int]] | None) -> bool:
    """Whether *message* is a record to show, not an event or past its partition's end;
    marks partitions done, also on an end-of-partition event (control records leave
    gaps before the end). A partition's error raises."""
    error = message.error()
    if error is not None and error.code() != KafkaError._PARTITION_EOF:
        if message.topic() is not None:
            raise TopicError(f"reading {message.topic()}/{message.partition()}: {error.str()}")
        return False  # a client-wide event (a broker away): librdkafka logs it and retries
    if bounds is not None:
        ends, unread = bounds
        partition, offset = message.partition(), message.offset()
        if partition not in unread:
            return False
        if (offset if error is not None else offset + 1) >= ends[partition]:
            unread.discard(partition)
        if offset >= ends[partition]:
            return False
    return error is None


def _text(data: bytes | None) -> bytes:
    return b"" if data is None else data


def _length(data: bytes | None) -> bytes:
    return b"-1" if data is None else b"%d" % len(data)


def _headers(record: Record) -> bytes:
    return b",".join(name.encode() + b"=" + _text(value) for name, value in record.headers)


_TOKENS: dict[str, Callable[[Record], bytes]] = {
    "t": lambda record: record.topic.encode(),
    "p": lambda record: b"%d" % record.partition,
    "o": lambda record: b"%d" % record.offset,
    "T": lambda record: b"-1" if record.timestamp is None else b"%d" % record.timestamp,
    "k": lambda record: _text(record.key),
    "s": lambda record: _text(record.value),
    "K": lambda record: _length(record.key),
    "S": lambda record: _length(record.value),
    "h": _headers,
}
_ESCAPES = {"n": b"\n", "r": b"\r", "t": b"\t", "\\": b"\\"}


def compile_format(template: str) -> Callable[[Record], bytes]:
    """kcat's -f: %t topic, %p partition, %o offset, %T timestamp (ms), %k key, %s value,
    %K and %S their lengths (-1: null), %h headers (name=value,...), %% a percent sign;
    \\n \\r \\t \\\\ escapes. Keys, values and headers are written as their bytes."""
    parts: list[bytes | Callable[[Record], bytes]] = []
    chars = iter(template)
    for char in chars:
        if char not in "%\\":
            parts.append(char.encode())
            continue
        following = next(chars, "")
        if char == "%" and following == "%":
            parts.append(b"%")
        elif char == "%" and following in _TOKENS:
            parts.append(_TOKENS[following])
        elif char == "\\" and following in _ESCAPES:
            parts.append(_ESCAPES[following])
        else:
            raise ValueError(f"{char}{following}: not a token of the format ({template!r})")
    return lambda record: b"".join(p if isinstance(p, bytes) else p(record) for p in parts)


def _encoded(data: bytes | None) -> tuple[str, str | None]:
    """*data* as text where it is UTF-8, else as base64, with the suffix its field name
    takes ("" or "_b64"), as in the agent's HTTP event objects."""
    if data is None:
        return "", None
    try:
        return "", data.decode()
    except UnicodeDecodeError:
        return "_b64", base64.b64encode(data).decode()


def record_json(record: Record) -> dict[str, object]:
    """One record as a JSON object: where it is, and its key, value and headers in the
    fields of the agent's HTTP event objects. A header name repeated within a record keeps
    its last value here (the plain and --format output show every one)."""
    document: dict[str, object] = {
        "topic": record.topic,
        "partition": record.partition,
        "offset": record.offset,
        "timestamp": record.timestamp,
    }
    for name, data in (("key", record.key), ("value", record.value)):
        suffix, text = _encoded(data)
        document[name + suffix] = text
    headers: dict[str, dict[str, str | None]] = {"": {}, "_b64": {}}
    for name, data in record.headers:
        for group in headers.values():
            group.pop(name, None)
        suffix, text = _encoded(data)
        headers[suffix][name] = text
    document["headers"] = headers[""]
    if headers["_b64"]:
        document["headers_b64"] = headers["_b64"]
    return document
