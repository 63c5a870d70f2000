"""Partition counts, leaders and replication from a metadata answer, or None when no
broker answers: against a producer that only satisfies `KafkaProducer`."""

from __future__ import annotations

from confluent_kafka import KafkaError

from eventspool.config import SenderSettings
from eventspool.sender.metadata import MetadataClient, TopicLayout
from tests.sender.fake_producer import ClusterInfo, FakeProducer, PartitionInfo, TopicInfo


def _client(producer: FakeProducer) -> MetadataClient:
    return MetadataClient(producer, {}, SenderSettings(metadata_timeout_s=1.5))


def test_no_answer_is_none_not_an_empty_cluster() -> None:
    producer = FakeProducer(cluster=None)
    assert _client(producer).topics() is None
    assert producer.metadata_timeouts == [1.5]


def test_each_topic_s_layout_comes_from_its_partitions() -> None:
    cluster = ClusterInfo(
        {
            "orders": TopicInfo(
                {
                    0: PartitionInfo(0, leader=1, replicas=[1, 2, 3]),
                    1: PartitionInfo(1, leader=-1, replicas=[2, 3]),
                }
            ),
            "broken": TopicInfo({}, error=KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)),
            "empty": TopicInfo({}),
        }
    )
    layouts = _client(FakeProducer(cluster)).topics()
    assert layouts == {"orders": TopicLayout(2, {0: 1, 1: -1}, replication=2)}
