"""Key-hash routing, in process: the worker's per-key order across retries and drops, the
reports the poll thread accounts by, and offset ranges finished as one."""

from __future__ import annotations

import asyncio
import math
import queue
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from eventspool._core.native import split_keyed
from eventspool.consumer.messages import Drop, Parts, PartWire, Progress
from eventspool.consumer.offsets import PartitionOffsets
from eventspool.consumer.record import RawRecord, Record
from eventspool.consumer.scheduler import Ordering
from eventspool.consumer.settings import RetryPolicy
from eventspool.consumer.worker.aio import AsyncWorker
from eventspool.consumer.worker.plain import PartRun, PlainWorker


class _Pipe:
    """What the worker sends, kept."""

    def __init__(self) -> None:
        self.sent: list[Any] = []

    def send(self, message: Any) -> None:
        self.sent.append(message)


class _Progress:
    value = -1


def _raw(offset: int, key: bytes) -> RawRecord:
    return (offset, key, b"%d" % offset, None, (0, 0))


class _Message:
    """What split_keyed reads of a confluent_kafka Message."""

    def __init__(self, partition: int, raw: RawRecord) -> None:
        self._partition = partition
        self._raw = raw

    def topic(self) -> str:
        return "t"

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._raw[0]

    def key(self) -> bytes | None:
        return self._raw[1]

    def value(self) -> bytes | None:
        return self._raw[2]

    def headers(self) -> None:
        return None

    def timestamp(self) -> tuple[int, int]:
        return self._raw[4]


def _part(part_id: int, partition: int, raws: list[RawRecord], packed: bool) -> PartWire:
    """A part as the poll thread hands it over: packed by the compiled core (first
    attempts), or as a list (how a dead worker's events are resent)."""
    if not packed or not raws:
        return (part_id, "t", partition, raws, None)
    messages = [_Message(partition, raw) for raw in raws]
    (run,) = split_keyed(messages, 1, len(raws), {("t", partition): None}, None)
    ((blob, count),) = run[5]
    assert count == len(raws)
    return (part_id, "t", partition, blob, None)


def _worker(handler: Any, max_attempts: int, backoff_s: float = 0.0) -> tuple[PlainWorker, _Pipe]:
    pipe = _Pipe()
    retry = RetryPolicy(max_attempts, backoff_s, backoff_s)
    worker = PlainWorker(pipe, handler, Ordering.KEY, _Progress(), retry)  # type: ignore[arg-type]
    return worker, pipe


def _run_next(worker: PlainWorker) -> None:
    """Run the worker's next job, or its next part's run up to an arrival or a failure."""
    work = worker._next()
    assert work is not None
    if isinstance(work, PartRun):
        worker._run_part(work, math.inf)
    else:
        worker._run(work)


def _drain(worker: PlainWorker) -> None:
    """Run what the worker holds, waiting for retries to be due, then report."""
    while worker._ready or worker._timers:
        _run_next(worker)
    worker._flush()


def _reports(pipe: _Pipe) -> list[Progress]:
    return [message for message in pipe.sent if isinstance(message, Progress)]


_KEYS = st.lists(st.sampled_from([b"a", b"b", b"c", b"d"]), min_size=1, max_size=40)
_FAILING = st.sets(st.integers(min_value=0, max_value=39))


def _check(calls: list[Record], keys: list[bytes], failing: set[int], max_attempts: int) -> None:
    """Events in `failing` failed every attempt, each retried in place (holding back its
    key's later events), then given up; every other event ran once, in its key's order."""
    for key in set(keys):
        tried = [(r.offset, r.attempt) for r in calls if r.key == key]
        expected = [
            (offset, attempt)
            for offset, k in enumerate(keys)
            if k == key
            for attempt in range(1, (max_attempts if offset in failing else 1) + 1)
        ]
        assert tried == expected, f"key {key!r}"


def _check_reports(
    reports: list[Progress], keys: list[bytes], failing: set[int], max_attempts: int, split: int
) -> None:
    """Each event is settled once: finished, or given up after its last attempt."""
    settled: dict[int, str] = {}
    first_offset = {0: 0, 1: split}
    for report in reports:
        for part, index, attempt, _failure, gave_up in report.failures:
            if gave_up:
                assert attempt == max_attempts
                assert first_offset[part] + index not in settled
                settled[first_offset[part] + index] = "gave up"
        for part, indexes in report.finished:
            size = split if part == 0 else len(keys) - split
            for index in range(size) if indexes is None else indexes:
                offset = first_offset[part] + index
                if indexes is None and offset in settled:
                    continue  # None: every event of the part not reported before
                assert offset not in settled
                settled[offset] = "finished"
    assert settled == {
        offset: "gave up" if offset in failing else "finished" for offset in range(len(keys))
    }
    assert sum(report.settled for report in reports) == len(keys)


