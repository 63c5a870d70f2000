"""Behaviour of `Spool`, the in-process entry point: ids, envelopes, validation, ownership,
pending events, partition counts, full queues and durability.

Everything goes through real files in `tmp_path`; events are read back from the rings
themselves, so a test passes only if what `send()` promised is really on disk.
"""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventspool.clock import ManualClock
from eventspool.config import Durability, FullPolicy, QueueSettings, SpoolSettings
from eventspool.envelope import Event, decode
from eventspool.errors import InvalidEventError, SpoolFullError, SpoolLockedError
from eventspool.pipeline import Spool
from eventspool.spool.partitioner import partition_for_key
from eventspool.spool.registry import save_partition_counts
from eventspool.spool.segments import SegmentedQueue

SMALL_QUEUE = 64 * 1024
SMALL = SpoolSettings(max_event_bytes=4096, queue=QueueSettings(capacity_bytes=SMALL_QUEUE))


def small(**queue: Any) -> SpoolSettings:
    """64 KiB rings with the given queue settings: fills up after a few dozen events."""
    return SpoolSettings(
        max_event_bytes=4096, queue=QueueSettings(capacity_bytes=SMALL_QUEUE, **queue)
    )


def ring_of(spool: Spool, topic: str, partition: int | None = 0) -> SegmentedQueue:
    (ring,) = [r.ring for r in spool.queues() if r.topic == topic and r.partition == partition]
    return ring


def stored(spool: Spool, topic: str) -> dict[int | None, list[Event]]:
    """Every queued event of `topic`, decoded from its ring, by partition (None: pending)."""
    out: dict[int | None, list[Event]] = {}
    for ref in spool.queues():
        if ref.topic != topic:
            continue
        ref.ring.rewind()
        events: list[Event] = []
        while batch := ref.ring.read_batch(max_records=100_000, max_bytes=1 << 30):
            events.extend(decode(record.payload) for record in batch)
        ref.ring.rewind()
        out[ref.partition] = events
    return out


def stored_ids(spool: Spool, topic: str) -> list[str]:
    return [event.event_id for events in stored(spool, topic).values() for event in events]


def uuid7_ms(event_id: str) -> int:
    """The millisecond timestamp of a UUIDv7, after checking it is one."""
    parsed = uuid.UUID(event_id)
    assert str(parsed) == event_id, "not in canonical text form"
    assert parsed.version == 7
    assert parsed.variant == uuid.RFC_4122
    return parsed.int >> 80


# ---- event ids and envelopes -----------------------------------------------------------


