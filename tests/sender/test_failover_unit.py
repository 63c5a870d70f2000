"""When a queue's keyless events leave its partition: only past `keyless_failover_s`,
only when there is something queued, and once per batch of newly queued events."""

from __future__ import annotations

import pytest

from eventspool.sender.failover import FailoverStep, failover_step


def _step(
    unavailable_s: float,
    *,
    depth: int = 10,
    parked: bool = False,
    moved_until: int = 0,
    next_seq: int = 100,
) -> FailoverStep:
    return failover_step(
        unavailable_s=unavailable_s,
        failover_after_s=10.0,
        depth=depth,
        parked=parked,
        moved_until=moved_until,
        next_seq=next_seq,
    )


@pytest.mark.parametrize("parked", [True, False])
def test_an_available_partition_resumes_its_queue(parked: bool) -> None:
    assert _step(0.0, parked=parked, moved_until=100) is FailoverStep.RESUME


def test_a_partition_unavailable_for_less_than_the_threshold_waits() -> None:
    assert _step(9.99) is FailoverStep.WAIT


def test_a_partition_unavailable_past_the_threshold_moves_its_keyless_events() -> None:
    assert _step(10.0) is FailoverStep.MOVE
    assert _step(3600.0) is FailoverStep.MOVE


def test_an_empty_queue_has_nothing_to_move() -> None:
    assert _step(60.0, depth=0) is FailoverStep.WAIT


def test_a_parked_queue_moves_only_what_was_queued_after_its_last_move() -> None:
    assert _step(60.0, parked=True, moved_until=100, next_seq=100) is FailoverStep.WAIT
    assert _step(60.0, parked=True, moved_until=100, next_seq=101) is FailoverStep.MOVE


def test_the_move_mark_of_a_queue_not_parked_does_not_hold_it_back() -> None:
    assert _step(60.0, parked=False, moved_until=100, next_seq=100) is FailoverStep.MOVE
