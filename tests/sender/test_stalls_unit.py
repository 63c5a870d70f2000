"""A queue holding events at the same head for `stall_after_s` is reported once, and
once more when it moves again; an empty queue never stalls."""

from __future__ import annotations

from eventspool.sender.stalls import StallChange, StallDetector


def test_a_queue_stuck_at_one_head_stalls_once_after_the_threshold() -> None:
    stalls: StallDetector[str] = StallDetector(30.0)
    assert stalls.observe("q", head=5, depth=3, now=0.0) is None
    assert stalls.observe("q", head=5, depth=3, now=29.9) is None
    assert stalls.stalled_for("q", 3, 29.9) is None
    assert stalls.observe("q", head=5, depth=3, now=30.0) is StallChange.STALLED
    assert stalls.observe("q", head=5, depth=3, now=60.0) is None  # said once
    assert stalls.stalled_for("q", 3, 61.0) == 61.0


def test_a_stalled_queue_whose_head_moves_is_moving_again() -> None:
    stalls: StallDetector[str] = StallDetector(30.0)
    stalls.observe("q", head=5, depth=3, now=0.0)
    stalls.observe("q", head=5, depth=3, now=30.0)
    assert stalls.observe("q", head=6, depth=2, now=31.0) is StallChange.MOVING_AGAIN
    assert stalls.stalled_for("q", 2, 31.0) is None
    # The clock starts again from the new head.
    assert stalls.observe("q", head=6, depth=2, now=60.9) is None
    assert stalls.observe("q", head=6, depth=2, now=61.0) is StallChange.STALLED


def test_a_queue_that_keeps_advancing_never_stalls() -> None:
    stalls: StallDetector[str] = StallDetector(30.0)
    for step in range(100):
        assert stalls.observe("q", head=step, depth=10, now=step * 10.0) is None


def test_an_empty_queue_never_stalls() -> None:
    stalls: StallDetector[str] = StallDetector(30.0)
    for now in (0.0, 30.0, 600.0):
        assert stalls.observe("q", head=5, depth=0, now=now) is None
    assert stalls.stalled_for("q", 0, 600.0) is None


def test_a_stalled_queue_that_empties_is_moving_again() -> None:
    stalls: StallDetector[str] = StallDetector(30.0)
    stalls.observe("q", head=5, depth=3, now=0.0)
    stalls.observe("q", head=5, depth=3, now=30.0)
    assert stalls.observe("q", head=5, depth=0, now=31.0) is StallChange.MOVING_AGAIN


def test_queues_no_longer_open_are_forgotten() -> None:
    stalls: StallDetector[str] = StallDetector(30.0)
    for queue in ("a", "b"):
        stalls.observe(queue, head=1, depth=1, now=0.0)
        stalls.observe(queue, head=1, depth=1, now=30.0)
    stalls.keep_only({"b"})
    assert stalls.stalled_for("a", 1, 31.0) is None
    assert stalls.stalled_for("b", 1, 31.0) == 31.0
    # "a" reopened starts from scratch: not stalled before another full threshold.
    assert stalls.observe("a", head=1, depth=1, now=32.0) is None
    assert stalls.observe("a", head=1, depth=1, now=61.0) is None
    assert stalls.observe("a", head=1, depth=1, now=62.0) is StallChange.STALLED
