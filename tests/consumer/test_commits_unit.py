"""Commit bookkeeping without a broker: what is committed, what an answer means (late,
failed, or for a partition let go), and what a stop reports as uncommitted."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from eventspool.clock import ManualClock
from eventspool.consumer.assignment import Assignment, PartitionState
from eventspool.consumer.commits import CommitTracker
from eventspool.consumer.offsets import CommitPolicy, PartitionOffsets
from eventspool.consumer.scheduler import TopicPartitionKey
from eventspool.consumer.status import ConsumerCounters
from tests.consumer.fake_kafka import FakeConsumer

KEY = ("t", 0)


class _Rig:
    """A CommitTracker over one partition whose events up to `finished` are done."""

    def __init__(self, *, committed: int | None = None, finished: int = 10) -> None:
        self.clock = ManualClock()
        self.kafka = FakeConsumer()
        self.counters = ConsumerCounters()
        self.refetched: list[TopicPartitionKey] = []
        self.stopping = False
        self.state = PartitionState(PartitionOffsets(committed))
        start = committed or 0
        for offset in range(start, finished):
            self.state.offsets.add(offset)
            self.state.offsets.finish(offset)
        self.assignment: Assignment = {KEY: self.state}
        self.policy = CommitPolicy(1000, 5.0, self.clock)
        self.tracker = CommitTracker(
            "g",
            self.assignment,
            self.policy,
            self.counters,
            stopping=lambda: self.stopping,
            refetch=self.refetched.append,
        )

    def commit_async(self) -> None:
        self.tracker.commit(self.kafka, list(self.assignment.items()), wait=False)

    def answer(self, offset: int, error: KafkaError | None = None) -> None:
        self.tracker.on_commit(error, [TopicPartition(KEY[0], KEY[1], offset)])


def _sent(kafka: FakeConsumer) -> list[tuple[str, int, int, bool]]:
    return [
        (tp.topic, tp.partition, tp.offset, asynchronous)
        for tps, asynchronous in kafka.commits
        for tp in tps
    ]


def test_an_asynchronous_commit_sends_the_finished_prefix_and_waits_for_its_answer() -> None:
    rig = _Rig()
    rig.commit_async()
    assert _sent(rig.kafka) == [("t", 0, 10, True)]
    assert rig.tracker.in_flight == 1
    assert rig.tracker.to_commit(KEY, rig.state) == 10, "not stored until the broker answers"
    rig.answer(10)
    assert (rig.tracker.in_flight, rig.state.offsets.committed, rig.counters.commits) == (0, 10, 1)
    assert not rig.tracker.anything_to_commit()


def test_a_blocking_commit_settles_its_own_answer() -> None:
    rig = _Rig()
    rig.tracker.commit(rig.kafka, rig.assignment.items())
    assert _sent(rig.kafka) == [("t", 0, 10, False)]
    assert (rig.tracker.in_flight, rig.state.offsets.committed) == (0, 10)


def test_nothing_new_finished_sends_nothing_but_restarts_the_interval() -> None:
    rig = _Rig(committed=10)
    rig.policy.finished(1000)
    assert rig.policy.due()
    rig.commit_async()
    assert rig.kafka.commits == []
    assert not rig.policy.due()


def test_a_partition_let_go_is_not_committed() -> None:
    rig = _Rig()
    rig.state.active = False
    rig.commit_async()
    assert rig.kafka.commits == []


def test_a_late_answer_to_an_older_commit_makes_the_stored_offset_committed_again() -> None:
    rig = _Rig(finished=5)
    rig.commit_async()
    for offset in range(5, 10):
        rig.state.offsets.add(offset)
        rig.state.offsets.finish(offset)
    rig.commit_async()
    rig.answer(10)
    rig.answer(5)  # the first commit, retried by librdkafka, stored after the second
    assert rig.tracker.to_commit(KEY, rig.state) == 10, "the broker may hold 5 now"
    rig.clock.advance(5.0)
    assert rig.policy.due(), "due again after the interval though nothing finished"
    rig.commit_async()
    rig.answer(10)
    assert rig.tracker.to_commit(KEY, rig.state) is None
    assert _sent(rig.kafka)[-1] == ("t", 0, 10, True)


def test_a_failed_answer_is_named_counted_retried_and_refetched() -> None:
    rig = _Rig()
    rig.commit_async()
    rig.answer(10, KafkaError(KafkaError.REQUEST_TIMED_OUT))
    assert rig.state.offsets.committed is None
    assert KEY in rig.tracker.errors
    assert rig.tracker.uncommitted() == ("t/0",)
    assert (rig.counters.commit_failures, rig.refetched) == (1, [KEY])
    rig.clock.advance(5.0)
    assert rig.policy.due()
    rig.commit_async()
    rig.answer(10)
    assert rig.tracker.errors == {}, "a later commit that stored it clears the error"


def test_no_offset_to_commit_is_not_a_failure() -> None:
    rig = _Rig()
    rig.commit_async()
    rig.answer(-1001, KafkaError(KafkaError._NO_OFFSET))
    assert (rig.tracker.errors, rig.refetched, rig.counters.commit_failures) == ({}, [], 0)


def test_a_commit_that_cannot_be_sent_fails_every_partition_in_it() -> None:
    rig = _Rig()
    rig.kafka.commit_error = KafkaException(KafkaError(KafkaError._TRANSPORT))
    rig.commit_async()
    assert rig.tracker.in_flight == 0
    assert rig.tracker.errors == {KEY: "Local: Broker transport failure"}
    assert rig.refetched == [KEY]


def test_an_answer_for_a_partition_no_longer_assigned_is_ignored() -> None:
    rig = _Rig()
    rig.commit_async()
    rig.assignment.clear()
    rig.answer(10, KafkaError(KafkaError.REQUEST_TIMED_OUT))
    assert (rig.tracker.in_flight, rig.tracker.errors, rig.refetched) == (0, {}, [])


@pytest.mark.parametrize("lost", [False, True])
def test_a_partition_let_go_while_running_leaves_its_errors_to_the_next_owner(
    lost: bool,
) -> None:
    rig = _Rig()
    rig.tracker.errors[KEY] = "earlier failure"
    rig.tracker.release(KEY, rig.state, lost=lost)
    assert rig.tracker.errors == {}


def test_a_partition_lost_while_stopping_with_finished_offsets_stays_uncommitted() -> None:
    rig = _Rig()
    rig.stopping = True
    rig.tracker.release(KEY, rig.state, lost=True)
    assert rig.tracker.errors == {KEY: "the partition was lost with the group membership"}


def test_a_stop_reports_what_it_could_not_commit_and_why() -> None:
    rig = _Rig()
    rig.tracker.report_uncommitted()
    assert rig.tracker.errors == {KEY: "no time left before the stop deadline"}
    rig.commit_async()
    rig.tracker.report_uncommitted()
    assert rig.tracker.errors == {KEY: "no answer before the stop deadline"}
    rig.answer(10)
    rig.tracker.report_uncommitted()
    assert rig.tracker.errors == {}
