"""A queue as a chain of segments: it grows with its backlog and shrinks once it is sent."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from eventspool._core.native import RingCore
from eventspool.clock import ManualClock
from eventspool.config import FullPolicy, QueueSettings
from eventspool.errors import CorruptQueueError, SpoolFullError
from eventspool.spool.ring import RingQueue, create_file
from eventspool.spool.segment_files import parse_segment_name, segment_path
from eventspool.spool.segments import SegmentedQueue
from eventspool.spool.spares import SPARES_KEPT, SPARES_MADE_AHEAD, SPARES_TRIM_S
from tests.spool.segment_support import SEGMENT, Space, open_queue, segment_files

PAYLOAD = b"x" * 1000  # 1032-byte frames: 63 fit in one segment


def fill(append: Callable[[bytes], int], count: int) -> list[int]:
    return [append(PAYLOAD) for _ in range(count)]


def drain(queue: SegmentedQueue) -> list[int]:
    """Read everything and acknowledge it."""
    seqs: list[int] = []
    while batch := queue.read_batch(1000, 1 << 30):
        seqs.extend(record.seq for record in batch)
    if seqs:
        queue.ack(seqs[-1])
    return seqs


def test_names_of_segment_files() -> None:
    assert segment_path(Path("d"), "3", 0).name == "3.queue"
    assert segment_path(Path("d"), "3", 12).name == "3.12.queue"
    assert parse_segment_name("3.queue") == ("3", 0)
    assert parse_segment_name("pending.7.queue") == ("pending", 7)
    for other in ("3.0.queue", "x.queue", "3.queue.tmp", "3.a.queue", "partitions.json"):
        assert parse_segment_name(other) is None


def test_at_rest_a_queue_is_one_segment(tmp_path: Path) -> None:
    with open_queue(tmp_path) as queue:
        for _ in range(20):  # three segments in all, never more than 10 records queued
            fill(queue.append, 10)
            drain(queue)
        assert segment_files(tmp_path) == ["0.queue"]


def test_a_backlog_chains_segments_and_sequences_go_on(tmp_path: Path) -> None:
    with open_queue(tmp_path) as queue:
        seqs = fill(queue.append, 150)
        assert seqs == list(range(150))
        assert segment_files(tmp_path) == ["0.1.queue", "0.2.queue", "0.queue"]
        assert queue.segments == 3 and queue.depth == 150
        assert drain(queue) == seqs


def test_acknowledged_segments_are_deleted_and_the_budget_gets_them_back(tmp_path: Path) -> None:
    space = Space()
    with open_queue(tmp_path, space=space) as queue:
        fill(queue.append, 150)
        at_peak = space.used
        assert at_peak >= 3 * SEGMENT
        batch = queue.read_batch(100, 1 << 30)
        queue.ack(batch[-1].seq)  # past the first segment
        assert segment_files(tmp_path) == ["0.1.queue", "0.2.queue"]
        drain(queue)
        assert segment_files(tmp_path) == ["0.2.queue"]
        assert space.used == at_peak // 3
        assert queue.stats().allocated_bytes == space.used


def test_a_reopened_chain_keeps_order_and_positions(tmp_path: Path) -> None:
    with open_queue(tmp_path) as queue:
        fill(queue.append, 150)
        queue.read_batch(80, 1 << 30)  # one segment per call
        queue.ack(queue.read_batch(17, 1 << 30)[-1].seq)
    with open_queue(tmp_path) as queue:
        assert queue.head_seq == 80 and queue.next_seq == 150
        assert queue.recovery.records == 70 and not queue.recovery.corrupt_tail
        assert drain(queue) == list(range(80, 150))
        assert queue.append(PAYLOAD) == 150


def test_reject_at_the_maximum(tmp_path: Path) -> None:
    with open_queue(tmp_path, segments=2) as queue:
        fill(queue.append, 126)
        with pytest.raises(SpoolFullError, match=r"full: 2 segment.*policy reject"):
            queue.append(PAYLOAD)
        assert queue.depth == 126


def test_the_budget_bounds_growth(tmp_path: Path) -> None:
    space = Space(limit=2 * (SEGMENT + 4096))
    with open_queue(tmp_path, segments=8, space=space) as queue:
        fill(queue.append, 126)
        with pytest.raises(SpoolFullError, match="disk budget"):
            queue.append(PAYLOAD)
        drain(queue)
        fill(queue.append, 63)  # the room came back


def test_drop_oldest_deletes_the_oldest_segment_and_counts_it(tmp_path: Path) -> None:
    with open_queue(tmp_path, segments=2, policy=FullPolicy.DROP_OLDEST) as queue:
        fill(queue.append, 126)
        assert queue.append(PAYLOAD) == 126
        assert queue.stats().dropped == 63
        assert queue.head_seq == 63
        assert drain(queue) == list(range(63, 127))
    with open_queue(tmp_path, segments=2, policy=FullPolicy.DROP_OLDEST) as queue:
        assert queue.stats().dropped == 63


def test_drop_oldest_under_an_exhausted_budget_drops_inside_the_ring(tmp_path: Path) -> None:
    space = Space(limit=SEGMENT + 4096)
    with open_queue(tmp_path, policy=FullPolicy.DROP_OLDEST, space=space) as queue:
        fill(queue.append, 100)
        assert queue.segments == 1
        assert queue.stats().dropped == 100 - queue.depth


def test_a_segment_dropped_while_in_flight_does_not_move_the_position_back(
    tmp_path: Path,
) -> None:
    with open_queue(tmp_path, segments=2, policy=FullPolicy.DROP_OLDEST) as queue:
        fill(queue.append, 126)
        in_flight = queue.read_batch(10, 1 << 30)
        queue.append(PAYLOAD)  # drops the segment being sent
        queue.ack(in_flight[-1].seq)
        assert queue.head_seq == 63
        assert queue.read_batch(1000, 1 << 30)[0].seq == 63


def test_block_waits_for_the_sender(tmp_path: Path) -> None:
    with open_queue(tmp_path, segments=2, policy=FullPolicy.BLOCK) as queue:
        fill(queue.append, 126)
        batch = queue.read_batch(63, 1 << 30)
        threading.Timer(0.2, queue.ack, (batch[-1].seq,)).start()
        started = time.monotonic()
        assert queue.append(PAYLOAD) == 126
        assert time.monotonic() - started >= 0.15


def test_block_times_out(tmp_path: Path) -> None:
    with open_queue(tmp_path, segments=2, policy=FullPolicy.BLOCK, block_timeout_s=0.1) as queue:
        fill(queue.append, 126)
        with pytest.raises(SpoolFullError, match="policy block"):
            queue.append(PAYLOAD)


def test_append_many_crosses_segments(tmp_path: Path) -> None:
    with open_queue(tmp_path) as queue:
        assert queue.append_many([PAYLOAD] * 150) == 0
        assert queue.segments == 3
        assert drain(queue) == list(range(150))


def test_the_write_core_follows_the_chain(tmp_path: Path) -> None:
    seen: list[RingCore] = []
    with open_queue(tmp_path) as queue:
        first = queue.write_core
        queue._on_write_core = seen.append
        fill(queue.append, 64)
        assert seen == [queue.write_core] and queue.write_core is not first
        assert first.sealed


def test_a_crash_leftover_of_segment_creation_is_removed(tmp_path: Path) -> None:
    with open_queue(tmp_path):
        pass
    (tmp_path / "0.1.queue.tmp").write_bytes(b"half a segment")
    with open_queue(tmp_path) as queue:
        assert segment_files(tmp_path) == ["0.queue"]
        assert queue.segments == 1


def test_a_fully_acknowledged_old_segment_left_by_a_crash_is_deleted(tmp_path: Path) -> None:
    with open_queue(tmp_path) as queue:
        fill(queue.append, 70)
        drain(queue)
    # As if the process died between persisting the acknowledgement and the unlink:
    create_file(tmp_path / "0.queue", SEGMENT)
    with open_queue(tmp_path) as queue:
        assert segment_files(tmp_path) == ["0.1.queue"]
        assert queue.head_seq == queue.next_seq == 70


def test_overlapping_segments_are_damage(tmp_path: Path) -> None:
    with open_queue(tmp_path) as queue:
        fill(queue.append, 70)
    create_file(tmp_path / "0.2.queue", SEGMENT, head_seq=5)
    with RingQueue.open(tmp_path / "0.2.queue", QueueSettings(capacity_bytes=SEGMENT)) as ring:
        ring.append(PAYLOAD)
    with pytest.raises(CorruptQueueError, match="starts at sequence 5"):
        open_queue(tmp_path)


def test_a_version_1_ring_is_the_first_segment(tmp_path: Path) -> None:
    """A version-1 queue file (32 MiB by default then) opens as segment 0 and drains."""
    v1 = QueueSettings(capacity_bytes=32 * 1024 * 1024, segment_bytes=32 * 1024 * 1024)
    with RingQueue.open(tmp_path / "0.queue", v1) as ring:
        for _ in range(5):
            ring.append(PAYLOAD)
    with open_queue(tmp_path) as queue:
        assert queue.capacity == 32 * 1024 * 1024
        assert drain(queue) == list(range(5))


def run_all(jobs: list[Callable[[], None]]) -> None:
    while jobs:
        jobs.pop(0)()


def test_a_growing_queue_makes_its_next_segments_ahead_of_need(tmp_path: Path) -> None:
    """After the first chain, spares are made in the background; the next chains take
    them (no file work on the writer's path); emptied
    segments are recycled as spares while the backlog lasts; once it is gone the spares
    are deleted, so a queue at rest is one file again."""
    jobs: list[Callable[[], None]] = []
    space = Space()
    with open_queue(tmp_path, segments=8, space=space, background=jobs.append) as queue:
        fill(queue.append, 64)
        assert len(jobs) == SPARES_MADE_AHEAD
        run_all(jobs)
        assert spare_files(tmp_path) == [f"0.spare.{k + 1}" for k in range(SPARES_MADE_AHEAD)]
        assert queue.stats().allocated_bytes == space.used
        last_made = queue._spares.ready[-1].ring.core
        fill(queue.append, 63)
        assert queue.write_core is last_made
        assert segment_files(tmp_path) == ["0.1.queue", "0.2.queue", "0.queue"]
        assert len(spare_files(tmp_path)) == SPARES_MADE_AHEAD - 1 and len(jobs) == 1
        run_all(jobs)
        queue.ack(queue.read_batch(63, 1 << 30)[-1].seq)  # segment 0 emptied: kept
        assert len(spare_files(tmp_path)) == SPARES_MADE_AHEAD + 1
        assert drain(queue) == list(range(63, 127))
        assert sorted(p.name for p in tmp_path.iterdir()) == ["0.2.queue"]
        assert space.used == queue.stats().allocated_bytes
    with open_queue(tmp_path, segments=8) as queue:
        assert queue.head_seq == queue.next_seq == 127


def test_an_emptied_segment_is_recycled_while_the_backlog_lasts(tmp_path: Path) -> None:
    jobs: list[Callable[[], None]] = []
    with open_queue(tmp_path, segments=8, background=jobs.append) as queue:
        fill(queue.append, 64 + 63 + 63)  # segments 0..3, no spare made yet
        assert queue.segments == 4 and spare_files(tmp_path) == []
        jobs.clear()
        first = queue._segments[0].ring.core
        queue.ack(queue.read_batch(63, 1 << 30)[-1].seq)
        assert spare_files(tmp_path) == [f"0.spare.{SPARES_MADE_AHEAD + 1}"]
        fill(queue.append, 63)
        assert queue.write_core is first and not first.sealed
        assert drain(queue) == list(range(63, 253))


def test_a_backlog_keeps_as_many_spares_as_it_was_longer_until_they_go_unused(
    tmp_path: Path,
) -> None:
    """Under a backlog that comes back, the segments it emptied are taken again rather
    than made again; the ones no chain took for SPARES_TRIM_S are deleted."""
    clock = ManualClock()
    jobs: list[Callable[[], None]] = []
    settings = QueueSettings(capacity_bytes=16 * SEGMENT, segment_bytes=SEGMENT)
    space = Space()
    with SegmentedQueue(
        tmp_path, "0", settings, space, clock, max_payload=3000, background=jobs.append
    ) as queue:
        fill(queue.append, 8 * 63)
        longest = queue.segments
        jobs.clear()
        while queue.segments > 2:
            queue.ack(queue.read_batch(63, 1 << 30)[-1].seq)
        assert len(queue._spares.ready) == longest - 2 > SPARES_KEPT
        made = space.used
        fill(queue.append, (longest - 3) * 63)  # the backlog comes back: nothing made
        assert space.used == made and len(queue._spares.ready) == 1
        while queue.segments > 2:
            queue.ack(queue.read_batch(63, 1 << 30)[-1].seq)
        assert len(queue._spares.ready) == longest - 2
        clock.advance(SPARES_TRIM_S)
        queue.ack(queue.read_batch(1, 1 << 30)[-1].seq)
        assert len(queue._spares.ready) == longest - 3  # one was never taken meanwhile
        clock.advance(SPARES_TRIM_S)
        queue.ack(queue.read_batch(1, 1 << 30)[-1].seq)
        assert len(queue._spares.ready) == SPARES_KEPT  # none was taken meanwhile
        assert space.used == queue.stats().allocated_bytes
        assert len(spare_files(tmp_path)) == SPARES_KEPT


def test_a_writer_that_finds_no_spare_waits_for_the_one_being_made(tmp_path: Path) -> None:
    """Rather than make its own, slower, with the queue's lock held, while the one being
    made would end up deleted."""
    timers: list[threading.Timer] = []

    def later(job: Callable[[], None]) -> None:
        timers.append(threading.Timer(0.01, job))
        timers[-1].start()

    with open_queue(tmp_path, segments=8, background=later) as queue:
        made: list[RingQueue] = []
        create_ring = queue._spares._create_ring

        def recorded(path: Path) -> tuple[RingQueue, int]:
            ring, allocated = create_ring(path)
            made.append(ring)
            return ring, allocated

        queue._spares._create_ring = recorded
        fill(queue.append, 64)  # the first chain: made on the spot, then spares asked for
        assert not made
        fill(queue.append, 63)  # the next one at once: its spare is still being made
        assert queue.writer in made
        for timer in timers:
            timer.join()
        assert drain(queue) == list(range(127))


def spare_files(directory: Path) -> list[str]:
    return sorted(path.name for path in directory.glob("*.spare.*"))


def test_a_spare_left_by_a_crash_is_removed(tmp_path: Path) -> None:
    create_file(tmp_path / "0.spare.4", SEGMENT)
    with open_queue(tmp_path) as queue:
        assert sorted(p.name for p in tmp_path.iterdir()) == ["0.queue"]
        assert queue.segments == 1


def test_a_renamed_spare_whose_new_header_was_lost_starts_after_the_one_before(
    tmp_path: Path,
) -> None:
    """A power cut after the rename but before its rewritten header reached the disk."""
    with open_queue(tmp_path) as queue:
        fill(queue.append, 10)
    create_file(tmp_path / "0.1.queue", SEGMENT)  # a spare's header: sequence 0
    with open_queue(tmp_path) as queue:
        assert queue.segments == 2 and queue.next_seq == 10
        assert queue.append(PAYLOAD) == 10
        assert drain(queue) == list(range(11))


def test_a_renamed_spare_that_lost_its_whole_header_is_deleted(tmp_path: Path) -> None:
    """A power cut before anything of a spare reached the disk: no header at all."""
    with open_queue(tmp_path) as queue:
        fill(queue.append, 10)
    with (tmp_path / "0.1.queue").open("wb") as handle:
        handle.truncate(4096 + SEGMENT)
    with open_queue(tmp_path) as queue:
        assert segment_files(tmp_path) == ["0.queue"]
        assert queue.append(PAYLOAD) == 10
