"""Contiguous commit tracking and the count-or-time commit policy, with an injected clock."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from eventspool.clock import ManualClock
from eventspool.consumer.offsets import CommitPolicy, PartitionOffsets


def test_commit_stops_at_the_first_unfinished_offset() -> None:
    offsets = PartitionOffsets(committed=10)
    for offset in (10, 11, 12, 15):
        assert offsets.add(offset)
    assert offsets.committable() is None
    offsets.finish(11)
    offsets.finish(12)
    assert offsets.committable() is None, "10 is not done: nothing may be committed"
    offsets.finish(10)
    assert offsets.committable() == 15
    offsets.mark_committed(15)
    assert offsets.committable() is None
    offsets.mark_committed(12)  # an earlier asynchronous commit reporting back late
    assert offsets.committed == 15
    offsets.finish(15)
    assert offsets.committable() == 16


def test_refetched_offsets_are_ignored_and_forget_rewinds() -> None:
    offsets = PartitionOffsets()
    for offset in range(5):
        offsets.add(offset)
    assert not offsets.add(3)
    offsets.finish(0)
    offsets.forget_from(2)
    assert offsets.outstanding == 1
    assert offsets.add(2)
    offsets.finish(1)
    assert offsets.committable() == 2


@given(
    gaps=st.lists(st.integers(min_value=1, max_value=3), min_size=1, max_size=60),
    data=st.data(),
)
def test_committable_is_never_beyond_an_unfinished_offset(
    gaps: list[int], data: st.DataObject
) -> None:
    offsets = PartitionOffsets()
    received: list[int] = []
    position = 0
    for gap in gaps:
        position += gap
        offsets.add(position)
        received.append(position)
    order = data.draw(st.permutations(received))
    finished_count = data.draw(st.integers(min_value=0, max_value=len(order)))
    finished = set(order[:finished_count])
    for offset in order[:finished_count]:
        offsets.finish(offset)
    unfinished = [o for o in received if o not in finished]
    expected = unfinished[0] if unfinished else received[-1] + 1
    assert offsets.committable() == expected
    assert offsets.position == expected
    assert offsets.outstanding == len(unfinished) + sum(
        1 for o in finished if unfinished and o > unfinished[0]
    )


def test_policy_commits_after_n_events() -> None:
    clock = ManualClock()
    policy = CommitPolicy(every_n=3, every_s=60, clock=clock)
    policy.finished(2)
    assert not policy.due()
    policy.finished()
    assert policy.due()
    policy.committed()
    assert not policy.due()


def test_policy_commits_after_t_seconds_only_when_something_finished() -> None:
    clock = ManualClock()
    policy = CommitPolicy(every_n=1000, every_s=5, clock=clock)
    clock.advance(10)
    assert not policy.due(), "nothing finished: no commit however long it has been"
    policy.finished()
    assert policy.due()
    policy.committed()
    policy.finished()
    clock.advance(4.9)
    assert not policy.due()
    clock.advance(0.2)
    assert policy.due()


@pytest.mark.parametrize(("n", "s"), [(0, 1.0), (1, 0.0)])
def test_policy_rejects_non_positive_thresholds(n: int, s: float) -> None:
    with pytest.raises(ValueError, match="must be positive"):
        CommitPolicy(every_n=n, every_s=s, clock=ManualClock())
