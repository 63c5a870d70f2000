"""Which partitions keyless events should avoid, from every sign the sender has, in seconds.

Three signs make a partition unavailable, each enough on its own:
  - its leader is -1 in metadata (no leader elected);
  - librdkafka reports the connection to its leader's broker down (statistics);
  - its queue's oldest in-flight event has waited past a threshold (the broker took the
    request and never answered, or librdkafka cannot reach it and has not said so yet).

The sticky partitioner skips unavailable partitions until they recover; a partition
unavailable for longer than `keyless_failover_s` has its queued keyless events moved
(failover.py). Keyed events never move: their partition is their order.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from eventspool.clock import Clock

TopicPartitionKey = tuple[str, int]

# librdkafka's broker states with no working connection (rdkafka_broker.h). INIT is a
# broker never needed yet, and the states between CONNECT and UP pass in milliseconds.
_DOWN_STATES = frozenset({"DOWN", "TRY_CONNECT", "CONNECT"})


@dataclass(frozen=True, slots=True)
class ClusterView:
    """What one librdkafka statistics report says of the cluster, and the produce
    requests sent so far."""

    down_brokers: frozenset[int]
    leaders: Mapping[str, Mapping[int, int]]
    produce_requests: int


def parse_statistics(text: str) -> ClusterView:
    """The brokers without a connection, and each partition's leader, from librdkafka's
    statistics JSON (STATISTICS.md); bootstrap entries (node id -1) are not brokers."""
    report = json.loads(text)
    brokers = report.get("brokers", {}).values()
    down = frozenset(
        int(broker["nodeid"])
        for broker in brokers
        if int(broker.get("nodeid", -1)) >= 0 and broker.get("state") in _DOWN_STATES
    )
    requests = sum(int(broker.get("req", {}).get("Produce", 0)) for broker in brokers)
    leaders = {
        name: {
            int(partition): int(info.get("leader", -1))
            for partition, info in topic.get("partitions", {}).items()
            if int(partition) >= 0
        }
        for name, topic in report.get("topics", {}).items()
    }
    return ClusterView(down, leaders, requests)


class PartitionHealth:
    """Unavailable partitions per topic, and since when each has been unavailable."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._leaders: dict[str, dict[int, int]] = {}
        self._down_brokers: frozenset[int] = frozenset()
        self._stuck: frozenset[TopicPartitionKey] = frozenset()
        self._since: dict[TopicPartitionKey, float] = {}

    def set_leaders(self, topic: str, leaders: Mapping[int, int]) -> bool:
        """Record a topic's leaders (from metadata or statistics); True when a partition
        became unavailable."""
        self._leaders[topic] = dict(leaders)
        return self._update()

    def set_down_brokers(self, brokers: frozenset[int]) -> bool:
        self._down_brokers = brokers
        return self._update()

    def set_stuck(self, stuck: Iterable[TopicPartitionKey]) -> bool:
        """Partitions whose oldest in-flight event has waited past the threshold."""
        self._stuck = frozenset(stuck)
        return self._update()

    def _update(self) -> bool:
        now = self._clock.monotonic()
        unavailable = {
            (topic, partition)
            for topic, leaders in self._leaders.items()
            for partition, leader in leaders.items()
            if leader < 0 or leader in self._down_brokers
        }
        unavailable |= self._stuck
        newly = unavailable - self._since.keys()
        self._since = {key: self._since.get(key, now) for key in unavailable}
        return bool(newly)

    def unavailable(self, topic: str) -> frozenset[int]:
        return frozenset(partition for name, partition in self._since if name == topic)

    def available(self, topic: str, partition_count: int) -> frozenset[int]:
        """The partitions of `topic` keyless events may go to."""
        return frozenset(range(partition_count)) - self.unavailable(topic)

    def unavailable_for(self, key: TopicPartitionKey) -> float:
        """Seconds `key` has been unavailable; 0 when it is available."""
        since = self._since.get(key)
        return 0.0 if since is None else self._clock.monotonic() - since
