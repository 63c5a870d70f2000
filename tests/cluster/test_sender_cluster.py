"""The sender on a 3-broker cluster (librdkafka's mock): fatal errors, lost producer state,
leaderless partitions, stalls. Every check compares event ids end to end.

The mock has no replication and no sequence checks for a non-transactional producer, so
a retried batch may be appended twice: these tests judge loss, never duplicates.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import random
import threading
import time
import uuid
from collections import Counter, defaultdict
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

from eventspool.broker.mock import ONE_REQUEST_IN_FLIGHT, ApiKey, MockCluster
from eventspool.config import SenderSettings
from eventspool.pipeline import Spool
from eventspool.spool.partitioner import partition_for_key
from eventspool.verify import header_event_id
from tests.fault.children import LineReader, run_and_kill

pytestmark = [pytest.mark.slow, pytest.mark.fault]

PARTITIONS = 6
FAST = SenderSettings(
    metadata_refresh_s=2.0,
    producer_reset_after_s=1.0,
    partition_stuck_s=2.0,
    keyless_failover_s=2.0,
    stall_after_s=2.0,
    kafka={"socket.connection.setup.timeout.ms": 3000, "reconnect.backoff.max.ms": 1000},
)
# For the tests that inject produce errors (the mock's limits: eventspool.broker.mock).
FAST_INJECTED = dataclasses.replace(FAST, kafka={**FAST.kafka, **ONE_REQUEST_IN_FLIGHT})


def _topic(cluster: MockCluster) -> str:
    name = f"orders-{uuid.uuid4().hex[:8]}"
    cluster.create_topic(name, PARTITIONS, 3)
    return name


def _read_all(
    bootstrap: str, topic: str, expected: set[str], timeout: float = 60.0
) -> dict[str, Counter[int]]:
    """event_id -> the partitions it was read from (and how often), until all expected
    ids were seen or `timeout` passed.

    librdkafka's mock keeps 5 MiB per partition and drops its oldest batches beyond that,
    so a run whose producer resets resent much more than usual can outgrow it. Events
    missing for that reason are said to be, not reported as lost.
    """
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"verify-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 100,
        }
    )
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
    seen: dict[str, Counter[int]] = defaultdict(Counter)
    deadline = time.monotonic() + timeout
    try:
        while not expected <= seen.keys() and time.monotonic() < deadline:
            for message in consumer.consume(10_000, 0.2):
                if message.error() is None and (event_id := header_event_id(message)):
                    seen[event_id][message.partition() or 0] += 1
        if not expected <= seen.keys():
            starts = {
                p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[0]
                for p in range(PARTITIONS)
            }
            trimmed = {p: start for p, start in starts.items() if start > 0}
            assert not trimmed, f"the mock dropped the oldest batches (log starts {trimmed})"
    finally:
        consumer.close()
    return seen


def _assert_each_key_in_one_partition(
    sent: dict[str, bytes | None], seen: dict[str, Counter[int]]
) -> None:
    partition_of_key: dict[bytes | None, set[int]] = defaultdict(set)
    for event_id, key in sent.items():
        partition_of_key[key].update(seen[event_id])
    assert all(len(partitions) == 1 for partitions in partition_of_key.values())


def _send(spool: Spool, topic: str, count: int, *, keyed: bool) -> dict[str, bytes | None]:
    """Send `count` events; returns event_id -> key."""
    sent: dict[str, bytes | None] = {}
    for i in range(count):
        key = f"user-{i % 97}".encode() if keyed else None
        sent[spool.send(topic, b"x" * 100, key=key)] = key
    return sent


def test_a_fatal_producer_error_gets_a_new_producer_and_loses_nothing(
    cluster: MockCluster, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    topic = _topic(cluster)
    with Spool(
        tmp_path / "spool", cluster.bootstrap_servers, sender_settings=FAST_INJECTED
    ) as spool:
        sent = _send(spool, topic, 5_000, keyed=True)
        assert spool.flush(30) == 0
        cluster.push_request_errors(ApiKey.PRODUCE, [KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER])
        with caplog.at_level(logging.ERROR, logger="eventspool.sender.sender"):
            sent |= _send(spool, topic, 20_000, keyed=True)
            assert spool.flush(30) == 0
        assert spool.sender is not None
        # One reset for the fatal error; on a loaded machine FAST's 1 s no-ack rule may
        # add one more, which is that rule working, not a second fatal error.
        assert spool.sender.counters.producer_resets >= 1
        # Counted by how the message starts: the no-ack rule's message quotes the last
        # error, which is then this one.
        fatal = [r for r in caplog.records if r.getMessage().startswith("sender: fatal producer")]
        assert len(fatal) == 1
        sent |= _send(spool, topic, 1_000, keyed=True)
        assert spool.flush(30) == 0
    seen = _read_all(cluster.bootstrap_servers, topic, set(sent))
    assert set(sent) <= seen.keys()
    _assert_each_key_in_one_partition(sent, seen)


def test_produce_that_keeps_failing_on_producer_state_gets_a_new_producer(
    cluster: MockCluster, tmp_path: Path
) -> None:
    """A broker that lost its state answers PRODUCER_FENCED to every produce of the
    producer it no longer knows; the same producer would retry for ever. The mock fences
    whichever producer asks, so the errors injected last a few seconds, past
    `producer_reset_after_s` (1 s here), not for ever."""
    topic = _topic(cluster)
    with Spool(
        tmp_path / "spool", cluster.bootstrap_servers, sender_settings=FAST_INJECTED
    ) as spool:
        sent = _send(spool, topic, 1_000, keyed=True)
        assert spool.flush(30) == 0
        cluster.push_request_errors(ApiKey.PRODUCE, [KafkaError.PRODUCER_FENCED] * 40)
        sent |= _send(spool, topic, 5_000, keyed=True)
        assert spool.flush(30) == 0
        assert spool.sender is not None
        assert spool.sender.counters.producer_resets >= 1
    seen = _read_all(cluster.bootstrap_servers, topic, set(sent))
    assert set(sent) <= seen.keys()


def test_keyless_events_leave_partitions_without_a_leader_and_keyed_ones_wait(
    cluster: MockCluster, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Broker 3 goes down and its partitions lose their leader: keyless events already
    queued there move to live partitions, new ones avoid them, keyed ones wait on disk
    and arrive once the leader is back."""
    topic = _topic(cluster)
    for partition in range(PARTITIONS):
        cluster.set_leader(topic, partition, partition % 3 + 1)
    dead = [p for p in range(PARTITIONS) if p % 3 + 1 == 3]
    with Spool(tmp_path / "spool", cluster.bootstrap_servers, sender_settings=FAST) as spool:
        sent = _send(spool, topic, 2_000, keyed=False)
        assert spool.flush(30) == 0
        cluster.broker_down(3)
        for partition in dead:
            cluster.set_leader(topic, partition, None)
        stop = threading.Event()
        keyless: dict[str, bytes | None] = {}

        def keep_sending() -> None:
            while not stop.is_set():
                keyless.update(_send(spool, topic, 200, keyed=False))
                time.sleep(0.01)

        sender = threading.Thread(target=keep_sending)
        with caplog.at_level(logging.WARNING, logger="eventspool.sender.failover"):
            sender.start()
            time.sleep(6)
            keyed = _send(spool, topic, 600, keyed=True)
            time.sleep(1)
            stop.set()
            sender.join()
            # Every keyless event is acknowledged while the two partitions have no leader.
            rings = {ref.partition: ref.ring for ref in spool.queues()}
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                waiting = sum(rings[p].depth for p in range(PARTITIONS))
                dead_depth = sum(rings[p].depth for p in dead)
                if waiting == dead_depth:
                    break
                time.sleep(0.2)
            assert sum(rings[p].depth for p in range(PARTITIONS) if p not in dead) == 0
            assert 0 < sum(rings[p].depth for p in dead) <= len(keyed)
        assert "keyless events" in caplog.text
        assert spool.sender is not None
        assert spool.sender.counters.failover_moved > 0
        assert {q.partition for q in spool.sender.stalled_queues()} <= set(dead)
        cluster.broker_up(3)
        for partition in dead:
            cluster.set_leader(topic, partition, 3)
        assert spool.flush(30) == 0
        assert spool.sender.stalled_queues() == []
    sent |= keyless | keyed
    seen = _read_all(cluster.bootstrap_servers, topic, set(sent))
    assert set(sent) <= seen.keys()
    moved_late = [e for e in keyless if set(seen[e]) & set(dead)]
    assert len(moved_late) < len(keyless) / 2


