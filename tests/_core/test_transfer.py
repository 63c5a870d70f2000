"""The consumer's compiled hand-over, `split_keyed`, `decode_records`, `decode_part` and
`PartRecords`, against a model.

A poll's messages must come out as the model says: keyless ones in place, keyed ones in
runs of one partition (at most `cap` each, refetched and unassigned ones skipped, stale
ones set apart by the same create-time rule as eventspool.consumer.record), and each
run's records in the blob of worker crc32(key) % workers, byte for byte and in offset
order. `decode_part` must make the same Records as the Python rule in
eventspool.consumer.record. A damaged blob is a ValueError, never a crash. The sanitizer
test runs this file against the instrumented build.
"""

from __future__ import annotations

import contextlib
import zlib
from dataclasses import dataclass
from typing import Any

import pytest
from confluent_kafka import Message
from hypothesis import given
from hypothesis import strategies as st

from eventspool._core.native import (
    PartRecords,
    calls_getters_directly,
    decode_part,
    decode_records,
    split_keyed,
)
from eventspool.consumer.record import HeaderPairs, RawRecord, record_from_raw, wire_from_raw

TOPICS = ("orders", "clicks")


@dataclass(frozen=True)
class FakeMessage:
    """The part of confluent_kafka.Message that split_keyed reads."""

    topic_name: str
    partition_id: int
    offset_value: int
    key_bytes: bytes | None
    value_bytes: bytes | None
    header_pairs: HeaderPairs | None
    stamp: tuple[int, int]

    def topic(self) -> str:
        return self.topic_name

    def partition(self) -> int:
        return self.partition_id

    def offset(self) -> int:
        return self.offset_value

    def key(self) -> bytes | None:
        return self.key_bytes

    def value(self) -> bytes | None:
        return self.value_bytes

    def headers(self) -> HeaderPairs | None:
        return self.header_pairs

    def timestamp(self) -> tuple[int, int]:
        return self.stamp

    def raw(self) -> RawRecord:
        return (self.offset_value, self.key_bytes, self.value_bytes, self.header_pairs, self.stamp)


header_values = st.one_of(st.none(), st.binary(max_size=8), st.sampled_from([b"5", b"50", b"x"]))
header_lists = st.one_of(
    st.none(),
    st.lists(
        st.tuples(st.sampled_from(["create_time", "event_id", "näme", ""]), header_values),
        max_size=3,
    ),
)


@st.composite
def polls(draw: st.DrawFn) -> list[FakeMessage]:
    """Messages as one poll returns them: per partition in increasing offset order,
    partitions interleaved, some offsets going back (a refetch)."""
    next_offset: dict[tuple[str, int], int] = {}
    messages = []
    for _ in range(draw(st.integers(0, 40))):
        topic = draw(st.sampled_from(TOPICS))
        partition = draw(st.integers(0, 2))
        offset = next_offset.get((topic, partition), draw(st.integers(0, 5)))
        if draw(st.integers(0, 9)) == 0:
            offset = max(offset - draw(st.integers(1, 3)), 0)
        next_offset[(topic, partition)] = offset + 1 + draw(st.integers(0, 1))
        messages.append(
            FakeMessage(
                topic,
                partition,
                offset,
                draw(st.one_of(st.none(), st.sampled_from([b"a", b"b", b"c", b"", b"key-9"]))),
                draw(st.one_of(st.none(), st.binary(max_size=20))),
                draw(header_lists),
                (draw(st.sampled_from([0, 1, 2])), draw(st.integers(0, 100))),
            )
        )
    return messages


def model(
    messages: list[FakeMessage],
    workers: int,
    cap: int,
    ends: dict[tuple[str, int], int | None],
    oldest_ms: float | None,
) -> list[Any]:
    """What split_keyed must return, written the plain way."""
    ends = dict(ends)
    out: list[Any] = []
    run: dict[str, Any] | None = None

    def close() -> None:
        if run is not None and run["count"]:
            blobs = [run["buckets"][w] or None for w in range(workers)]
            out.append((run["tp"], run["first"], run["end"], run["count"], blobs, run["stale"]))
            ends[run["tp"]] = run["end"]

    for message in messages:
        if message.key_bytes is None:
            close()
            run = None
            out.append(message)
            continue
        tp = (message.topic_name, message.partition_id)
        if run is None or run["tp"] != tp or run["count"] >= cap:
            close()
            end = run["end"] if run is not None and run["tp"] == tp else ends.get(tp)
            run = {"tp": tp, "end": end, "first": None, "count": 0, "stale": []}
            run["buckets"] = [[] for _ in range(workers)]
        if tp not in ends:
            continue
        if run["end"] is not None and message.offset_value < run["end"]:
            continue
        if not run["count"]:
            run["first"] = message.offset_value
        run["end"] = message.offset_value + 1
        run["count"] += 1
        created = wire_from_raw(tp[0], tp[1], message.raw())[6]
        if oldest_ms is not None and created is not None and created < oldest_ms:
            run["stale"].append(message.raw())
            continue
        run["buckets"][zlib.crc32(message.key_bytes) % workers].append(message.raw())
    close()
    return out