def test_event_ids_are_uuid7_time_ordered_and_unique(tmp_path: Path) -> None:
    """Consumers deduplicate on event_id and may sort by it: 100k ids, all distinct, in order."""
    with Spool(tmp_path) as spool:
        before = time.time_ns() // 1_000_000
        ids = [spool.send("ids", b"%d" % i) for i in range(100_000)]
        after = time.time_ns() // 1_000_000
        assert stored_ids(spool, "ids") == ids
    assert len(set(ids)) == len(ids)
    assert ids == sorted(ids)
    stamps = [uuid7_ms(i) for i in (ids[0], ids[len(ids) // 2], ids[-1])]
    assert before <= stamps[0] <= stamps[1] <= stamps[2] <= after + 50


def test_event_ids_stay_ordered_beyond_4096_per_millisecond(tmp_path: Path) -> None:
    """With the clock stopped, the 12-bit counter runs into the timestamp, as RFC 9562 allows.

    The create time stored with each event stays the real clock reading.
    """
    clock = ManualClock()
    with Spool(tmp_path, clock=clock) as spool:
        ids = [spool.send("ids", b"v") for _ in range(10_000)]
        events = stored(spool, "ids")[None]
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)
    assert uuid7_ms(ids[0]) == uuid7_ms(ids[4095]) == clock.now_ms()
    assert uuid7_ms(ids[4096]) == clock.now_ms() + 1
    assert [e.event_id for e in events] == ids
    assert {e.create_time_ms for e in events} == {clock.now_ms()}


def test_event_ids_are_unique_across_a_fork(tmp_path: Path) -> None:
    """A forked child must not repeat its parent's ids, even at the very same millisecond."""
    clock = ManualClock()
    count = 2000
    with Spool(tmp_path, settings=SpoolSettings(), clock=clock) as spool:
        spool.send("parent", b"before the fork")
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.close(read_fd)
                text = "\n".join(spool.send("child", b"c") for _ in range(count))
                os.write(write_fd, text.encode())
                os.close(write_fd)
                code = 0
            finally:
                os._exit(code)
        os.close(write_fd)
        parent_ids = [spool.send("parent", b"p") for _ in range(count)]
        with os.fdopen(read_fd, "rb") as pipe:
            child_ids = pipe.read().decode().split("\n")
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert len(child_ids) == count
    assert len(set(parent_ids)) == count
    assert len(set(child_ids)) == count
    assert not set(parent_ids) & set(child_ids)
    # Same clock, same counter: only the random bits the child drew anew tell them apart.
    assert uuid7_ms(parent_ids[0]) == uuid7_ms(child_ids[0])


_header_value = st.none() | st.binary(max_size=20) | st.text(max_size=10)
_name = st.text(st.characters(codec="utf-8"), max_size=12)


@settings(
    max_examples=150,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    key=st.none() | st.binary(max_size=40) | st.text(st.characters(codec="utf-8"), max_size=20),
    value=st.none() | st.binary(max_size=300),
    headers=st.none()
    | st.dictionaries(_name, _header_value, max_size=4)
    | st.lists(st.tuples(_name, _header_value), max_size=4),
    advance=st.floats(0, 10_000),
)
def test_stored_envelope_decodes_to_exactly_what_was_sent(
    tmp_path: Path,
    key: bytes | str | None,
    value: bytes | None,
    headers: dict[str, bytes | str | None] | list[tuple[str, bytes | str | None]] | None,
    advance: float,
) -> None:
    """Key, value, headers and create time come back byte for byte; str is sent as UTF-8."""
    clock = ManualClock()
    clock.advance(advance)
    with Spool(tmp_path / str(uuid.uuid4()), settings=SMALL, clock=clock) as spool:
        spool.set_partition_count("round-trip", 1)
        event_id = spool.send("round-trip", value, key, headers)
        (record,) = ring_of(spool, "round-trip").read_batch()
    pairs = list(headers.items()) if isinstance(headers, dict) else headers
    expected_headers = [
        (name, v.encode() if isinstance(v, str) else v) for name, v in pairs or []
    ] or None
    assert decode(record.payload) == Event(
        event_id,
        clock.now_ms(),
        key.encode() if isinstance(key, str) else key,
        value,
        expected_headers,
    )
    assert record.timestamp_ms == clock.now_ms()


def test_a_caller_chosen_event_id_is_stored_and_returned(tmp_path: Path) -> None:
    """The caller's id replaces eventspool's, with or without headers, and a retry with the
    same id is stored again under it: deduplication is the consumers' job."""
    chosen = uuid.uuid4()
    with Spool(tmp_path, settings=SMALL) as spool:
        spool.set_partition_count("retried", 1)
        first = spool.send("retried", b"v", b"k", event_id=chosen)
        again = spool.send("retried", b"v", b"k", {"h": "x"}, event_id=str(chosen).upper())
        fresh = spool.send("retried", b"v", b"k")
        events = stored(spool, "retried")[0]
    assert first == again == str(chosen)
    assert [event.event_id for event in events] == [str(chosen), str(chosen), fresh]
    assert events[1].headers == [("h", b"x")]
    assert fresh != first


def test_tombstone_is_distinct_from_an_empty_value(tmp_path: Path) -> None:
    """`value=None` deletes a key in a compacted topic; `b""` is a real, empty value."""
    with Spool(tmp_path, settings=SMALL) as spool:
        spool.set_partition_count("compacted", 1)
        spool.send("compacted", None, b"user-1")
        spool.send("compacted", b"", b"user-1")
        spool.send("compacted", b"", None)
        records = ring_of(spool, "compacted").read_batch()
        events = stored(spool, "compacted")[0]
    assert [(e.key, e.value) for e in events] == [(b"user-1", None), (b"user-1", b""), (None, b"")]
    # In the envelope, the value length is -1 for a tombstone and 0 for an empty value.
    value_lengths = [struct.unpack_from("<i", r.payload, 50)[0] for r in records]
    assert value_lengths == [-1, 0, 0]


# ---- bad input -------------------------------------------------------------------------

BAD_INPUT: list[tuple[str, dict[str, Any], str]] = [
    ("value str", {"value": "text"}, "encode it first"),
    ("value int", {"value": 42}, "got int"),
    ("value bytearray", {"value": bytearray(b"x")}, "got bytearray"),
    ("value memoryview", {"value": memoryview(b"x")}, "got memoryview"),
    ("key int", {"key": 7}, "got int"),
    ("key bytearray", {"key": bytearray(b"k")}, "got bytearray"),
    ("topic empty", {"topic": ""}, "empty"),
    ("topic space", {"topic": "a b"}, "' '"),
    ("topic slash", {"topic": "a/b"}, "'/'"),
    ("topic dotdot", {"topic": ".."}, "not allowed"),
    ("topic dot", {"topic": "."}, "not allowed"),
    ("topic 250 chars", {"topic": "t" * 250}, "250 characters"),
    ("topic int", {"topic": 5}, "must be a str, got int"),
    ("topic None", {"topic": None}, "got NoneType"),
    ("topic bytes", {"topic": b"good"}, "got bytes"),
    ("header value int", {"headers": {"h": 5}}, "header 'h' value"),
    ("header one-tuple", {"headers": [("h",)]}, "not a (name, value) pair"),
    ("header triple", {"headers": [("h", b"v", b"x")]}, "not a (name, value) pair"),
    ("header list pair", {"headers": [["h", b"v"]]}, "not a (name, value) pair"),
    ("header name int", {"headers": [(5, b"v")]}, "header name 5"),
    ("headers str", {"headers": "h=v"}, "mapping or a list of (name, value) pairs"),
    ("too large", {"value": b"x" * 4096}, "max_event_bytes"),
    ("event_id not a UUID", {"event_id": "order-17"}, "not a UUID"),
    ("event_id bytes", {"event_id": b"0191e2c4-7a10-7000-8a3b-5c2d1e0f4a6b"}, "got bytes"),
    ("event_id nil", {"event_id": "00000000-0000-0000-0000-000000000000"}, "nil UUID"),
    ("event_id braces", {"event_id": "{0191e2c4-7a10-7000-8a3b-5c2d1e0f4a6b}"}, "36-character"),
]

# Bad input that src/ lets through as some other exception: documented as bugs.
UNUSUAL_BAD_INPUT: list[tuple[str, dict[str, Any], str]] = [
    ("topic unhashable", {"topic": ["good"]}, "topic must be a str"),
    ("headers not iterable", {"headers": 5}, "headers must be a mapping"),
    ("65536 headers", {"headers": [("h", None)] * 65536}, "at most 65535"),
    ("header name of 65536 bytes", {"headers": {"h" * 65536: b"v"}}, "at most 65535"),
    ("key with a lone surrogate", {"key": "\ud800"}, "not encodable as UTF-8"),
    ("header name with a lone surrogate", {"headers": {"\ud800": b"v"}}, "not encodable"),
]


def _send_bad(tmp_path: Path, overrides: dict[str, Any]) -> InvalidEventError:
    """Send one bad event next to three good ones; check the good ones are untouched."""
    with Spool(tmp_path, settings=SMALL) as spool:
        spool.set_partition_count("good", 1)
        good = [spool.send("good", b"value-%d" % i, b"k") for i in range(3)]
        topics_before = sorted(p.name for p in (tmp_path / "topics").iterdir())
        call: dict[str, Any] = {
            "topic": "good",
            "value": b"fine",
            "key": None,
            "headers": None,
            "event_id": None,
        }
        call.update(overrides)
        with pytest.raises(InvalidEventError) as caught:
            spool.send(
                call["topic"],
                call["value"],
                call["key"],
                call["headers"],
                event_id=call["event_id"],
            )
        ring = ring_of(spool, "good")
        assert ring.depth == 3
        assert [(e.event_id, e.value) for e in stored(spool, "good")[0]] == [
            (event_id, b"value-%d" % i) for i, event_id in enumerate(good)
        ]
        assert sorted(p.name for p in (tmp_path / "topics").iterdir()) == topics_before
        later = spool.send("good", b"still works")
        assert stored_ids(spool, "good") == [*good, later]
    return caught.value


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [pytest.param(o, f, id=name) for name, o, f in BAD_INPUT],
)
def test_bad_input_raises_invalid_event_and_changes_nothing(
    tmp_path: Path, overrides: dict[str, Any], fragment: str
) -> None:
    """The caller learns what was wrong, at send(), and no queued event is disturbed."""
    error = _send_bad(tmp_path, overrides)
    assert fragment in str(error)


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [pytest.param(o, f, id=name) for name, o, f in UNUSUAL_BAD_INPUT],
)
def test_bad_input_of_unusual_shapes_raises_invalid_event(
    tmp_path: Path, overrides: dict[str, Any], fragment: str
) -> None:
    """Every bad event surfaces as InvalidEventError, whatever is wrong with it."""
    assert fragment in str(_send_bad(tmp_path, overrides))


