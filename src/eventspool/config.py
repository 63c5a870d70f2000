"""Settings of a spool and of its per-topic queues, with the defaults we stand behind."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from eventspool.errors import InvalidTopicError

MIB = 1024 * 1024


class Durability(StrEnum):
    """When `send()` may return.

    `process`: the event is in the file's page cache; it survives the death of the
    process, not a power cut. `fsync`: the event was written back with fdatasync; it
    survives a power cut. Concurrent writers share one fdatasync (group commit).
    """

    PROCESS = "process"
    FSYNC = "fsync"


class FullPolicy(StrEnum):
    """What `send()` does when its queue has no room.

    `reject` raises SpoolFullError at once, like librdkafka's BufferError.
    `block` waits up to `block_timeout_s` for the sender to free space, then raises.
    `drop_oldest` overwrites the oldest unsent events and counts them: for logs and
    metrics, where the newest data matters most.
    """

    REJECT = "reject"
    BLOCK = "block"
    DROP_OLDEST = "drop_oldest"


@dataclass(frozen=True, slots=True)
class QueueSettings:
    """Settings of every queue of one topic.

    A queue is a chain of segment files of `segment_bytes` each (spool/segments.py): one
    at rest, more under a backlog, up to `capacity_bytes` of records.
    """

    capacity_bytes: int = 2048 * MIB
    segment_bytes: int = 4 * MIB
    durability: Durability = Durability.PROCESS
    full_policy: FullPolicy = FullPolicy.REJECT
    block_timeout_s: float = 5.0

    def __post_init__(self) -> None:
        for name in ("capacity_bytes", "segment_bytes"):
            if getattr(self, name) < 64 * 1024:
                raise ValueError(f"{name}={getattr(self, name)}: must be at least 65536")
        if not 0 <= self.block_timeout_s < math.inf:
            raise ValueError(
                f"block_timeout_s={self.block_timeout_s}: must be finite and not negative"
            )
        object.__setattr__(self, "durability", Durability(self.durability))
        object.__setattr__(self, "full_policy", FullPolicy(self.full_policy))


#: A spool's queue files may take this much disk by default: 128 default rings, enough
#: for a host's topics, and a bound a small host's disk survives.
DEFAULT_MAX_SPOOL_BYTES = 4 * 1024 * MIB
DEFAULT_MAX_TOPICS = 1000


@dataclass(frozen=True, slots=True)
class SpoolSettings:
    """Settings of a whole spool directory."""

    max_event_bytes: int = 1_000_000
    queue: QueueSettings = field(default_factory=QueueSettings)
    topics: Mapping[str, QueueSettings] = field(default_factory=dict)
    sticky_batch_bytes: int = 16384
    # The disk budget (spool/budget.py): bytes of queue files and topics; None: no limit.
    max_spool_bytes: int | None = DEFAULT_MAX_SPOOL_BYTES
    max_topics: int | None = DEFAULT_MAX_TOPICS

    def __post_init__(self) -> None:
        if self.max_event_bytes < 1:
            raise ValueError(f"max_event_bytes={self.max_event_bytes}: must be positive")
        if self.sticky_batch_bytes < 1:
            raise ValueError(f"sticky_batch_bytes={self.sticky_batch_bytes}: must be positive")
        for name in ("max_spool_bytes", "max_topics"):
            limit = getattr(self, name)
            if limit is not None and (isinstance(limit, bool) or limit < 1):
                raise ValueError(f"{name}={limit}: must be positive (or None for no limit)")
        for name, queue in {"default": self.queue, **self.topics}.items():
            segment = min(queue.capacity_bytes, queue.segment_bytes)
            if self.max_event_bytes > segment // 4:
                raise ValueError(
                    f"max_event_bytes={self.max_event_bytes} does not fit four times in the "
                    f"queue capacity of topic {name!r} ({segment} bytes per segment)"
                )

    def for_topic(self, topic: str) -> QueueSettings:
        return self.topics.get(topic, self.queue)


#: How long a blocking round trip's waits on the agent's socket keep trying before they
#: block, on the client's side and on the agent's (`_core/busy_poll.pxi`); 0 turns it off.
DEFAULT_BUSY_POLL_US = 50.0
MAX_BUSY_POLL_US = 10_000.0


def busy_poll_problem(microseconds: float) -> str | None:
    """What is wrong with `microseconds` as a busy_poll_us, or None."""
    if not 0 <= microseconds <= MAX_BUSY_POLL_US:
        return f"must be from 0 to {MAX_BUSY_POLL_US:g} microseconds"
    return None


def busy_poll_seconds(microseconds: float) -> float:
    """A busy_poll_us (checked) as the compiled waits take it: seconds."""
    return microseconds * 1e-6


_TOPIC_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
MAX_TOPIC_LENGTH = 249


def validate_topic(topic: object) -> str:
    """Apply Kafka's own topic-name rules, so a bad name fails at `send()`, not at the broker."""
    if not isinstance(topic, str):
        raise InvalidTopicError(f"topic must be a str, got {type(topic).__name__}")
    if not topic:
        raise InvalidTopicError("topic name is empty")
    if topic in (".", ".."):
        raise InvalidTopicError(f"topic name {topic!r} is not allowed")
    if len(topic) > MAX_TOPIC_LENGTH:
        raise InvalidTopicError(
            f"topic name is {len(topic)} characters long; Kafka allows {MAX_TOPIC_LENGTH}"
        )
    bad = sorted(set(topic) - _TOPIC_CHARS)
    if bad:
        raise InvalidTopicError(
            f"topic name {topic!r} contains {''.join(bad)!r}; "
            "Kafka allows only ASCII letters, digits, '.', '_' and '-'"
        )
    return topic