def _parts(keys: list[bytes], split: int, packed: bool = False) -> list[Parts]:
    items = [_raw(offset, key) for offset, key in enumerate(keys)]
    return [
        Parts([_part(0, 0, items[:split], packed)]),
        Parts([_part(1, 0, items[split:], packed)]),
    ]


@settings(max_examples=60)
@given(
    keys=_KEYS,
    failing=_FAILING,
    max_attempts=st.integers(min_value=1, max_value=3),
    split=st.integers(min_value=0, max_value=40),
    packed=st.booleans(),
    backoff_s=st.sampled_from([0.0, 0.001]),
)
# A part that failed part-way goes on before the next part (its key b runs in both).
@example(keys=[b"a", b"b", b"b"], failing={0}, max_attempts=1, split=2, packed=True, backoff_s=0.0)
def test_a_worker_runs_each_keys_events_in_order_and_settles_each_once(
    *,
    keys: list[bytes],
    failing: set[int],
    max_attempts: int,
    split: int,
    packed: bool,
    backoff_s: float,
) -> None:
    calls: list[Record] = []

    def handler(record: Record) -> None:
        calls.append(record)
        if record.offset in failing:
            raise ValueError("fails")

    worker, pipe = _worker(handler, max_attempts, backoff_s)
    split = min(split, len(keys))
    for transfer in _parts(keys, split, packed):
        worker._take(transfer)
    _drain(worker)
    _check(calls, keys, failing, max_attempts)
    _check_reports(_reports(pipe), keys, failing, max_attempts, split)


class _AsyncPipe(_Pipe):
    """Hands the worker its transfers, then a stop once it has settled `total` events."""

    def __init__(self, transfers: list[Parts], total: int) -> None:
        super().__init__()
        self.total = total
        self.inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        for transfer in transfers:
            self.inbox.put(transfer)

    def recv(self) -> Any:
        return self.inbox.get()

    def send(self, message: Any) -> None:
        super().send(message)
        if sum(report.settled for report in _reports(self)) == self.total:
            self.inbox.put(None)


@settings(max_examples=40)
@given(
    keys=_KEYS,
    failing=_FAILING,
    max_attempts=st.integers(min_value=1, max_value=3),
    split=st.integers(min_value=0, max_value=40),
    concurrency=st.integers(min_value=1, max_value=4),
)
def test_an_async_worker_runs_each_keys_events_in_order_and_settles_each_once(
    keys: list[bytes], failing: set[int], max_attempts: int, split: int, concurrency: int
) -> None:
    calls: list[Record] = []

    async def handler(record: Record) -> None:
        calls.append(record)
        await asyncio.sleep(0)
        if record.offset in failing:
            raise ValueError("fails")

    split = min(split, len(keys))
    pipe = _AsyncPipe(_parts(keys, split), len(keys))
    retry = RetryPolicy(max_attempts, 0.0, 0.0)
    worker = AsyncWorker(pipe, handler, Ordering.KEY, concurrency, retry)
    asyncio.run(asyncio.wait_for(worker.serve(), 10))
    _check(calls, keys, failing, max_attempts)
    _check_reports(_reports(pipe), keys, failing, max_attempts, split)


@pytest.mark.parametrize("packed", [False, True], ids=["list", "packed"])
def test_a_drop_forgets_held_and_queued_events_of_revoked_partitions_only(packed: bool) -> None:
    calls: list[tuple[int, int]] = []

    def handler(record: Record) -> None:
        calls.append((record.partition, record.offset))
        if (record.partition, record.offset, record.attempt) == (0, 0, 1):
            raise ValueError("fails once")

    worker, pipe = _worker(handler, max_attempts=3)
    worker._take(Parts([_part(0, 0, [_raw(0, b"k"), _raw(1, b"k")], packed)]))
    worker._take(Parts([_part(1, 1, [_raw(0, b"k")], packed)]))
    _run_next(worker)  # fails: key k of partition 0 waits for its retry
    worker._take(Drop({("t", 0): 0}))
    worker._take(Parts([_part(2, 0, [_raw(2, b"k")], packed)]))  # reassigned: a new part
    _drain(worker)
    assert calls == [(0, 0), (1, 0), (0, 2)]
    (report,) = _reports(pipe)
    assert sorted(report.dropped) == [(0, [0, 1])]
    assert sorted(report.finished) == [(1, None), (2, None)]


def test_a_key_waiting_for_its_retry_holds_its_later_events_in_a_packed_part() -> None:
    calls: list[tuple[int, int]] = []

    def handler(record: Record) -> None:
        calls.append((record.offset, record.attempt))
        if (record.offset, record.attempt) == (0, 1):
            raise ValueError("fails once")

    worker, pipe = _worker(handler, max_attempts=2, backoff_s=0.05)
    keys = [b"a", b"a", b"b", b"b"]
    worker._take(Parts([_part(0, 0, [_raw(o, k) for o, k in enumerate(keys)], True)]))
    _drain(worker)
    assert calls == [(0, 1), (2, 1), (3, 1), (0, 2), (1, 1)]
    assert sum(report.settled for report in _reports(pipe)) == 4


