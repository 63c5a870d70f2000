"""Ordering modes: which buffered events may start, as a model-checked property."""

from __future__ import annotations

from collections.abc import Hashable

from hypothesis import given, settings
from hypothesis import strategies as st

from eventspool.consumer.record import WireRecord
from eventspool.consumer.scheduler import Ordering, Pending, Scheduler


def wire(partition: int, offset: int, key: bytes | None) -> WireRecord:
    return ("t", partition, offset, key, b"v", None, None, None)


def test_key_mode_runs_one_batch_per_key_and_keyless_freely() -> None:
    scheduler = Scheduler(Ordering.KEY)
    for offset, key in enumerate([b"a", b"b", b"a", None, None]):
        scheduler.add(wire(0, offset, key))
    first = scheduler.take(2, now=0)
    assert [p.offset for p in first] == [0, 1]
    second = scheduler.take(10, now=0)
    assert [p.offset for p in second] == [3, 4], "offset 2 waits for key a's batch"
    for pending in first:
        scheduler.release(pending)
    assert [p.offset for p in scheduler.take(10, now=0)] == [2]


def test_partition_mode_runs_one_batch_per_partition() -> None:
    scheduler = Scheduler(Ordering.PARTITION)
    for offset in range(3):
        scheduler.add(wire(0, offset, b"k"))
        scheduler.add(wire(1, offset, b"k"))
    batch = scheduler.take(2, now=0)
    assert {p.wire[1] for p in batch} == {batch[0].wire[1]}
    other = scheduler.take(10, now=0)
    assert {p.wire[1] for p in other} == {1 - batch[0].wire[1]}
    assert scheduler.take(10, now=0) == []


def test_a_retry_backoff_holds_back_its_key_but_not_others() -> None:
    scheduler = Scheduler(Ordering.KEY)
    scheduler.add(wire(0, 0, b"a"))
    scheduler.add(wire(0, 1, b"a"))
    scheduler.add(wire(0, 2, b"b"))
    (failed,) = scheduler.take(1, now=0)
    scheduler.release(failed)
    failed.not_before = 5.0
    failed.attempt += 1
    scheduler.put_back(failed)
    assert [p.offset for p in scheduler.take(10, now=1.0)] == [2]
    assert [p.offset for p in scheduler.take(10, now=5.0)] == [0, 1]


def test_unordered_mode_takes_anything_ready() -> None:
    scheduler = Scheduler(Ordering.UNORDERED)
    for offset in range(4):
        scheduler.add(wire(0, offset, b"same"))
    assert len(scheduler.take(2, now=0)) == 2
    assert len(scheduler.take(2, now=0)) == 2


@settings(max_examples=200)
@given(
    ordering=st.sampled_from(list(Ordering)),
    events=st.lists(
        st.tuples(st.integers(0, 2), st.sampled_from([b"a", b"b", b"c", None])),
        min_size=1,
        max_size=40,
    ),
    steps=st.lists(st.tuples(st.integers(1, 5), st.booleans()), min_size=1, max_size=60),
)
def test_no_scope_runs_twice_at_once_and_each_scope_starts_in_offset_order(
    ordering: Ordering,
    events: list[tuple[int, bytes | None]],
    steps: list[tuple[int, bool]],
) -> None:
    scheduler = Scheduler(ordering)
    next_offset = dict.fromkeys(range(3), 0)
    for partition, key in events:
        scheduler.add(wire(partition, next_offset[partition], key))
        next_offset[partition] += 1
    running: list[list[Pending]] = []
    finished: set[tuple[int, int]] = set()
    started_per_scope: dict[Hashable, list[int]] = {}
    for limit, fail in steps:
        batch = scheduler.take(limit, now=0)
        busy = {p.scope for b in running for p in b if p.scope is not None}
        in_batch = {(p.wire[1], p.offset) for p in batch}
        for pending in batch:
            assert pending.scope is None or pending.scope not in busy
            if pending.scope is not None and ordering is not Ordering.UNORDERED:
                earlier = started_per_scope.setdefault(pending.scope, [])
                unfinished_earlier = [
                    o
                    for o in earlier
                    if o < pending.offset
                    and (pending.wire[1], o) not in finished
                    and (pending.wire[1], o) not in in_batch
                ]
                assert not unfinished_earlier, "a later event started before an earlier one ended"
                earlier.append(pending.offset)
        if batch:
            running.append(batch)
        if running:
            done = running.pop(0)
            for pending in done:
                scheduler.release(pending)
            # A failure puts the event back, and (as a worker does) the rest of its scope
            # in the batch with it.
            failed_scope = done[0].scope if fail and done else None
            for index, pending in enumerate(done):
                if fail and (
                    index == 0 or (failed_scope is not None and pending.scope == failed_scope)
                ):
                    scheduler.put_back(pending)
                else:
                    finished.add((pending.wire[1], pending.offset))