@given(
    messages=polls(),
    workers=st.integers(1, 3),
    cap=st.integers(1, 6),
    known=st.dictionaries(
        st.tuples(st.sampled_from(TOPICS), st.integers(0, 2)),
        st.one_of(st.none(), st.integers(0, 8)),
    ),
    oldest_ms=st.one_of(st.none(), st.integers(0, 100)),
)
def test_split_keyed_matches_the_model(
    messages: list[FakeMessage],
    workers: int,
    cap: int,
    known: dict[tuple[str, int], int | None],
    oldest_ms: int | None,
) -> None:
    expected = model(messages, workers, cap, known, oldest_ms)
    got = split_keyed(list(messages), workers, cap, dict(known), oldest_ms)
    assert len(got) == len(expected)
    for item, want in zip(got, expected, strict=True):
        if isinstance(want, FakeMessage):
            assert item is want
            continue
        topic, partition, first, end, count, blobs, stale = item
        assert ((topic, partition), first, end, count) == want[:4]
        assert stale == want[5]
        for packed, records in zip(blobs, want[4], strict=True):
            if records is None:
                assert packed is None
            else:
                assert packed is not None
                blob, events = packed
                assert events == len(records)
                assert decode_records(blob) == records
                assert decode_part(blob, topic, partition) == [
                    record_from_raw(topic, partition, raw, 1) for raw in records
                ]
                assert PartRecords(blob, topic, partition).count == len(records)


def _kafka_message(message: FakeMessage) -> Message:
    headers: list[tuple[str, str | bytes | None]] | None = (
        None if message.header_pairs is None else list(message.header_pairs)
    )
    return Message(
        topic=message.topic_name,
        partition=message.partition_id,
        offset=message.offset_value,
        key=message.key_bytes,
        value=message.value_bytes,
        headers=headers,
        timestamp=message.stamp,
    )


@given(
    messages=polls(),
    real=st.lists(st.booleans(), min_size=40, max_size=40),
    oldest_ms=st.one_of(st.none(), st.integers(0, 100)),
)
def test_split_keyed_reads_kafka_messages_as_it_reads_the_stand_in(
    messages: list[FakeMessage], real: list[bool], oldest_ms: int | None
) -> None:
    """confluent_kafka's own Message goes the compiled getters' way, the stand-in by
    name; a poll that mixes them switches between the two."""
    poll: list[Any] = [
        _kafka_message(message) if kafka else message
        for message, kafka in zip(messages, real, strict=False)
    ]
    known: dict[tuple[str, int], int | None] = {(t, p): None for t in TOPICS for p in range(3)}
    got = split_keyed(poll, 2, 4, dict(known), oldest_ms)
    expected = split_keyed(list(messages), 2, 4, dict(known), oldest_ms)
    keyless = iter([item for item in poll if item.key() is None])
    assert len(got) == len(expected)
    for item, want in zip(got, expected, strict=True):
        if isinstance(want, FakeMessage):
            assert item is next(keyless)
        else:
            assert item == want


def test_kafka_messages_are_read_through_their_c_getters_and_nothing_else_is() -> None:
    class Overriding(Message):
        def key(self) -> bytes:
            return b"overridden"

    class Borrowing:
        key = str.upper  # another type's C method: calling it on this object would crash

    assert calls_getters_directly(Message)
    assert not calls_getters_directly(Overriding)
    assert not calls_getters_directly(FakeMessage)
    assert not calls_getters_directly(Borrowing)
    message = Overriding(topic="t", partition=0, offset=0, key=b"k", value=b"v", timestamp=(0, 0))
    ((*_, blobs, _stale),) = split_keyed([message], 1, 10, {("t", 0): None}, None)
    assert blobs[0] is not None
    assert decode_records(blobs[0][0])[0][1] == b"overridden"
    with pytest.raises(TypeError, match="descriptor 'upper'"):
        split_keyed([Borrowing()], 1, 10, {("t", 0): None}, None)


