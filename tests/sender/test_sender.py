"""The sender against the real embedded broker: delivery, order, growth, dead letters."""

from __future__ import annotations

import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from eventspool import InvalidEventError, Spool, SpoolSettings
from eventspool.broker import LocalBroker, create_topic, find_free_port
from eventspool.config import SenderSettings
from eventspool.verify import consume_event_ids, ledger

Row = tuple[int, int, bytes | None, str]


def read_all(bootstrap: str, topic: str, expected: int, timeout: float = 60) -> list[Row]:
    """Every record of `topic` as (partition, offset, key, event_id), in partition order."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex, "enable.auto.commit": False}
    )
    rows: list[Row] = []
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        deadline = time.monotonic() + timeout
        while len(rows) < expected and time.monotonic() < deadline:
            for message in consumer.consume(10_000, 0.5):
                if message.error():
                    continue
                event_id = dict(message.headers() or [])["event_id"]
                assert isinstance(event_id, bytes)
                rows.append(
                    (
                        message.partition() or 0,
                        message.offset() or 0,
                        message.key(),
                        event_id.decode(),
                    )
                )
    finally:
        consumer.close()
    return sorted(rows)


# Hundreds of librdkafka batches per partition: enough to mix retries and batch edges.
_KEYED_EVENTS = 60_000


@pytest.mark.slow
def test_60k_keyed_events_arrive_once_each_in_key_order(
    broker: LocalBroker, topic_factory: Callable[[int], str], tmp_path: Path
) -> None:
    topics = [topic_factory(4) for _ in range(3)]
    sent_by_key: dict[tuple[str, bytes], list[str]] = defaultdict(list)
    with Spool(tmp_path, broker.bootstrap_servers) as spool:
        for i in range(_KEYED_EVENTS):
            topic = topics[i % 3]
            key = f"user-{i % 997}".encode()
            sent_by_key[(topic, key)].append(spool.send(topic, b"v" * 100, key=key))
        assert spool.flush(120) == 0
    for topic in topics:
        rows = read_all(broker.bootstrap_servers, topic, expected=_KEYED_EVENTS // 3)
        got_by_key: dict[bytes, list[str]] = defaultdict(list)
        for _, _, row_key, event_id in rows:
            assert row_key is not None
            got_by_key[row_key].append(event_id)
        sent = {k: ids for (t, k), ids in sent_by_key.items() if t == topic}
        assert got_by_key == sent, f"{topic}: consumed events differ from sent, or out of order"
        assert {p for p, _, _, _ in rows} == {0, 1, 2, 3}


def test_close_keeps_unsent_events_and_reopening_delivers_them(
    broker: LocalBroker, topic_factory: Callable[[int], str], tmp_path: Path
) -> None:
    topic = topic_factory(2)
    unreachable = f"127.0.0.1:{find_free_port()}"
    spool = Spool(tmp_path, unreachable)
    spool.set_partition_count(topic, 2)
    ids = [spool.send(topic, f"event {i}".encode(), key=f"k{i}") for i in range(500)]
    assert spool.flush(0.5) == 500
    spool.close(timeout=0.5)
    with Spool(tmp_path, broker.bootstrap_servers) as spool:
        assert spool.flush(30) == 0
        assert spool.unacknowledged() == 0
    result = ledger(ids, consume_event_ids(broker.bootstrap_servers, [topic], ids, timeout=30))
    assert result.lost == 0
    assert result.duplicated == 0


def test_unknown_topic_is_created_on_first_use(broker: LocalBroker, tmp_path: Path) -> None:
    topic = f"created-on-use-{uuid.uuid4().hex[:8]}"
    settings = SenderSettings(new_topic_partitions=3)
    with Spool(tmp_path, broker.bootstrap_servers, sender_settings=settings) as spool:
        ids = [spool.send(topic, b"x", key=f"k{i}") for i in range(300)]
        assert spool.flush(30) == 0
        assert spool.queues()[0].partition is not None
    seen = consume_event_ids(broker.bootstrap_servers, [topic], ids, timeout=30)
    assert ledger(ids, seen).lost == 0
    rows = read_all(broker.bootstrap_servers, topic, expected=300)
    assert {p for p, _, _, _ in rows} == {0, 1, 2}


def test_keyless_traffic_reaches_partitions_added_while_running(
    broker: LocalBroker, tmp_path: Path
) -> None:
    """Tansu lacks CreatePartitions, so the topic is recreated larger; Kafka would grow it."""
    topic = f"growing-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap_servers, topic, 2)
    settings = SenderSettings(metadata_refresh_s=0.5, create_topics=False)
    with Spool(tmp_path, broker.bootstrap_servers, sender_settings=settings) as spool:
        for _ in range(200):
            spool.send(topic, b"x" * 200)
        assert spool.flush(30) == 0
        admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
        admin.delete_topics([topic])[topic].result(10)
        create_topic(broker.bootstrap_servers, topic, 4)
        deadline = time.monotonic() + 10
        while len(spool.queues()) < 4 and time.monotonic() < deadline:
            spool.send(topic, b"y" * 200)
            time.sleep(0.005)
        assert spool.flush(30) == 0
        assert {ref.partition for ref in spool.queues()} == {0, 1, 2, 3}
    rows = read_all(broker.bootstrap_servers, topic, expected=1)
    assert {p for p, _, _, _ in rows} >= {2, 3}


def test_event_too_large_for_the_broker_is_dead_lettered_and_others_flow(
    broker: LocalBroker, topic_factory: Callable[[int], str], tmp_path: Path
) -> None:
    topic = topic_factory(1)
    settings = SenderSettings(kafka={"message.max.bytes": 20_000})
    with Spool(tmp_path, broker.bootstrap_servers, sender_settings=settings) as spool:
        before = spool.send(topic, b"small", key="a")
        big = spool.send(topic, b"B" * 50_000, key="a")
        after = spool.send(topic, b"small again", key="a")
        assert spool.flush(30) == 0
        assert spool.sender is not None
        letters = spool.sender.dead_letters.read()
    assert [letter["event_id"] for letter in letters] == [big]
    assert (
        "size" in str(letters[0]["reason"]).lower() or "large" in str(letters[0]["reason"]).lower()
    )
    seen = consume_event_ids(broker.bootstrap_servers, [topic], [before, after], timeout=30)
    assert ledger([before, after], seen).lost == 0
    assert big not in seen


def test_event_over_the_spool_limit_fails_at_send(broker: LocalBroker, tmp_path: Path) -> None:
    settings = SpoolSettings(max_event_bytes=1000)
    with Spool(tmp_path, broker.bootstrap_servers, settings=settings) as spool:
        with pytest.raises(InvalidEventError, match="over the maximum of 1000"):
            spool.send("anything", b"z" * 2000)
        with pytest.raises(InvalidEventError, match="contains"):
            spool.send("bad topic!", b"z")


def test_close_does_not_wait_for_brokers_that_do_not_answer(tmp_path: Path) -> None:
    """Nothing listens at the bootstrap address: once the sender has seen that, close()
    keeps the events for the next open instead of waiting out its timeout."""
    nobody = f"127.0.0.1:{find_free_port()}"
    spool = Spool(tmp_path, nobody)
    for i in range(10):
        spool.send("orders", b"kept %d" % i)
    assert spool.sender is not None
    deadline = time.monotonic() + 15
    while not spool.sender.unreachable and time.monotonic() < deadline:
        time.sleep(0.05)
    started = time.monotonic()
    spool.close(timeout=10)
    assert time.monotonic() - started < 5
    with Spool(tmp_path) as reopened:
        assert reopened.unacknowledged() == 10
