"""The sender's librdkafka producer: its settings (their one home) and the calls made on it.

Delivery depends on three settings nobody may change: `enable.idempotence` (a retry
neither duplicates nor reorders), `acks=all` (an acknowledged event is on every in-sync
replica) and `message.timeout.ms=0` (librdkafka never gives up on an event silently).
They are applied after the user's `SenderSettings.kafka`; the agent's configuration
refuses them, and their aliases, by `FORCED_SETTINGS`. Everything else the user may
override.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from confluent_kafka import KafkaError, Message

from eventspool.config import KafkaConfigValue, SenderSettings
from eventspool.kafkalog import librdkafka_logger

# message.max.bytes is the largest event plus this much, for its envelope and framing.
ENVELOPE_OVERHEAD = 4096

DELIVERY_SETTINGS: Mapping[str, KafkaConfigValue] = {
    "enable.idempotence": True,
    "acks": "all",
    "message.timeout.ms": 0,
}
# Room for librdkafka to batch a spool's backlog before produce() raises BufferError.
QUEUE_LIMITS: Mapping[str, KafkaConfigValue] = {
    "queue.buffering.max.messages": 2_000_000,
    "queue.buffering.max.kbytes": 2_097_151,
}
# What the user's settings must not name: the delivery settings, their aliases, and the
# callbacks the sender sets itself.
FORCED_SETTINGS = frozenset(
    {
        *DELIVERY_SETTINGS,
        "request.required.acks",
        "delivery.timeout.ms",
        "error_cb",
        "on_delivery",
        "dr_cb",
        "dr_msg_cb",
        "logger",
    }
)
# librdkafka settings (with their aliases) that the producer takes from a typed value,
# by that value's name: two places for one setting would leave the reader guessing which
# one wins.
TYPED_SETTINGS: Mapping[str, str] = {
    "bootstrap.servers": "bootstrap_servers",
    "metadata.broker.list": "bootstrap_servers",
    "compression.type": "compression",
    "compression.codec": "compression",
    "linger.ms": "linger_ms",
    "queue.buffering.max.ms": "linger_ms",
    "batch.size": "batch_size",
}

KafkaHeaders = list[tuple[str, str | bytes | None]]
DeliveryReport = Callable[[KafkaError | None, Message], None]


class KafkaProducer(Protocol):
    """The calls the sender makes on a `confluent_kafka.Producer`.

    `produce` keeps the Producer's positional order: the compiled produce loop
    (Deliveries.produce_batch) passes every argument positionally.
    """

    def produce(  # noqa: PLR0917  # the Producer's own signature, called positionally
        self,
        topic: str,
        value: bytes | None = None,
        key: bytes | None = None,
        partition: int = -1,
        callback: DeliveryReport | None = None,
        on_delivery: DeliveryReport | None = None,
        timestamp: int = 0,
        headers: KafkaHeaders | None = None,
    ) -> None: ...

    def poll(self, timeout: float = -1) -> int: ...

    def purge(
        self, in_queue: bool = True, in_flight: bool = True, blocking: bool = True
    ) -> None: ...

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any: ...


@dataclass(frozen=True, slots=True)
class ProducerCallbacks:
    """How librdkafka reaches the sender: errors, statistics reports, and its log lines."""

    on_error: Callable[[KafkaError], None]
    on_statistics: Callable[[str], None]


def producer_config(
    bootstrap_servers: str,
    settings: SenderSettings,
    max_event_bytes: int,
    callbacks: ProducerCallbacks | None = None,
) -> dict[str, object]:
    """The sender's producer configuration.

    Without `callbacks` (a bench anchor's bare producer) it has no error callback, no
    statistics and librdkafka's own logging, and the same delivery and tuning settings.
    """
    statistics: dict[str, object] = {}
    if callbacks is not None and settings.statistics_interval_ms:
        statistics = {
            "statistics.interval.ms": settings.statistics_interval_ms,
            "stats_cb": callbacks.on_statistics,
        }
    hooks: dict[str, object] = {}
    if callbacks is not None:
        hooks = {"error_cb": callbacks.on_error, "logger": librdkafka_logger()}
    return {
        **statistics,
        "linger.ms": settings.linger_ms,
        "batch.size": settings.batch_size,
        "compression.type": settings.compression,
        **QUEUE_LIMITS,
        "message.max.bytes": max(1_000_000, max_event_bytes + ENVELOPE_OVERHEAD),
        **admin_config(bootstrap_servers, settings),
        **DELIVERY_SETTINGS,
        **hooks,
    }


def admin_config(bootstrap_servers: str, settings: SenderSettings) -> dict[str, KafkaConfigValue]:
    """What an admin client beside the producer needs: the brokers and the user's
    settings (security, timeouts), none of the producer's own."""
    return {"bootstrap.servers": bootstrap_servers, **settings.kafka}