def test_event_of_exactly_max_event_bytes_is_accepted(tmp_path: Path) -> None:
    """The limit is inclusive; only what is over it is refused."""
    with Spool(tmp_path, settings=SMALL) as spool:
        spool.set_partition_count("edge", 1)
        spool.send("edge", b"")
        (record,) = ring_of(spool, "edge").read_batch()
        overhead = len(record.payload)
        spool.send("edge", b"x" * (SMALL.max_event_bytes - overhead))
        with pytest.raises(InvalidEventError, match="4097 bytes"):
            spool.send("edge", b"x" * (SMALL.max_event_bytes - overhead + 1))
        assert ring_of(spool, "edge").depth == 2


def test_topic_of_249_characters_is_accepted(tmp_path: Path) -> None:
    """Kafka's own limit, not one less."""
    with Spool(tmp_path, settings=SMALL) as spool:
        spool.send("t" * 249, b"v")
        assert ring_of(spool, "t" * 249, None).depth == 1


# ---- ownership -------------------------------------------------------------------------


def test_second_spool_in_the_same_process_is_refused(tmp_path: Path) -> None:
    """Two owners would interleave writes into the same rings."""
    first = Spool(tmp_path, settings=SMALL)
    try:
        event_id = first.send("t", b"v")
        with pytest.raises(SpoolLockedError, match=rf"\(pid {os.getpid()}\)"):
            Spool(tmp_path, settings=SMALL)
        assert first.send("t", b"still mine")
    finally:
        first.close()
    with Spool(tmp_path, settings=SMALL) as second:
        assert stored_ids(second, "t")[0] == event_id


