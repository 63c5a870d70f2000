"""Partition counts from the bootstrap brokers, and topic creation on first use.

Any broker of the bootstrap list answers a metadata request; librdkafka keeps the
connections. Counts go to the registry, which caches them on disk, so a restarted
process accepts and partitions events while Kafka is unreachable.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

# confluent_kafka.admin re-exports these without declaring them, which mypy --strict rejects.
from confluent_kafka.admin._config import ConfigResource
from confluent_kafka.admin._resource import ResourceType
from confluent_kafka.cimpl import NewTopic

from eventspool.config import KafkaConfigValue, SenderSettings
from eventspool.sender.producer import KafkaProducer

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TopicLayout:
    partition_count: int
    leaders: Mapping[int, int]  # partition -> leader broker id, -1 for none
    replication: int  # the fewest replicas any partition has


class MetadataClient:
    def __init__(
        self,
        producer: KafkaProducer,
        admin_config: dict[str, KafkaConfigValue],
        settings: SenderSettings,
    ) -> None:
        self._producer = producer
        self._admin_config = admin_config
        self._settings = settings

    def topics(self) -> dict[str, TopicLayout] | None:
        """Every topic's partitions, or None when no broker answered in time."""
        try:
            metadata = self._producer.list_topics(timeout=self._settings.metadata_timeout_s)
        except KafkaException as exc:
            log.debug("metadata request failed: %s", exc)
            return None
        return {
            name: TopicLayout(
                len(topic.partitions),
                {p.id: p.leader for p in topic.partitions.values()},
                min(len(p.replicas) for p in topic.partitions.values()),
            )
            for name, topic in metadata.topics.items()
            if topic.error is None and topic.partitions
        }

    def topic_configs(self, names: list[str]) -> dict[str, dict[str, str] | None]:
        """Each topic's settings by DescribeConfigs; None for a topic the cluster did not
        describe (some Kafka-compatible brokers answer nothing, or time out)."""
        admin = AdminClient(self._admin_config)
        timeout = self._settings.metadata_timeout_s
        resources = [ConfigResource(ResourceType.TOPIC, name) for name in names]
        configs: dict[str, dict[str, str] | None] = {}
        for resource, future in admin.describe_configs(resources, request_timeout=timeout).items():
            try:
                entries = future.result(timeout)
            except (KafkaException, TimeoutError) as exc:
                log.debug("DescribeConfigs of %s failed: %s", resource.name, exc)
                configs[resource.name] = None
                continue
            values = {key: str(entry.value) for key, entry in entries.items()}
            configs[resource.name] = values or None
        return configs

    def create_topics(self, names: list[str]) -> None:
        """Create missing topics; one that already exists (a race with another client) is fine."""
        admin = AdminClient(self._admin_config)
        topics = [
            NewTopic(
                name,
                num_partitions=self._settings.new_topic_partitions,
                replication_factor=self._settings.new_topic_replication,
            )
            for name in names
        ]
        timeout = self._settings.metadata_timeout_s
        deadline = time.monotonic() + timeout
        for name, future in admin.create_topics(topics, request_timeout=timeout).items():
            try:
                future.result(max(0.0, deadline - time.monotonic()))
            except KafkaException as exc:
                error = exc.args[0] if exc.args else None
                if (
                    isinstance(error, KafkaError)
                    and error.code() == KafkaError.TOPIC_ALREADY_EXISTS
                ):
                    continue
                log.warning("could not create topic %r: %s", name, exc)
            except TimeoutError:
                log.warning("no answer creating topic %r within %ss", name, timeout)
