"""How a Consumer behaves; every figure has a default that suits handlers of any length."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from eventspool.config import KafkaConfigValue
from eventspool.consumer.scheduler import Ordering


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often and when a failed event is tried again: what a worker needs to retry
    key-ordered events itself."""

    max_attempts: int
    backoff_s: float
    backoff_max_s: float

    def delay(self, failed_attempts: int) -> float:
        """Exponential backoff after the n-th failure."""
        delay: float = self.backoff_s * 2.0 ** (failed_attempts - 1)
        return min(delay, self.backoff_max_s)


@dataclass(frozen=True, slots=True)
class ConsumerSettings:
    """Consumer behaviour.

    `max_buffered` bounds the events held at once (waiting, running, or on their way to
    a dead-letter topic); partitions are paused when it stays full for `pause_grace_s`
    and resumed once the count falls to `resume_fraction` of it. It also bounds the
    duplicates a rebalance can cause.
    `stale_topic` and `dead_letter_topic` are templates: `{topic}` is the source topic.
    `kafka` goes to librdkafka as is (security settings, `session.timeout.ms`, ...).
    `concurrency` is how many calls of an `async def` handler run at once in each worker
    (for I/O-bound work); a plain function runs one event at a time per worker.
    """

    ordering: Ordering = Ordering.KEY
    max_buffered: int = 10_000
    resume_fraction: float = 0.5
    pause_grace_s: float = 0.25
    max_batch: int = 200
    concurrency: int = 100
    commit_every_n: int = 1000
    commit_every_s: float = 5.0
    max_age_s: float | None = None
    stale_topic: str | None = None
    max_attempts: int = 4
    retry_backoff_s: float = 0.5
    retry_backoff_max_s: float = 30.0
    dead_letter_topic: str = "{topic}.dlq"
    revoke_timeout_s: float = 5.0
    shutdown_timeout_s: float = 30.0
    lag_interval_s: float = 10.0
    start_method: str = "forkserver"
    kafka: Mapping[str, KafkaConfigValue] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "ordering", Ordering(self.ordering))
        for name in ("max_buffered", "max_batch", "concurrency", "commit_every_n", "max_attempts"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)}: must be at least 1")
        for name in ("commit_every_s", "retry_backoff_s", "lag_interval_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name}={getattr(self, name)}: must be positive")
        if self.pause_grace_s < 0:
            raise ValueError(f"pause_grace_s={self.pause_grace_s}: must not be negative")
        if not 0 <= self.resume_fraction < 1:
            raise ValueError(f"resume_fraction={self.resume_fraction}: must be in [0, 1)")
        if self.max_age_s is not None and self.max_age_s <= 0:
            raise ValueError(f"max_age_s={self.max_age_s}: must be positive (or None)")
        if self.start_method not in ("spawn", "forkserver"):
            raise ValueError(
                f"start_method={self.start_method!r}: use 'spawn' or 'forkserver' "
                "(a forked child would inherit librdkafka's threads)"
            )

    @property
    def retry(self) -> RetryPolicy:
        return RetryPolicy(self.max_attempts, self.retry_backoff_s, self.retry_backoff_max_s)

    def retry_delay(self, failed_attempts: int) -> float:
        """Exponential backoff after the n-th failure."""
        return self.retry.delay(failed_attempts)
