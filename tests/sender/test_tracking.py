"""The acknowledged prefix never passes a record that is not done, whatever the order."""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import given

from eventspool._core.native import AckTracker


@given(st.integers(0, 1000), st.permutations(list(range(30))))
def test_prefix_is_the_longest_completed_run(first: int, order: list[int]) -> None:
    tracker = AckTracker(first)
    for offset in range(30):
        tracker.sent(first + offset)
    completed: set[int] = set()
    for offset in order:
        tracker.completed(first + offset)
        completed.add(offset)
        expected = 0
        while expected in completed:
            expected += 1
        assert tracker.acked_until == first + expected
    assert tracker.in_flight == 0


def test_a_gap_holds_the_prefix_until_it_closes() -> None:
    tracker = AckTracker(10)
    for seq in range(10, 13):
        tracker.sent(seq)
    assert not tracker.completed(11)
    assert not tracker.completed(12)
    assert tracker.acked_until == 10
    assert tracker.completed(10)
    assert tracker.acked_until == 13


def test_records_dropped_before_reading_do_not_block_the_prefix() -> None:
    tracker = AckTracker(0)
    tracker.sent(0)
    tracker.sent(5)
    tracker.completed(0)
    assert tracker.acked_until == 5
    tracker.completed(5)
    assert tracker.acked_until == 6


def test_a_transient_failure_is_remembered_until_reset() -> None:
    tracker = AckTracker(0)
    tracker.sent(0)
    tracker.sent(1)
    tracker.failed_transiently()
    tracker.completed(1)
    assert tracker.failed
    assert tracker.acked_until == 0
    tracker.reset(0)
    assert not tracker.failed
    assert tracker.in_flight == 0