def test_a_queue_that_cannot_advance_is_reported_stalled_and_recovers(
    cluster: MockCluster, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    topic = _topic(cluster)
    cluster.set_leader(topic, 0, None)
    key = next(k for i in range(1000) if partition_for_key(k := f"k{i}".encode(), PARTITIONS) == 0)
    with Spool(tmp_path / "spool", cluster.bootstrap_servers, sender_settings=FAST) as spool:
        with caplog.at_level(logging.ERROR, logger="eventspool.sender.sender"):
            event_id = spool.send(topic, b"x", key=key)
            assert spool.flush(5) == 1
            deadline = time.monotonic() + 10
            assert spool.sender is not None
            while not spool.sender.stalled_queues() and time.monotonic() < deadline:
                time.sleep(0.2)
            (stalled,) = spool.sender.stalled_queues()
        assert (stalled.topic, stalled.partition, stalled.depth) == (topic, 0, 1)
        assert "has not advanced" in caplog.text
        cluster.set_leader(topic, 0, 1)
        assert spool.flush(30) == 0
        time.sleep(1)
        assert spool.sender.stalled_queues() == []
    assert event_id in _read_all(cluster.bootstrap_servers, topic, {event_id})


def test_a_broker_added_and_given_the_leaders_is_learnt_from_metadata(
    cluster: MockCluster, tmp_path: Path
) -> None:
    topic = _topic(cluster)
    with Spool(tmp_path / "spool", cluster.bootstrap_servers, sender_settings=FAST) as spool:
        sent = _send(spool, topic, 3_000, keyed=True)
        assert spool.flush(30) == 0
        cluster.add_broker(4)
        for partition in range(PARTITIONS):
            cluster.set_leader(topic, partition, 4)
        sent |= _send(spool, topic, 3_000, keyed=True)
        assert spool.flush(30) == 0
    seen = _read_all(cluster.bootstrap_servers, topic, set(sent))
    assert set(sent) <= seen.keys()


def test_a_slow_broker_delays_but_loses_nothing(cluster: MockCluster, tmp_path: Path) -> None:
    """500 ms for every answer of broker 2, on the default settings: no new producer."""
    topic = _topic(cluster)
    cluster.set_rtt(2, 500)
    with Spool(tmp_path / "spool", cluster.bootstrap_servers) as spool:
        sent = _send(spool, topic, 3_000, keyed=True)
        assert spool.flush(30) == 0
        assert spool.sender is not None
        assert spool.sender.counters.producer_resets == 0
    seen = _read_all(cluster.bootstrap_servers, topic, set(sent))
    assert set(sent) <= seen.keys()


KILLS = 4


def test_a_sigkill_in_the_middle_of_a_leader_move_loses_nothing(
    cluster: MockCluster, tmp_path: Path
) -> None:
    """The sending process dies while leaders move; each restart drains what it left."""
    topic = _topic(cluster)
    rng = random.Random()
    directory = tmp_path / "spool"
    reported: list[str] = []

    def move_leaders_then_wait(reader: LineReader, _: object) -> None:
        time.sleep(rng.uniform(0.2, 0.6))
        for partition in range(PARTITIONS):
            cluster.set_leader(topic, partition, rng.randint(1, 3))
        time.sleep(rng.uniform(0.0, 0.3))

    for _ in range(KILLS):
        args = [os.fspath(directory), cluster.bootstrap_servers, topic, str(PARTITIONS)]
        args += ["2000", "5000", str(rng.getrandbits(32))]
        report = run_and_kill("tests.fault.sender_child", args, until=move_leaders_then_wait)
        reported.extend(line.event_id for line in report.acknowledged)
    assert reported
    with Spool(directory, cluster.bootstrap_servers, sender_settings=FAST) as spool:
        assert spool.flush(30) == 0
    seen = _read_all(cluster.bootstrap_servers, topic, set(reported))
    missing = set(reported) - seen.keys()
    assert not missing, f"{len(missing)} of {len(reported)} acknowledged events lost"


def test_keyed_events_survive_leader_moves_a_broker_loss_and_injected_errors(
    cluster: MockCluster, tmp_path: Path
) -> None:
    """The first row of the cluster report: 60,000 keyed events while every leader moves,
    a broker is down for 5 s with its leaders re-elected, and produce requests are
    answered NOT_LEADER_OR_FOLLOWER, NOT_ENOUGH_REPLICAS and REQUEST_TIMED_OUT."""
    topic = _topic(cluster)
    sent: dict[str, bytes | None] = {}
    with Spool(
        tmp_path / "spool", cluster.bootstrap_servers, sender_settings=FAST_INJECTED
    ) as spool:
        sent |= _send(spool, topic, 15_000, keyed=True)
        for partition in range(PARTITIONS):
            cluster.set_leader(topic, partition, (partition + 1) % 3 + 1)
        cluster.push_request_errors(
            ApiKey.PRODUCE,
            [
                KafkaError.NOT_LEADER_FOR_PARTITION,
                KafkaError.NOT_ENOUGH_REPLICAS,
                KafkaError.REQUEST_TIMED_OUT,
            ]
            * 4,
        )
        sent |= _send(spool, topic, 15_000, keyed=True)
        cluster.broker_down(2)
        for partition in range(PARTITIONS):
            cluster.set_leader(topic, partition, 1 if partition % 2 else 3)
        sent |= _send(spool, topic, 15_000, keyed=True)
        time.sleep(5)
        cluster.broker_up(2)
        fault_cleared = time.monotonic()
        sent |= _send(spool, topic, 15_000, keyed=True)
        assert spool.flush(30) == 0
        assert time.monotonic() - fault_cleared < 30
    seen = _read_all(cluster.bootstrap_servers, topic, set(sent))
    assert set(sent) <= seen.keys()
    _assert_each_key_in_one_partition(sent, seen)
