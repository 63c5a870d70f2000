"""A local Kafka-compatible broker (tansu) for development, demos and tests."""

from eventspool.broker.local import (
    BrokerError,
    BrokerState,
    LocalBroker,
    PortInUseError,
    add_partitions,
    create_topic,
    find_free_port,
    find_tansu,
    start_detached,
    status,
    stop_detached,
)

__all__ = [
    "BrokerError",
    "BrokerState",
    "LocalBroker",
    "PortInUseError",
    "add_partitions",
    "create_topic",
    "find_free_port",
    "find_tansu",
    "start_detached",
    "status",
    "stop_detached",
]