def test_a_part_run_stops_when_a_report_is_due_and_goes_on_first() -> None:
    calls: list[int] = []

    def handler(record: Record) -> None:
        calls.append(record.offset)
        if record.offset == 1:
            raise ValueError("gives up at once")

    worker, pipe = _worker(handler, max_attempts=1)
    worker._take(Parts([_part(0, 0, [_raw(offset, b"k") for offset in range(4)], True)]))
    worker._take(Parts([_part(1, 0, [_raw(4, b"k")], True)]))
    run = worker._next()
    assert isinstance(run, PartRun)
    worker._run_part(run, 0.0)  # the report is already due: one event, then back
    assert (calls, run.next, worker._ready[0]) == ([0], 1, run)
    worker._run_part(worker._next(), math.inf)  # type: ignore[arg-type]
    assert (calls, run.next, worker._ready[0]) == ([0, 1], 2, run), "after a failure"
    _drain(worker)
    assert calls == [0, 1, 2, 3, 4]
    (report,) = _reports(pipe)
    assert (report.handled, report.settled) == (5, 5)
    assert [(f[0], f[1], f[4]) for f in report.failures] == [(0, 1, True)]


def test_a_drop_arriving_mid_part_forgets_the_rest_of_it() -> None:
    calls: list[int] = []
    worker, pipe = _worker(lambda r: calls.append(r.offset), max_attempts=1)
    worker._take(Parts([_part(0, 0, [_raw(offset, b"k%d" % offset) for offset in range(5)], True)]))

    def handler(record: Record) -> None:
        calls.append(record.offset)
        if record.offset == 1:  # the poll thread revokes partition 0 meanwhile
            worker._inbox.put(Drop({("t", 0): 0}))

    worker._handler = handler
    _run_next(worker)  # stops after offset 1: a message arrived
    worker._take(worker._inbox.get())
    _drain(worker)
    assert calls == [0, 1]
    (report,) = _reports(pipe)
    assert report.dropped == [(0, [2, 3, 4])]
    assert report.finished == [(0, None)]  # the rest of the part: 0 and 1
    assert report.settled == 5


def test_a_resent_event_waits_its_backoff_and_holds_its_key() -> None:
    calls: list[tuple[int, int]] = []
    worker, _pipe = _worker(lambda r: calls.append((r.offset, r.attempt)), 4, backoff_s=0.05)
    worker._take(Parts([(0, "t", 0, [_raw(5, b"k"), _raw(6, b"k")], [2, 2])]))
    worker._take(Parts([(1, "t", 0, [_raw(7, b"k"), _raw(8, b"j")], None)]))
    _drain(worker)
    assert calls == [(8, 1), (5, 2), (6, 2), (7, 1)]


@given(
    sizes=st.lists(st.integers(min_value=1, max_value=5), min_size=1, max_size=30),
    data=st.data(),
)
def test_ranges_commit_only_below_the_first_unfinished_range(
    sizes: list[int], data: st.DataObject
) -> None:
    offsets = PartitionOffsets()
    starts: list[int] = []
    position = 0
    for size in sizes:
        offsets.add_range(position, position + size)
        starts.append(position)
        position += size
    ends = dict(zip(starts, [*starts[1:], position], strict=True))
    finished = data.draw(st.lists(st.sampled_from(starts), unique=True))
    for start in finished:
        offsets.finish(start, ends[start])
    unfinished = [start for start in starts if start not in finished]
    assert offsets.committable() == (unfinished[0] if unfinished else position)
    assert not offsets.add(position - 1), "a refetch inside a range is stale"


def test_a_forgotten_range_finishing_late_leaves_its_refetch_cut_differently_alone() -> None:
    offsets = PartitionOffsets()
    offsets.add_range(0, 10)
    offsets.add_range(10, 20)
    offsets.finish(0, 10)
    offsets.forget_from(10)
    offsets.add_range(10, 30)  # fetched again after the seek, in a larger chunk
    offsets.finish(10, 20)  # the old chunk reports late: its events are not all of these
    assert offsets.committable() == 10
    offsets.finish(10, 30)
    assert offsets.committable() == 30


@pytest.mark.parametrize(
    ("busy_s", "handled", "interval_s"),
    [(0.0, 0, 0.005), (0.000_1, 100, 0.005), (0.05, 500, 0.01), (1.0, 1000, 0.02)],
)
def test_a_report_carries_about_a_hundred_slow_events_but_waits_at_most_20_ms(
    busy_s: float, handled: int, interval_s: float
) -> None:
    worker, _pipe = _worker(lambda r: None, max_attempts=1)
    worker._busy_s, worker._handled = busy_s, handled
    assert worker._report_interval() == pytest.approx(interval_s)
