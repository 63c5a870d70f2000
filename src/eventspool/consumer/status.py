"""What the consumer shows of itself: counters by outcome, the status snapshot other
threads read, and the true end offsets a thread of their own measures for its lag."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass

from confluent_kafka import KafkaException

from eventspool.config import KafkaConfigValue
from eventspool.consumer.assignment import Assignment
from eventspool.consumer.scheduler import TopicPartitionKey
from eventspool.endoffsets import EndOffsetsError, true_end_offsets

log = logging.getLogger("eventspool.consumer")

_SNAPSHOT_EVERY_S = 0.25


@dataclass(slots=True)
class ConsumerCounters:
    """Events by outcome since start. `abandoned` were running at a revoke or shutdown
    and will be delivered again; `dropped` were buffered and will be fetched again."""

    received: int = 0
    processed: int = 0
    failed: int = 0
    retried: int = 0
    dead_lettered: int = 0
    stale: int = 0
    abandoned: int = 0
    dropped: int = 0
    commits: int = 0
    commit_failures: int = 0
    rebalances: int = 0
    worker_restarts: int = 0
    pauses: int = 0


@dataclass(frozen=True, slots=True)
class PartitionStatus:
    topic: str
    partition: int
    position: int | None
    committed: int | None
    end: int | None
    held: int

    @property
    def lag(self) -> int | None:
        """Events not yet finished, from the true end offset."""
        if self.end is None:
            return None
        start = self.position if self.position is not None else self.committed
        return None if start is None else max(self.end - start, 0)


@dataclass(frozen=True, slots=True)
class ConsumerStatus:
    """A snapshot the poll thread publishes every quarter second; `taken_at` is
    `time.monotonic()` when it was taken, so two snapshots give exact rates. `state` is
    created, starting, running, revoking (a rebalance waits for running handlers of the
    partitions it takes away), stopping or stopped. `uncommitted` names the partitions
    (`topic/partition`) whose finished offsets the last commit could not store: retried
    at the next commit while running, delivered again after a stop."""

    group: str
    state: str
    paused: bool
    buffered: int
    waiting: int
    in_flight: int
    oldest_in_flight_s: float | None
    partitions: tuple[PartitionStatus, ...]
    uncommitted: tuple[str, ...]
    counters: ConsumerCounters
    taken_at: float

    @property
    def lag(self) -> int | None:
        lags = [p.lag for p in self.partitions]
        known = [lag for lag in lags if lag is not None]
        return sum(known) if known else None

    def line(self) -> str:
        """One status line, as the CLI prints it."""
        c = self.counters
        lag = "?" if self.lag is None else str(self.lag)
        oldest = "-" if self.oldest_in_flight_s is None else f"{self.oldest_in_flight_s:.1f}s"
        return (
            f"{self.state} group={self.group} partitions={len(self.partitions)} lag={lag} "
            f"buffered={self.buffered} running={self.in_flight} oldest={oldest} "
            f"paused={'yes' if self.paused else 'no'} | received={c.received} "
            f"processed={c.processed} retried={c.retried} dead_lettered={c.dead_lettered} "
            f"stale={c.stale} commits={c.commits} rebalances={c.rebalances} "
            f"worker_restarts={c.worker_restarts}"
            + (f" uncommitted={','.join(self.uncommitted)}" if self.uncommitted else "")
        )


class StatusBoard:
    """What other threads may read, each replaced whole, never mutated: the poll
    thread's latest snapshot, and the end offsets the lag thread measured."""

    def __init__(self) -> None:
        self.status: ConsumerStatus | None = None
        self.ends: dict[TopicPartitionKey, int] = {}
        self._next_snapshot = 0.0

    def snapshot_due(self, held: int, *, force: bool) -> float | None:
        """The time to stamp a snapshot with if one is due now (a snapshot period has
        passed, or `force`), else None."""
        now = time.monotonic()
        published = self.status
        # The moment the last held event settles is published at once, not up to a
        # snapshot period later: whoever waits for the consumer to catch up (a drain, a
        # test, a benchmark's clock) sees it when it happens.
        drained = not held and published is not None and published.buffered > 0
        if not force and not drained and now < self._next_snapshot:
            return None
        self._next_snapshot = now + _SNAPSHOT_EVERY_S
        return now

    def partitions(self, assignment: Assignment) -> tuple[PartitionStatus, ...]:
        ends = self.ends
        return tuple(
            PartitionStatus(
                key[0],
                key[1],
                state.offsets.position,
                state.offsets.committed,
                ends.get(key),
                state.held,
            )
            for key, state in sorted(assignment.items())
        )

    def follow_end_offsets(
        self,
        group: str,
        kafka: Mapping[str, KafkaConfigValue],
        interval_s: float,
        stop: threading.Event,
        wakeup: threading.Event,
    ) -> None:
        """Measure true end offsets on a timer, off the poll thread: the probe may take a
        fetch round trip per partition, which the poll loop must never wait for. A stop
        ends it without another probe: one against a partition leader that does not
        answer runs to its timeout (10 s), long after the consumer stopped."""
        while not stop.is_set():
            status = self.status
            keys = [(p.topic, p.partition) for p in status.partitions] if status else []
            if keys:
                try:
                    ends = true_end_offsets(kafka, keys)
                except (EndOffsetsError, KafkaException) as exc:
                    log.debug("consumer group %s: end offsets: %s", group, exc)
                else:
                    self.ends = {**self.ends, **ends}
            wakeup.wait(interval_s)
            wakeup.clear()
