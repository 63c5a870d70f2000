"""Commit bookkeeping: which finished offsets to commit, the commits in flight, answers
that came back out of order, and the partitions whose finished offsets are not stored.

Commits are asynchronous on the count-or-time threshold, so a broker round trip never
stalls intake, and blocking on revoke, whose outcome must be known before the partition
is let go. The answer to an asynchronous one comes to `on_commit` from a later consume()
on the poll thread.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from eventspool.consumer.assignment import Assignment, PartitionState
from eventspool.consumer.handle import KafkaConsumerHandle
from eventspool.consumer.offsets import CommitPolicy
from eventspool.consumer.scheduler import TopicPartitionKey
from eventspool.consumer.status import ConsumerCounters

log = logging.getLogger("eventspool.consumer")


class CommitTracker:
    """Commits the finished prefix of each assigned partition and keeps what their
    answers mean: `in_flight` asynchronous commits not answered yet, `errors` by
    partition whose last commit did not store its offset.

    `refetch(key)` is called for a partition whose commit failed: it may have moved to
    another member, whose work its waiting events would duplicate. `stopping()` says the
    consumer is stopping, when a failed commit is the stop's to report.
    """

    def __init__(
        self,
        group: str,
        assignment: Assignment,
        policy: CommitPolicy,
        counters: ConsumerCounters,
        *,
        stopping: Callable[[], bool],
        refetch: Callable[[TopicPartitionKey], None],
    ) -> None:
        self._group = group
        self._assignment = assignment
        self.policy = policy
        self._counters = counters
        self._stopping = stopping
        self._refetch = refetch
        self.in_flight = 0
        # Partitions whose acknowledged offset a late answer to an older commit came after.
        self._overtaken: set[TopicPartitionKey] = set()
        self.errors: dict[TopicPartitionKey, str] = {}

    def uncommitted(self) -> tuple[str, ...]:
        """The partitions in `errors`, as the status names them."""
        return tuple(f"{topic}/{partition}" for topic, partition in sorted(self.errors))

    def commit(
        self,
        kafka: KafkaConsumerHandle,
        states: Iterable[tuple[TopicPartitionKey, PartitionState]],
        *,
        wait: bool = True,
    ) -> None:
        """Commit the finished prefix of each partition. Without `wait` the outcome comes
        to `on_commit` from a later consume() on this thread."""
        offsets: list[TopicPartition] = []
        for key, state in states:
            offset = self.to_commit(key, state)
            if offset is not None and state.active:
                offsets.append(TopicPartition(key[0], key[1], offset))
        self.policy.committed()
        if not offsets:
            return
        results: list[TopicPartition] | None = None
        try:
            if wait:
                results = kafka.commit(offsets=offsets, asynchronous=False)
            else:
                kafka.commit(offsets=offsets, asynchronous=True)
        except KafkaException as exc:
            self._commits_failed({(tp.topic, tp.partition): _reason(exc) for tp in offsets})
            return
        if wait:
            self._commit_done(None, results or ())
        else:
            self.in_flight += 1

    def to_commit(self, key: TopicPartitionKey, state: PartitionState) -> int | None:
        """The offset to commit: the end of the finished prefix if it moved on, else the
        acknowledged offset again if an older commit was answered after it."""
        offset = state.offsets.committable()
        if offset is None and key in self._overtaken:
            return state.offsets.committed
        return offset

    def anything_to_commit(self) -> bool:
        return any(self.to_commit(k, s) is not None for k, s in self._assignment.items())

    def on_commit(self, error: KafkaError | None, partitions: list[TopicPartition]) -> None:
        """librdkafka's report of an asynchronous commit (blocking ones are not reported
        here; `commit` settles those itself)."""
        self.in_flight -= 1
        self._commit_done(error, partitions)

    def release(self, key: TopicPartitionKey, state: PartitionState, *, lost: bool) -> None:
        """A partition let go while running is the next owner's to commit; one let go
        while stopping with finished offsets not committed stays in `uncommitted`."""
        if not self._stopping() or self.to_commit(key, state) is None:
            self.errors.pop(key, None)
        elif lost:
            self.errors[key] = "the partition was lost with the group membership"
        self._overtaken.discard(key)

    def report_uncommitted(self) -> None:
        """At a stop, after the last try: name every partition with finished offsets not
        committed, and why, in `errors` and in one warning."""
        unanswered = self.in_flight > 0
        for key, state in self._assignment.items():
            if self.to_commit(key, state) is not None:
                self.errors[key] = (
                    "no answer before the stop deadline"
                    if unanswered
                    else self.errors.get(key, "no time left before the stop deadline")
                )
        if self.errors:
            log.warning(
                "consumer group %s: could not commit %s; their events after the committed "
                "offsets will be delivered again",
                self._group,
                ", ".join(f"{t}/{p} ({why})" for (t, p), why in sorted(self.errors.items())),
            )

    def _commit_done(self, error: KafkaError | None, results: Iterable[TopicPartition]) -> None:
        failed: dict[TopicPartitionKey, str] = {}
        for result in results:
            key = (result.topic, result.partition)
            state = self._assignment.get(key)
            if state is None:
                continue
            problem = result.error or error
            if problem is not None and problem.code() != KafkaError._NO_OFFSET:
                failed[key] = problem.str()
            elif result.offset >= 0:
                self._acknowledged(key, state, result.offset)
        self._counters.commits += 1
        if failed:
            self._commits_failed(failed)

    def _acknowledged(self, key: TopicPartitionKey, state: PartitionState, offset: int) -> None:
        """The broker stored `offset`. librdkafka retries a commit that met NOT_COORDINATOR
        once it found the coordinator again, after commits sent later, and answers them in
        the order the broker stored them: an answer behind one before it means the broker
        may hold that older offset now. Taking the furthest answer for the stored offset
        left groups committed thousands of events short for good; such a partition is
        committed again at the next opportunity."""
        committed = state.offsets.committed
        if committed is not None and offset < committed:
            self._overtaken.add(key)
            self.policy.retry()
        else:
            self._overtaken.discard(key)
        state.offsets.mark_committed(offset)
        self.errors.pop(key, None)

    def _commits_failed(self, reasons: dict[TopicPartitionKey, str]) -> None:
        """One line per failed commit; while stopping, the stop's own report of what it
        could not commit is the warning."""
        log.log(
            logging.INFO if self._stopping() else logging.WARNING,
            "consumer group %s: commit of %s failed: %s",
            self._group,
            ", ".join(f"{topic}/{partition}" for topic, partition in reasons),
            "; ".join(sorted(set(reasons.values()))),
        )
        for key, reason in reasons.items():
            self._commit_failed(key, reason)

    def _commit_failed(self, key: TopicPartitionKey, reason: str) -> None:
        """Retry the commit after the interval, and have the partition's waiting events
        fetched again."""
        self._counters.commit_failures += 1
        self.errors[key] = reason
        self.policy.retry()
        self._refetch(key)


def _reason(exc: KafkaException) -> str:
    """librdkafka's words for a failed call, without the KafkaError{...} around them."""
    error = exc.args[0] if exc.args else None
    return error.str() if isinstance(error, KafkaError) else str(exc)
