"""A chain of segments against a plain in-memory model, under any interleaving.

As for one ring (test_ring_model.py): appends, reads, acknowledgements, rewinds,
reopens and overflows must keep order, never hand out an acknowledged record again,
and lose unacknowledged records only through drop_oldest, which must count them. Here
the queue also grows by segments under a backlog and gives them back once sent.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import hypothesis.strategies as st
from hypothesis import event, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from eventspool.config import FullPolicy
from eventspool.errors import SpoolFullError
from eventspool.spool.ring import frame_size
from eventspool.spool.segments import SegmentedQueue
from tests.spool.segment_support import SEGMENT, Space, open_queue, segment_files

SEGMENTS = 3
MAX_PAYLOAD = 3000


class SegmentsModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.directory = Path(tempfile.mkdtemp(prefix="segments-model-"))
        self.policy = FullPolicy.REJECT
        self.space = Space()
        self.queue = self._open()
        self.queued: list[tuple[int, bytes]] = []
        self.cursor = 0
        self.next_seq = 0
        self.dropped = 0
        self.counter = 0

    def _open(self) -> SegmentedQueue:
        return open_queue(
            self.directory,
            segments=SEGMENTS,
            policy=self.policy,
            space=self.space,
            max_payload=MAX_PAYLOAD,
        )

    def _payload(self, size: int) -> bytes:
        self.counter += 1
        stamp = self.counter.to_bytes(8, "big")
        return (stamp * (size // 8 + 1))[:size]

    @rule(size=st.integers(1, MAX_PAYLOAD))
    def append(self, size: int) -> None:
        self._append(size)

    @rule(sizes=st.lists(st.integers(1, MAX_PAYLOAD), min_size=5, max_size=60))
    def append_burst(self, sizes: list[int]) -> None:
        """Enough traffic to chain segments and to reach the maximum."""
        for size in sizes:
            self._append(size)

    def _append(self, size: int) -> None:
        payload = self._payload(size)
        try:
            seq = self.queue.append(payload)
        except SpoolFullError:
            assert self.policy is FullPolicy.REJECT
            queued = sum(frame_size(len(p)) for _, p in self.queued) + frame_size(size)
            # Rejected only near the maximum: a segment's end may waste one frame.
            assert queued > SEGMENTS * (SEGMENT - 2 * frame_size(MAX_PAYLOAD)), "room left"
            event("rejected")
            return
        assert seq == self.next_seq
        self.next_seq += 1
        self.queued.append((seq, payload))
        self._account_drops()

    def _account_drops(self) -> None:
        """Drops remove the oldest records: what is left is a suffix of the model."""
        depth = self.queue.depth
        lost = len(self.queued) - depth
        if lost:
            assert self.policy is FullPolicy.DROP_OLDEST
            event("dropped")
            self.queued = self.queued[lost:]
            self.cursor = max(0, self.cursor - lost)
            self.dropped += lost

    @rule(max_records=st.integers(1, 80))
    def read(self, max_records: int) -> None:
        batch = self.queue.read_batch(max_records, 1 << 30)
        expected = self.queued[self.cursor : self.cursor + len(batch)]
        assert [(r.seq, r.payload) for r in batch] == expected
        if self.cursor < len(self.queued):
            assert batch, "records waiting but none handed out"
        self.cursor += len(batch)

    @precondition(lambda self: self.cursor > 0)
    @rule(data=st.data())
    def ack(self, data: st.DataObject) -> None:
        count = data.draw(st.integers(1, self.cursor))
        self.queue.ack(self.queued[count - 1][0])
        self.queued = self.queued[count:]
        self.cursor -= count

    @rule()
    def rewind(self) -> None:
        self.queue.rewind()
        self.cursor = 0

    @rule()
    def reopen(self) -> None:
        self.queue.close()
        self.queue = self._open()
        assert not self.queue.recovery.corrupt_tail
        self.cursor = 0

    @precondition(lambda self: self.policy is FullPolicy.REJECT)
    @rule()
    def switch_to_drop_oldest(self) -> None:
        self.queue.close()
        self.policy = FullPolicy.DROP_OLDEST
        self.queue = self._open()
        self.cursor = 0

    @invariant()
    def matches_the_model(self) -> None:
        assert self.queue.depth == len(self.queued)
        assert self.queue.next_seq == self.next_seq
        if self.queued:
            assert self.queue.head_seq == self.queued[0][0]
        assert self.queue.stats().dropped == self.dropped

    @invariant()
    def holds_only_what_its_backlog_needs(self) -> None:
        files = segment_files(self.directory)
        assert len(files) == self.queue.segments <= SEGMENTS
        assert self.space.used == self.queue.stats().allocated_bytes
        if not self.queued:
            assert self.queue.segments == 1

    def teardown(self) -> None:
        self.queue.close()
        shutil.rmtree(self.directory, ignore_errors=True)


SegmentsModel.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
TestSegmentsModel = SegmentsModel.TestCase