_TRY_OPEN = """
import sys
from eventspool import Spool, SpoolLockedError, SpoolSettings, QueueSettings
try:
    Spool(sys.argv[1], settings=SpoolSettings(
        max_event_bytes=4096, queue=QueueSettings(capacity_bytes=65536))).close()
except SpoolLockedError as exc:
    print("locked:", exc)
else:
    print("opened")
"""

_HOLD = """
import sys, time
from eventspool import Spool, SpoolSettings, QueueSettings
spool = Spool(sys.argv[1], settings=SpoolSettings(
    max_event_bytes=4096, queue=QueueSettings(capacity_bytes=65536)))
print(spool.send("held", b"sent by the holder"), flush=True)
time.sleep(600)
"""


def test_second_spool_in_another_process_is_refused(tmp_path: Path) -> None:
    """The lock is the kernel's: another process sees it, and learns our pid."""
    with Spool(tmp_path, settings=SMALL):
        proc = subprocess.run(
            [sys.executable, "-c", _TRY_OPEN, str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        assert proc.stdout.startswith("locked:"), proc.stdout + proc.stderr
        assert f"(pid {os.getpid()})" in proc.stdout
    proc = subprocess.run(
        [sys.executable, "-c", _TRY_OPEN, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert proc.stdout.strip() == "opened", proc.stderr


def test_directory_of_a_sigkilled_owner_can_be_opened(tmp_path: Path) -> None:
    """A crashed owner must not need manual cleanup: the kernel drops its lock."""
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        event_id = holder.stdout.readline().strip()
        assert event_id, holder.stderr.read() if holder.stderr else ""
        with pytest.raises(SpoolLockedError, match=rf"\(pid {holder.pid}\)"):
            Spool(tmp_path, settings=SMALL)
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
        for stream in (holder.stdout, holder.stderr):
            if stream is not None:
                stream.close()
    with Spool(tmp_path, settings=SMALL) as spool:
        assert stored_ids(spool, "held") == [event_id]


# ---- pending events and partition counts -----------------------------------------------


def _mixed_events(spool: Spool, topic: str, count: int) -> list[tuple[str, bytes | None, int]]:
    """Send keyed and keyless events; returns (event_id, key, counter) in send order."""
    sent = []
    for i in range(count):
        key = None if i % 3 == 0 else b"key-%d" % (i % 7)
        sent.append((spool.send(topic, b"%d" % i, key), key, i))
    return sent


def _check_partitioned(
    events: dict[int | None, list[Event]], sent: list[tuple[str, bytes | None, int]], count: int
) -> None:
    """All sent events are in partitions, keyed ones by murmur2, each partition in send order."""
    assert None not in events, "the pending ring is still there"
    by_id = {event_id: (key, counter) for event_id, key, counter in sent}
    seen: list[str] = []
    for partition, queued in events.items():
        assert partition is not None and 0 <= partition < count
        counters = []
        for event in queued:
            key, counter = by_id[event.event_id]
            assert event.key == key and event.value == b"%d" % counter
            if key is not None:
                assert partition == partition_for_key(key, count)
            counters.append(counter)
            seen.append(event.event_id)
        assert counters == sorted(counters), f"partition {partition} is out of order"
    assert sorted(seen) == sorted(by_id)


def test_events_wait_in_the_pending_ring_until_the_partition_count_is_known(
    tmp_path: Path,
) -> None:
    """Before the sender has asked Kafka, events queue per topic and move over in order."""
    with Spool(tmp_path, settings=SMALL) as spool:
        sent = _mixed_events(spool, "orders", 60)
        pending = tmp_path / "topics" / "orders" / "pending.queue"
        assert pending.exists()
        assert [e.event_id for e in stored(spool, "orders")[None]] == [s[0] for s in sent]
        spool.set_partition_count("orders", 4)
        assert not pending.exists()
        _check_partitioned(stored(spool, "orders"), sent, 4)
        later = spool.send("orders", b"later", b"key-1")
        assert later in [
            e.event_id for e in stored(spool, "orders")[partition_for_key(b"key-1", 4)]
        ]
        assert not pending.exists()


def test_pending_events_survive_a_reopen(tmp_path: Path) -> None:
    """Pending events are as durable as any other; the count may come in a later run."""
    with Spool(tmp_path, settings=SMALL) as spool:
        sent = _mixed_events(spool, "later", 30)
    with Spool(tmp_path, settings=SMALL) as spool:
        assert [e.event_id for e in stored(spool, "later")[None]] == [s[0] for s in sent]
        spool.set_partition_count("later", 2)
        _check_partitioned(stored(spool, "later"), sent, 2)
    with Spool(tmp_path, settings=SMALL) as spool:
        _check_partitioned(stored(spool, "later"), sent, 2)


def test_pending_ring_is_moved_at_open_when_the_count_is_on_disk(tmp_path: Path) -> None:
    """A pending ring next to a cached count (e.g. a crash mid-move) is moved while opening."""
    with Spool(tmp_path, settings=SMALL) as spool:
        sent = _mixed_events(spool, "stuck", 20)
    save_partition_counts(tmp_path, {"stuck": 3})
    with Spool(tmp_path, settings=SMALL) as spool:
        assert not (tmp_path / "topics" / "stuck" / "pending.queue").exists()
        _check_partitioned(stored(spool, "stuck"), sent, 3)


def test_partition_counts_are_cached_on_disk_and_survive_reopen(tmp_path: Path) -> None:
    """After a restart, events go straight to partitions without waiting for Kafka."""
    with Spool(tmp_path, settings=SMALL) as spool:
        spool.set_partition_count("cached", 3)
        spool.set_partition_count("other", 1)
    data = json.loads((tmp_path / "partitions.json").read_text())
    assert data["topics"] == {"cached": 3, "other": 1}
    with Spool(tmp_path, settings=SMALL) as spool:
        sent = _mixed_events(spool, "cached", 30)
        assert not (tmp_path / "topics" / "cached" / "pending.queue").exists()
        _check_partitioned(stored(spool, "cached"), sent, 3)


def test_growing_the_partition_count(tmp_path: Path) -> None:
    """Counts only grow, as in Kafka; events already queued stay where they are."""
    with Spool(tmp_path, settings=SMALL) as spool:
        spool.set_partition_count("grow", 2)
        before = {spool.send("grow", b"v", b"key-%d" % i): b"key-%d" % i for i in range(20)}
        spool.set_partition_count("grow", 5)
        spool.set_partition_count("grow", 3)  # a stale, smaller answer is ignored
        after = {spool.send("grow", b"v", b"key-%d" % i): b"key-%d" % i for i in range(20)}
        with pytest.raises(ValueError, match="must be positive"):
            spool.set_partition_count("grow", 0)
    assert json.loads((tmp_path / "partitions.json").read_text())["topics"] == {"grow": 5}
    with Spool(tmp_path, settings=SMALL) as spool:
        events = stored(spool, "grow")
    assert None not in events
    location = {e.event_id: p for p, queued in events.items() if p is not None for e in queued}
    assert {location[i] for i in before} <= {0, 1}
    for event_id, key in before.items():
        assert location[event_id] == partition_for_key(key, 2)
    for event_id, key in after.items():
        assert location[event_id] == partition_for_key(key, 5)
    assert max(location.values()) > 1, "the new partitions were never used"


# ---- full queues -----------------------------------------------------------------------


def _fill(spool: Spool, topic: str, value_size: int = 900) -> list[str]:
    """Send until the queue refuses; returns the ids of what went in."""
    ids = []
    for i in range(1000):
        try:
            ids.append(spool.send(topic, b"%06d" % i + b"." * value_size))
        except SpoolFullError:
            return ids
    raise AssertionError("the queue never filled up")


def test_reject_raises_and_keeps_what_is_queued(tmp_path: Path) -> None:
    """Like librdkafka's BufferError: the caller decides, nothing queued is touched."""
    with Spool(tmp_path, settings=small(full_policy=FullPolicy.REJECT)) as spool:
        spool.set_partition_count("full", 1)
        ids = _fill(spool, "full")
        ring = ring_of(spool, "full")
        depth = ring.depth
        assert depth == len(ids) > 30
        with pytest.raises(SpoolFullError, match=r"full: .*policy reject"):
            spool.send("full", b"." * 900)
        assert ring.depth == depth
        assert stored_ids(spool, "full") == ids
        ring.ack(ring.read_batch(max_records=5)[-1].seq)
        extra = spool.send("full", b"." * 900)
        assert stored_ids(spool, "full") == [*ids[5:], extra]


def test_drop_oldest_overwrites_the_oldest_and_counts_them(tmp_path: Path) -> None:
    """For logs and metrics: the newest events stay, the drops are counted durably."""
    with Spool(tmp_path, settings=small(full_policy=FullPolicy.DROP_OLDEST)) as spool:
        spool.set_partition_count("logs", 1)
        ids = [spool.send("logs", b"%06d" % i + b"." * 900) for i in range(300)]
        stats = ring_of(spool, "logs").stats()
        assert 30 < stats.depth < 300
        assert stats.dropped == 300 - stats.depth
        assert stored_ids(spool, "logs") == ids[-stats.depth :]
    with Spool(tmp_path, settings=small(full_policy=FullPolicy.DROP_OLDEST)) as spool:
        assert ring_of(spool, "logs").stats().dropped == stats.dropped
        assert stored_ids(spool, "logs") == ids[-stats.depth :]


def _filled_spool(tmp_path: Path, **queue: Any) -> tuple[Spool, list[str]]:
    """A spool whose only ring is full, reopened with the given queue settings."""
    with Spool(tmp_path, settings=small(full_policy=FullPolicy.REJECT)) as spool:
        spool.set_partition_count("full", 1)
        ids = _fill(spool, "full", value_size=940)  # 1000-byte envelopes, 1032-byte frames
    return Spool(tmp_path, settings=small(**queue)), ids


def test_block_waits_then_raises_after_block_timeout(tmp_path: Path) -> None:
    """With nobody freeing space, `block` gives up after block_timeout_s, not before."""
    spool, ids = _filled_spool(tmp_path, full_policy=FullPolicy.BLOCK, block_timeout_s=0.3)
    with spool:
        started = time.monotonic()
        with pytest.raises(SpoolFullError, match="policy block"):
            spool.send("full", b"." * 900)
        waited = time.monotonic() - started
        assert 0.29 <= waited < 5
        assert stored_ids(spool, "full") == ids


def test_block_succeeds_when_another_thread_acks_in_time(tmp_path: Path) -> None:
    """The sender thread frees space; the blocked send then goes through, in order."""
    spool, ids = _filled_spool(tmp_path, full_policy=FullPolicy.BLOCK, block_timeout_s=10)
    with spool:
        ring = ring_of(spool, "full")

        def ack_later() -> None:
            time.sleep(0.2)
            ring.ack(ring.read_batch(max_records=3)[-1].seq)

        acker = threading.Thread(target=ack_later)
        started = time.monotonic()
        acker.start()
        event_id = spool.send("full", b"." * 900)
        waited = time.monotonic() - started
        acker.join()
        assert 0.15 <= waited < 5
        assert stored_ids(spool, "full") == [*ids[3:], event_id]


def test_block_with_a_second_writer_keeps_every_sent_event(tmp_path: Path) -> None:
    """A writer blocked at the wrap point, another appending meanwhile: both must be kept."""
    # 63 events of 1032-byte frames leave 520 bytes before the end of the 64 KiB area:
    # too little for a big event (it must wrap and needs space), enough for a small one.
    spool, ids = _filled_spool(tmp_path, full_policy=FullPolicy.BLOCK, block_timeout_s=10)
    with spool:
        ring = ring_of(spool, "full")
        assert ring.write_core.tail == 63 * 1032
        results: list[str] = []
        blocked = threading.Thread(
            target=lambda: results.append(spool.send("full", b"B" * 946)), daemon=True
        )
        blocked.start()
        time.sleep(0.5)  # the big send is now waiting for space
        small_id = spool.send("full", b"s" * 100)
        ring.ack(ring.read_batch(max_records=10)[-1].seq)
        blocked.join(10)
        assert len(results) == 1
        assert stored_ids(spool, "full") == [*ids[10:], small_id, results[0]]
    with Spool(tmp_path, settings=small()) as reopened:
        assert reopened.recovery_reports() == {}
        assert stored_ids(reopened, "full") == [*ids[10:], small_id, results[0]]


# ---- durability ------------------------------------------------------------------------


def test_fsync_durability_syncs_every_send(tmp_path: Path) -> None:
    """With `fsync`, send() returns only after an fdatasync that covers its event."""
    with Spool(tmp_path, settings=small(durability=Durability.FSYNC)) as spool:
        spool.set_partition_count("durable", 1)
        ids = []
        for i in range(5):
            ids.append(spool.send("durable", b"%d" % i))
            # Counted after os.fdatasync returned: this send's sync is done, not pending.
            assert ring_of(spool, "durable").syncs == i + 1
    with Spool(tmp_path, settings=small()) as spool:
        assert stored_ids(spool, "durable") == ids


def test_fsync_durability_shares_syncs_between_threads(tmp_path: Path) -> None:
    """Group commit: writers arriving during a sync share the next one."""
    threads, per_thread = 8, 25
    barrier = threading.Barrier(threads)
    with Spool(tmp_path, settings=small(durability=Durability.FSYNC)) as spool:
        spool.set_partition_count("durable", 1)
        sent: list[list[str]] = [[] for _ in range(threads)]

        def worker(n: int) -> Callable[[], None]:
            def run() -> None:
                barrier.wait()
                for i in range(per_thread):
                    sent[n].append(spool.send("durable", b"%d-%d" % (n, i)))

            return run

        workers = [threading.Thread(target=worker(n)) for n in range(threads)]
        for thread in workers:
            thread.start()
        for thread in workers:
            thread.join()
        syncs = ring_of(spool, "durable").syncs
    total = threads * per_thread
    assert 1 <= syncs < total
    with Spool(tmp_path, settings=small()) as spool:
        queued = stored_ids(spool, "durable")
    assert sorted(queued) == sorted(i for ids in sent for i in ids)
    for ids in sent:  # each thread's events are in its own order
        positions = [queued.index(i) for i in ids]
        assert positions == sorted(positions)


def test_keyless_events_avoid_partitions_without_a_leader(tmp_path: Path) -> None:
    """The sender reports which partitions have a leader; sticky choice stays among them."""
    with Spool(tmp_path, settings=SMALL) as spool:
        spool.set_partition_count("keyless", 4)
        spool._registry.set_available_partitions("keyless", frozenset({1, 3}))
        for _ in range(400):
            spool.send("keyless", b"v" * 200)
        used = {ref.partition for ref in spool.queues() if ref.ring.depth}
    assert used == {1, 3}
