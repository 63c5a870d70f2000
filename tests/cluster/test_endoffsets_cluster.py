"""The end-offsets probe and the lookup by time on a 3-broker cluster: a leader that
moved, or a broker that answers "not leader" for a while, delays the answer and never
fails it (the Spark source's `latestOffset` and `startingTimestamp`, and the consumer's
lag, ask while leaders move)."""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Consumer, KafkaError, Producer

from eventspool.broker.mock import ApiKey, MockCluster
from eventspool.endoffsets import offsets_for_time, probe_config, true_end_offsets

PARTITIONS = 3


def _filled(cluster: MockCluster, per_partition: int) -> str:
    topic = f"ends-{uuid.uuid4().hex[:8]}"
    cluster.create_topic(topic, PARTITIONS, 3)
    producer = Producer({"bootstrap.servers": cluster.bootstrap_servers})
    for partition in range(PARTITIONS):
        for index in range(per_partition):
            producer.produce(topic, b"%d" % index, partition=partition)
    assert producer.flush(30) == 0
    return topic


def test_ends_are_read_through_not_leader_answers(cluster: MockCluster) -> None:
    topic = _filled(cluster, 5)
    cluster.push_request_errors(
        ApiKey.LIST_OFFSETS,
        [KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE] * 2,
    )
    kafka = {"bootstrap.servers": cluster.bootstrap_servers}
    ends = true_end_offsets(kafka, [(topic, p) for p in range(PARTITIONS)], timeout=20)
    assert ends == {(topic, p): 5 for p in range(PARTITIONS)}


def test_ends_are_read_through_a_broker_handle_let_go(cluster: MockCluster) -> None:
    """A request queued on a broker handle that librdkafka destroyed, as when a broker
    goes down, fails with `_DESTROY_BROKER`; the probe asks again (the Spark source's
    `latestOffset` once failed a streaming query on it)."""
    topic = _filled(cluster, 3)
    cluster.push_request_errors(ApiKey.LIST_OFFSETS, [KafkaError._DESTROY_BROKER] * 2)
    kafka = {"bootstrap.servers": cluster.bootstrap_servers}
    ends = true_end_offsets(kafka, [(topic, p) for p in range(PARTITIONS)], timeout=20)
    assert ends == {(topic, p): 3 for p in range(PARTITIONS)}


@pytest.mark.parametrize(
    "unknown", [KafkaError._UNKNOWN_PARTITION, KafkaError.UNKNOWN_TOPIC_OR_PART]
)
def test_ends_are_read_through_a_partition_unknown_for_a_moment(
    cluster: MockCluster, unknown: int
) -> None:
    """While a broker is down and leaders move, librdkafka's metadata, or a broker that
    does not lead the partition, can miss a partition that exists; the probe asks again
    (the Spark source's `latestOffset` once failed a streaming query on the local one)."""
    topic = _filled(cluster, 2)
    cluster.push_request_errors(ApiKey.LIST_OFFSETS, [unknown] * 2)
    kafka = {"bootstrap.servers": cluster.bootstrap_servers}
    ends = true_end_offsets(kafka, [(topic, p) for p in range(PARTITIONS)], timeout=20)
    assert ends == {(topic, p): 2 for p in range(PARTITIONS)}


def test_ends_are_read_after_every_leader_moved(cluster: MockCluster) -> None:
    topic = _filled(cluster, 4)
    kafka = {"bootstrap.servers": cluster.bootstrap_servers}
    assert true_end_offsets(kafka, [(topic, 0)]) == {(topic, 0): 4}
    for partition in range(PARTITIONS):
        cluster.set_leader(topic, partition, (partition + 1) % 3 + 1)
    ends = true_end_offsets(kafka, [(topic, p) for p in range(PARTITIONS)], timeout=20)
    assert ends == {(topic, p): 4 for p in range(PARTITIONS)}


def test_offsets_for_a_time_are_read_through_not_leader_answers(cluster: MockCluster) -> None:
    """The mock looks up no real time, so the lookup asks for time -1, which Kafka reads
    as the end of the log."""
    topic = _filled(cluster, 5)
    cluster.push_request_errors(
        ApiKey.LIST_OFFSETS,
        [KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE] * 2,
    )
    consumer = Consumer(probe_config({"bootstrap.servers": cluster.bootstrap_servers}))
    try:
        wanted = [(topic, p) for p in range(PARTITIONS)]
        offsets = offsets_for_time(consumer, wanted, -1, time.monotonic() + 20)
    finally:
        consumer.close()
    assert offsets == {(topic, p): 5 for p in range(PARTITIONS)}
