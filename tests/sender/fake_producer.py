"""A producer that satisfies `KafkaProducer` without a broker: it records what it is
given, answers metadata from a prepared cluster, and reports deliveries when told."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from eventspool.sender.producer import DeliveryReport, KafkaHeaders


@dataclass
class Produced:
    topic: str
    value: bytes | None
    key: bytes | None
    partition: int
    report: DeliveryReport
    timestamp: int
    headers: KafkaHeaders | None


@dataclass
class PartitionInfo:
    id: int
    leader: int
    replicas: list[int]


@dataclass
class TopicInfo:
    partitions: dict[int, PartitionInfo]
    error: KafkaError | None = None


@dataclass
class ClusterInfo:
    topics: dict[str, TopicInfo] = field(default_factory=dict)


class FakeProducer:
    def __init__(self, cluster: ClusterInfo | None = None) -> None:
        self.cluster = cluster  # None: no broker answers metadata
        self.produced: list[Produced] = []
        self.metadata_timeouts: list[float] = []
        self.full_after: int | None = None  # produce() raises BufferError past this many

    def produce(  # noqa: PLR0917  # KafkaProducer's signature
        self,
        topic: str,
        value: bytes | None = None,
        key: bytes | None = None,
        partition: int = -1,
        callback: DeliveryReport | None = None,
        on_delivery: DeliveryReport | None = None,
        timestamp: int = 0,
        headers: KafkaHeaders | None = None,
    ) -> None:
        if self.full_after is not None and len(self.produced) >= self.full_after:
            raise BufferError("queue full")
        report = callback or on_delivery
        assert report is not None
        self.produced.append(Produced(topic, value, key, partition, report, timestamp, headers))

    def poll(self, timeout: float = -1) -> int:
        return 0

    def purge(self, in_queue: bool = True, in_flight: bool = True, blocking: bool = True) -> None:
        self.produced.clear()

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any:
        self.metadata_timeouts.append(timeout)
        if self.cluster is None:
            raise KafkaException(KafkaError(KafkaError._TRANSPORT, "no broker"))
        return self.cluster
