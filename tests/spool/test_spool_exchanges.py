"""`Spool.send(exchange=...)`: one event, one event_id, written to every target or to none.

Events are read back from the rings, so a test passes only if what `send()` promised
(or refused) is really what is on disk.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from eventspool.config import Durability, FullPolicy, QueueSettings, SpoolSettings
from eventspool.envelope import Event, decode
from eventspool.errors import (
    ExchangeConflictError,
    InvalidEventError,
    SpoolClosedError,
    SpoolFullError,
    UnknownExchangeError,
    UnroutableError,
)
from eventspool.pipeline import Spool
from eventspool.routing import Binding, Exchange, ExchangeCounts, ExchangeType, Source
from eventspool.spool.partitioner import partition_for_key
from eventspool.spool.segments import SegmentedQueue

SMALL_QUEUE = 64 * 1024
FANOUT = Exchange("fan", ExchangeType.FANOUT, (Binding("a"), Binding("b"), Binding("c")))
ANIMALS = Exchange(
    "animals",
    ExchangeType.TOPIC,
    (Binding("q1", "*.orange.*"), Binding("q2", "*.*.rabbit"), Binding("q2", "lazy.#")),
    alternate_topic="unroutable",
)


def settings(topics: dict[str, QueueSettings] | None = None, **queue: Any) -> SpoolSettings:
    """64 KiB rings unless told otherwise: a few dozen 1 KB events fill one."""
    return SpoolSettings(
        max_event_bytes=4096,
        queue=QueueSettings(**{"capacity_bytes": SMALL_QUEUE, **queue}),
        topics=topics or {},
    )


def stored(spool: Spool, topic: str) -> list[Event]:
    """Every queued event of `topic`, pending ones included, decoded from its rings."""
    events: list[Event] = []
    for ref in spool.queues():
        if ref.topic != topic:
            continue
        ref.ring.rewind()
        while batch := ref.ring.read_batch(max_records=100_000, max_bytes=1 << 30):
            events.extend(decode(record.payload) for record in batch)
        ref.ring.rewind()
    return events


def ring_of(spool: Spool, topic: str) -> SegmentedQueue:
    (ring,) = [ref.ring for ref in spool.queues() if ref.topic == topic]
    return ring


def test_fanout_writes_the_same_event_to_every_topic(tmp_path: Path) -> None:
    with Spool(tmp_path, settings=settings(), exchanges=[FANOUT]) as spool:
        for topic in "abc":
            spool.set_partition_count(topic, 3)
        event_id = spool.send(
            None, b"v", key="user-1", headers={"h": "x"}, exchange="fan", routing_key="r.k"
        )
        for topic in "abc":
            (event,) = stored(spool, topic)
            assert event.event_id == event_id
            assert (event.key, event.value) == (b"user-1", b"v")
            assert event.headers == [("h", b"x"), ("exchange", b"fan"), ("routing_key", b"r.k")]
            (ref,) = [r for r in spool.queues() if r.topic == topic]
            assert ref.partition == partition_for_key(b"user-1", 3)
        assert spool.exchange("fan").counts == ExchangeCounts(routed=1)


def test_a_fanout_with_the_callers_event_id_carries_it_to_every_topic(tmp_path: Path) -> None:
    chosen = "0191e2c4-7a10-7000-8a3b-5c2d1e0f4a6b"
    with Spool(tmp_path, settings=settings(), exchanges=[FANOUT]) as spool:
        for topic in "abc":
            spool.set_partition_count(topic, 3)
        for _ in range(2):  # a retry after a crash reuses the id
            assert spool.send(None, b"v", exchange="fan", event_id=chosen) == chosen
        for topic in "abc":
            assert [event.event_id for event in stored(spool, topic)] == [chosen, chosen]
        with pytest.raises(InvalidEventError, match="not a UUID"):
            spool.send(None, b"v", exchange="fan", event_id="retry-1")
        assert spool.exchange("fan").counts == ExchangeCounts(routed=2)


def test_the_tutorial_routes_to_the_right_topics_once(tmp_path: Path) -> None:
    expected = {
        "quick.orange.rabbit": {"q1", "q2"},
        "lazy.orange.elephant": {"q1", "q2"},
        "quick.orange.fox": {"q1"},
        "lazy.brown.fox": {"q2"},
        "lazy.pink.rabbit": {"q2"},
        "quick.brown.fox": {"unroutable"},
        "orange": {"unroutable"},
        "quick.orange.new.rabbit": {"unroutable"},
        "lazy.orange.new.rabbit": {"q2"},
    }
    with Spool(tmp_path, settings=settings(), exchanges=[ANIMALS]) as spool:
        ids = {
            key: spool.send(None, key.encode(), exchange="animals", routing_key=key)
            for key in expected
        }
        found: dict[str, set[str]] = {key: set() for key in expected}
        for topic in ("q1", "q2", "unroutable"):
            counts = Counter(event.event_id for event in stored(spool, topic))
            assert set(counts.values()) == {1}, f"{topic} holds an event twice"
            for key, event_id in ids.items():
                if event_id in counts:
                    found[key].add(topic)
        assert found == expected
        assert spool.exchange("animals").counts == ExchangeCounts(routed=6, alternate=3)


def test_argument_errors(tmp_path: Path) -> None:
    strict = Exchange("strict", ExchangeType.DIRECT, (Binding("t", "k"),))
    with Spool(tmp_path, settings=settings(), exchanges=[strict]) as spool:
        with pytest.raises(InvalidEventError, match="give one of them"):
            spool.send("t", b"v", exchange="strict", routing_key="k")
        with pytest.raises(UnknownExchangeError, match="'nope' is not declared"):
            spool.send(None, b"v", exchange="nope")
        with pytest.raises(UnroutableError, match="matches no binding"):
            spool.send(None, b"v", exchange="strict", routing_key="other")
        with pytest.raises(InvalidEventError, match="value for exchange 'strict' must be bytes"):
            spool.send(None, "v", exchange="strict", routing_key="unroutable")  # type: ignore[arg-type]
        with pytest.raises(InvalidEventError, match="exchange must be a str, got list"):
            spool.send(None, b"v", exchange=["strict"])  # type: ignore[arg-type]
        with pytest.raises(InvalidEventError, match="routing_key must be a str"):
            spool.send(None, b"v", exchange="strict", routing_key=b"k")  # type: ignore[arg-type]
        with pytest.raises(InvalidEventError, match="value for exchange 'strict' must be bytes"):
            spool.send(None, "v", exchange="strict", routing_key="k")  # type: ignore[arg-type]
        with pytest.raises(InvalidEventError, match="key for exchange 'strict' must be bytes"):
            spool.send(None, b"v", 5, exchange="strict", routing_key="k")  # type: ignore[arg-type]
        with pytest.raises(InvalidEventError, match="over the maximum"):
            spool.send(None, b"v" * 5000, exchange="strict", routing_key="k")
        assert spool.queues() == []
        assert spool.exchange("strict").counts == ExchangeCounts(refused=1)
    with pytest.raises(SpoolClosedError):
        spool.send(None, b"v", exchange="strict", routing_key="k")


def test_a_full_target_refuses_the_event_for_every_target(tmp_path: Path) -> None:
    """All or nothing: `b` is full under reject, so neither `a` nor `c` gets the event."""
    topics = {"b": QueueSettings(capacity_bytes=SMALL_QUEUE)}
    with Spool(
        tmp_path, settings=settings(topics, capacity_bytes=4 * SMALL_QUEUE), exchanges=[FANOUT]
    ) as spool:
        for topic in "abc":
            spool.set_partition_count(topic, 1)
        sent = []
        with pytest.raises(SpoolFullError, match=r"b/0.queue is full .* none of its 3 queues"):
            while True:
                sent.append(spool.send(None, b"." * 900, exchange="fan"))
        assert len(sent) > 30
        for topic in "abc":
            assert [event.event_id for event in stored(spool, topic)] == sent
        ring = ring_of(spool, "b")
        ring.ack(ring.read_batch(max_records=2)[-1].seq)
        again = spool.send(None, b"." * 900, exchange="fan")
        assert [e.event_id for e in stored(spool, "a")] == [*sent, again]
        assert [e.event_id for e in stored(spool, "b")] == [*sent[2:], again]
        assert spool.exchange("fan").counts == ExchangeCounts(routed=len(sent) + 1)


def test_a_blocked_target_holds_the_event_until_it_has_room(tmp_path: Path) -> None:
    big = settings(capacity_bytes=4 * SMALL_QUEUE)
    with Spool(tmp_path, settings=big) as spool:
        spool.set_partition_count("b", 1)
        with pytest.raises(SpoolFullError):
            while True:
                spool.send("b", b"." * 900)
    topics = {"b": QueueSettings(capacity_bytes=SMALL_QUEUE, full_policy=FullPolicy.BLOCK)}
    blocking = settings(topics, capacity_bytes=4 * SMALL_QUEUE)
    with Spool(tmp_path, settings=blocking, exchanges=[FANOUT]) as spool:
        ring = ring_of(spool, "b")

        def ack_later() -> None:
            time.sleep(0.3)
            ring.ack(ring.read_batch(max_records=3)[-1].seq)

        acker = threading.Thread(target=ack_later)
        acker.start()
        started = time.monotonic()
        event_id = spool.send(None, b"." * 900, exchange="fan")
        waited = time.monotonic() - started
        acker.join()
        assert 0.25 <= waited < 5
        for topic in "abc":
            assert stored(spool, topic)[-1].event_id == event_id
        assert len(stored(spool, "a")) == 1


def test_a_blocked_target_that_stays_full_refuses_after_its_timeout(tmp_path: Path) -> None:
    topics = {"b": QueueSettings(capacity_bytes=SMALL_QUEUE)}
    with Spool(tmp_path, settings=settings(topics, capacity_bytes=4 * SMALL_QUEUE)) as spool:
        spool.set_partition_count("b", 1)
        with pytest.raises(SpoolFullError):
            while True:
                spool.send("b", b"." * 900)
    topics = {
        "b": QueueSettings(
            capacity_bytes=SMALL_QUEUE, full_policy=FullPolicy.BLOCK, block_timeout_s=0.3
        )
    }
    with Spool(tmp_path, settings=settings(topics), exchanges=[FANOUT]) as spool:
        started = time.monotonic()
        with pytest.raises(SpoolFullError, match="policy block"):
            spool.send(None, b"." * 900, exchange="fan")
        assert 0.29 <= time.monotonic() - started < 5
        assert stored(spool, "a") == stored(spool, "c") == []


def test_drop_oldest_targets_always_take_the_event(tmp_path: Path) -> None:
    with Spool(
        tmp_path, settings=settings(full_policy=FullPolicy.DROP_OLDEST), exchanges=[FANOUT]
    ) as spool:
        for topic in "ab":
            spool.set_partition_count(topic, 1)
        ids = [spool.send(None, b"." * 900, exchange="fan") for _ in range(200)]
        for topic in "abc":
            kept = [event.event_id for event in stored(spool, topic)]
            assert 30 < len(kept) < 200
            assert kept == ids[-len(kept) :]


def test_pending_and_partitioned_targets_together(tmp_path: Path) -> None:
    """`c` has no partition count yet: its copy waits in the pending ring and moves later."""
    with Spool(tmp_path, settings=settings(), exchanges=[FANOUT]) as spool:
        spool.set_partition_count("a", 2)
        spool.set_partition_count("b", 1)
        ids = [spool.send(None, b"%d" % i, key=b"k%d" % i, exchange="fan") for i in range(20)]
        assert {ref.partition for ref in spool.queues() if ref.topic == "c"} == {None}
        spool.set_partition_count("c", 4)
        for topic in "abc":
            assert sorted(e.event_id for e in stored(spool, topic)) == sorted(ids)


def test_concurrent_fanouts_over_overlapping_topics_neither_deadlock_nor_lose(
    tmp_path: Path,
) -> None:
    exchanges = [
        Exchange("ab", ExchangeType.FANOUT, (Binding("a"), Binding("b"))),
        Exchange("bc", ExchangeType.FANOUT, (Binding("c"), Binding("b"))),
        Exchange("ca", ExchangeType.FANOUT, (Binding("a"), Binding("c"))),
    ]
    per_thread = 300
    with Spool(
        tmp_path, settings=settings(capacity_bytes=16 * SMALL_QUEUE), exchanges=exchanges
    ) as spool:
        spool.set_partition_count("a", 2)
        spool.set_partition_count("b", 3)
        sent: dict[str, list[str]] = {}

        def publish(name: str, keyed: bool) -> None:
            sent[f"{name}-{keyed}"] = [
                spool.send(None, b"x" * 50, key=b"k%d" % i if keyed else None, exchange=name)
                for i in range(per_thread)
            ]

        threads = [
            threading.Thread(target=publish, args=(e.name, keyed))
            for e in exchanges
            for keyed in (True, False)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert not any(thread.is_alive() for thread in threads), "deadlock"
        spool.set_partition_count("c", 2)
        expected = {
            "a": sent["ab-True"] + sent["ab-False"] + sent["ca-True"] + sent["ca-False"],
            "b": sent["ab-True"] + sent["ab-False"] + sent["bc-True"] + sent["bc-False"],
            "c": sent["bc-True"] + sent["bc-False"] + sent["ca-True"] + sent["ca-False"],
        }
        for topic, ids in expected.items():
            assert sorted(e.event_id for e in stored(spool, topic)) == sorted(ids)


def test_fsync_targets_are_synced_before_the_send_returns(tmp_path: Path) -> None:
    topics = {"b": QueueSettings(capacity_bytes=SMALL_QUEUE, durability=Durability.FSYNC)}
    with Spool(tmp_path, settings=settings(topics), exchanges=[FANOUT]) as spool:
        spool.set_partition_count("b", 1)
        spool.send(None, b"v", exchange="fan")
        assert ring_of(spool, "b").syncs == 1


def test_runtime_declarations_survive_reopening_the_spool(tmp_path: Path) -> None:
    runtime = Exchange("rt", ExchangeType.DIRECT, (Binding("t", "k"),))
    with Spool(tmp_path, settings=settings(), exchanges=[FANOUT]) as spool:
        assert spool.declare_exchange(runtime) is True
        with pytest.raises(ExchangeConflictError):
            spool.declare_exchange(Exchange("fan", ExchangeType.DIRECT))
        first = spool.send(None, b"v", exchange="rt", routing_key="k")
    with Spool(tmp_path, settings=settings()) as spool:
        assert [(i.exchange, i.source) for i in spool.exchanges()] == [(runtime, Source.RUNTIME)]
        second = spool.send(None, b"v", exchange="rt", routing_key="k")
        assert [e.event_id for e in stored(spool, "t")] == [first, second]
        assert spool.exchange_counts() == {"rt": ExchangeCounts(routed=1)}
        spool.delete_exchange("rt")
        with pytest.raises(UnknownExchangeError):
            spool.send(None, b"v", exchange="rt", routing_key="k")
