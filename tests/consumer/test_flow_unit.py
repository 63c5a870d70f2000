"""Flow control without a broker: when a full buffer waits, pauses and resumes."""

from __future__ import annotations

from confluent_kafka import TopicPartition

from eventspool.consumer.assignment import PartitionState
from eventspool.consumer.flow import FlowControl
from eventspool.consumer.offsets import PartitionOffsets
from eventspool.consumer.settings import ConsumerSettings
from eventspool.consumer.status import ConsumerCounters
from tests.consumer.fake_kafka import FakeConsumer


class _Time:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _flow(
    max_buffered: int = 10, resume_fraction: float = 0.5, pause_grace_s: float = 0.25
) -> tuple[FlowControl, PartitionState, FakeConsumer, _Time, ConsumerCounters]:
    settings = ConsumerSettings(
        max_buffered=max_buffered, resume_fraction=resume_fraction, pause_grace_s=pause_grace_s
    )
    counters = ConsumerCounters()
    clock = _Time()
    kafka = FakeConsumer(assigned=[TopicPartition("t", 0), TopicPartition("t", 1)])
    flow = FlowControl(settings, counters, clock)
    return flow, PartitionState(PartitionOffsets()), kafka, clock, counters


def test_holding_and_releasing_counts_on_the_partition_and_in_total() -> None:
    flow, state, _, _, _ = _flow()
    other = PartitionState(PartitionOffsets())
    flow.hold(state, 3)
    flow.hold(other)
    flow.release(state, 2)
    assert (flow.held, state.held, other.held) == (2, 1, 1)


def test_below_the_limit_intake_goes_on_unpaused() -> None:
    flow, state, kafka, _, _ = _flow()
    flow.hold(state, 9)
    assert not flow.hold_intake(kafka)
    assert not flow.paused
    assert kafka.paused == []


def test_a_full_buffer_waits_out_the_grace_then_pauses_every_assigned_partition() -> None:
    flow, state, kafka, clock, counters = _flow()
    flow.hold(state, 10)
    assert flow.hold_intake(kafka), "full: no consume() while the grace lasts"
    clock.now += 0.2
    assert flow.hold_intake(kafka)
    assert kafka.paused == []
    clock.now += 0.05
    assert not flow.hold_intake(kafka), "paused: consume() goes on, returning nothing"
    assert flow.paused
    assert kafka.paused == [kafka.assigned]
    assert counters.pauses == 1


def test_a_buffer_that_drains_within_the_grace_starts_a_new_grace_when_full_again() -> None:
    flow, state, kafka, clock, _ = _flow()
    flow.hold(state, 10)
    assert flow.hold_intake(kafka)
    clock.now += 0.2
    flow.release(state)
    assert not flow.hold_intake(kafka)
    flow.hold(state)
    clock.now += 0.2
    assert flow.hold_intake(kafka), "0.4 s since the first full step, but 0 s since this one"
    assert not flow.paused


def test_no_grace_pauses_at_once() -> None:
    flow, state, kafka, _, _ = _flow(pause_grace_s=0.0)
    flow.hold(state, 10)
    assert not flow.hold_intake(kafka)
    assert flow.paused


def test_a_pause_ends_only_at_the_resume_fraction() -> None:
    flow, state, kafka, _, counters = _flow(max_buffered=10, resume_fraction=0.3, pause_grace_s=0)
    flow.hold(state, 10)
    flow.hold_intake(kafka)
    flow.release(state, 6)
    assert not flow.hold_intake(kafka)
    assert flow.paused, "4 held is above 30% of 10"
    assert kafka.resumed == []
    flow.release(state, 1)
    assert not flow.hold_intake(kafka)
    assert not flow.paused
    assert kafka.resumed == [kafka.assigned]
    assert counters.pauses == 1, "a resume is not a pause"


def test_a_pause_with_nothing_assigned_pauses_no_partition_but_holds() -> None:
    flow, state, kafka, _, _ = _flow(pause_grace_s=0)
    kafka.assigned = []
    flow.hold(state, 10)
    flow.hold_intake(kafka)
    assert flow.paused
    assert kafka.paused == []


def test_new_partitions_get_the_pause_as_it_stands() -> None:
    flow, state, kafka, _, _ = _flow(pause_grace_s=0)
    new = [TopicPartition("t", 2)]
    flow.apply_to(kafka, new)
    assert (kafka.paused, kafka.resumed) == ([], [new])
    flow.hold(state, 10)
    flow.hold_intake(kafka)
    flow.apply_to(kafka, new)
    assert kafka.paused[-1] == new