KafkaConfigValue = str | int | float | bool


@dataclass(frozen=True, slots=True)
class SenderSettings:
    """How the sender talks to Kafka.

    `kafka` is passed to librdkafka as is (security.protocol, sasl.*, ssl.*, ...), after
    our defaults, so anything here wins, except the settings that keep delivery safe.
    `statistics_interval_ms` (0: off) makes librdkafka report its statistics that often:
    the sender learns from them which brokers it cannot reach, so keyless events avoid
    their partitions within about that time, and counts the produce requests it sent.

    Nothing may wedge (docs/semantics.md):
      - `producer_reset_after_s`: no event acknowledged this long while queues of
        available partitions hold events and the brokers answer metadata (a broker that
        lost its state fences the producer, and librdkafka retries that for ever): a new
        producer takes over, as after a fatal error. Each reset that brings no
        acknowledgement doubles the wait, up to 5 minutes, so a cluster that is only slow
        does not get a new producer every few seconds.
      - `partition_stuck_s`: a queue whose oldest in-flight event waited this long makes
        its partition unavailable to keyless events.
      - `keyless_failover_s`: keyless events queued on a partition unavailable this long
        move once to an available partition of their topic (0: never).
      - `stall_after_s`: a queue holding events that has not advanced this long is
        reported stalled (log line, status, /metrics, the agent's /healthz).
    """

    compression: str = "lz4"
    linger_ms: int = 5
    batch_size: int = 1_000_000
    max_in_flight_per_queue: int = 20_000
    read_batch_records: int = 2000
    metadata_refresh_s: float = 30.0
    metadata_timeout_s: float = 2.0
    create_topics: bool = True
    new_topic_partitions: int = 4
    new_topic_replication: int = 1
    retry_backoff_s: float = 0.1
    retry_backoff_max_s: float = 5.0
    statistics_interval_ms: int = 1000
    producer_reset_after_s: float = 10.0
    partition_stuck_s: float = 5.0
    keyless_failover_s: float = 10.0
    stall_after_s: float = 30.0
    kafka: Mapping[str, KafkaConfigValue] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.statistics_interval_ms < 0:
            raise ValueError(
                f"statistics_interval_ms={self.statistics_interval_ms}: must not be negative"
            )
        if self.compression not in ("lz4", "zstd", "gzip", "snappy", "none"):
            raise ValueError(
                f"compression={self.compression!r}: use lz4, zstd, gzip, snappy or none"
            )
        for name in ("max_in_flight_per_queue", "read_batch_records", "new_topic_partitions"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)}: must be positive")
        for name in ("producer_reset_after_s", "partition_stuck_s", "stall_after_s"):
            if not 0 < getattr(self, name) < math.inf:
                raise ValueError(f"{name}={getattr(self, name)}: must be positive and finite")
        if not 0 <= self.keyless_failover_s < math.inf:
            raise ValueError(
                f"keyless_failover_s={self.keyless_failover_s}: must be finite, 0 to turn it off"
            )
        if self.metadata_refresh_s <= 0:
            raise ValueError(f"metadata_refresh_s={self.metadata_refresh_s}: must be positive")