def test_each_key_has_one_worker_and_keys_spread_over_all() -> None:
    keys = [b"key-%d" % n for n in range(1000)]
    messages = [FakeMessage("t", 0, n, key, b"", None, (0, 0)) for n, key in enumerate(keys)]
    ((_t, _p, _first, _end, _count, blobs, _stale),) = split_keyed(
        messages, 3, 1000, {("t", 0): None}, None
    )
    owners = {}
    for worker, packed in enumerate(blobs):
        assert packed is not None
        for raw in decode_records(packed[0]):
            owners[raw[1]] = worker
    assert owners == {key: zlib.crc32(key) % 3 for key in keys}
    assert all(250 < list(owners.values()).count(worker) < 420 for worker in range(3))


@pytest.mark.parametrize(
    ("value", "headers", "error"),
    [
        ("text", None, "bytes or None"),
        (b"v", [("name", "text")], "bytes or None"),
        (b"v", [["name", b"v"]], r"\(name, value\) tuple"),
        (b"v", [("name", b"v", b"extra")], r"\(name, value\) tuple"),
        (b"v", [(b"name", b"v")], "str"),
    ],
)
def test_a_field_of_the_wrong_type_is_refused(value: Any, headers: Any, error: str) -> None:
    message = FakeMessage("t", 0, 0, b"k", value, headers, (0, 0))
    with pytest.raises(TypeError, match=error):
        split_keyed([message], 1, 10, {("t", 0): None}, None)


@given(cut=st.integers(min_value=0), junk=st.binary(min_size=1, max_size=30))
def test_a_damaged_blob_decodes_to_a_prefix_or_is_a_value_error(cut: int, junk: bytes) -> None:
    headers: HeaderPairs = [("create_time", b"5"), ("näme", None)]
    messages = [FakeMessage("t", 0, n, b"k", b"v" * n, headers, (1, n)) for n in range(3)]
    ((*_, blobs, _stale),) = split_keyed(messages, 1, 10, {("t", 0): None}, None)
    assert blobs[0] is not None
    blob = blobs[0][0]
    records = decode_records(blob)
    assert records == [message.raw() for message in messages]
    truncated = blob[: cut % len(blob)]
    with contextlib.suppress(ValueError):
        assert records[: len(decode_records(truncated))] == decode_records(truncated)
    with contextlib.suppress(ValueError):
        assert decode_records(blob + junk)[:3] == records
    with contextlib.suppress(ValueError):
        assert len(decode_part(truncated, "t", 0)) == len(decode_records(truncated))
    for damaged in (truncated, blob + junk):
        _assert_counts_as_it_reads(damaged)


def _assert_counts_as_it_reads(blob: bytes) -> None:
    """PartRecords refuses a blob exactly when reading it whole fails, and otherwise
    counts and makes as many records as there are."""
    try:
        records = decode_records(blob)
    except ValueError:
        with pytest.raises(ValueError):
            PartRecords(blob, "t", 0)
        return
    part = PartRecords(blob, "t", 0)
    assert part.count == len(records) == len(list(part))


def test_a_blob_cut_inside_a_record_is_a_value_error() -> None:
    ((*_, blobs, _stale),) = split_keyed(
        [FakeMessage("t", 0, 0, b"k", b"value", None, (0, 0))], 1, 10, {("t", 0): None}, None
    )
    assert blobs[0] is not None
    with pytest.raises(ValueError, match="overruns"):
        decode_records(blobs[0][0][:-1])
    with pytest.raises(ValueError, match="overruns"):
        decode_part(blobs[0][0][:-1], "t", 0)
    with pytest.raises(ValueError, match="overruns"):  # before any record is made
        PartRecords(blobs[0][0][:-1], "t", 0)


def test_a_header_name_that_is_not_utf8_is_refused_before_any_record_is_made() -> None:
    message = FakeMessage("t", 0, 0, b"k", b"v", [("näme", b"1")], (0, 0))
    ((*_, blobs, _stale),) = split_keyed([message], 1, 10, {("t", 0): None}, None)
    assert blobs[0] is not None
    damaged = blobs[0][0].replace("ä".encode(), b"\xff\xff")
    with pytest.raises(UnicodeDecodeError):
        PartRecords(damaged, "t", 0)
