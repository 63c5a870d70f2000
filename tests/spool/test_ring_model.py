"""The ring against a plain in-memory model, under any interleaving of operations.

The model is a list of (sequence, payload) still queued plus a cursor: what has been
handed out. Any sequence of append / read / ack / rewind / reopen / overflow must keep
order, never hand out an acknowledged record again, and lose unacknowledged records
only through drop_oldest, which must count them.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import hypothesis.strategies as st
from hypothesis import event, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from eventspool.config import FullPolicy, QueueSettings
from eventspool.errors import SpoolFullError
from eventspool.spool.ring import RingQueue, frame_size

CAPACITY = 64 * 1024
MAX_PAYLOAD = 3000
SLACK = 2 * frame_size(MAX_PAYLOAD)


class RingModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.directory = Path(tempfile.mkdtemp(prefix="ring-model-"))
        self.path = self.directory / "0.queue"
        self.policy = FullPolicy.REJECT
        self.ring = self._open()
        self.queued: list[tuple[int, bytes]] = []
        self.cursor = 0
        self.next_seq = 0
        self.dropped = 0
        self.counter = 0

    def _open(self) -> RingQueue:
        return RingQueue.open(
            self.path,
            QueueSettings(capacity_bytes=CAPACITY, full_policy=self.policy),
            max_payload=MAX_PAYLOAD,
        )

    def _queued_bytes(self, records: list[tuple[int, bytes]]) -> int:
        return sum(frame_size(len(payload)) for _, payload in records)

    def _payload(self, size: int) -> bytes:
        self.counter += 1
        stamp = self.counter.to_bytes(8, "big")
        return (stamp * (size // 8 + 1))[:size]

    @rule(size=st.integers(1, MAX_PAYLOAD))
    def append(self, size: int) -> None:
        self._append(size)

    @rule(sizes=st.lists(st.integers(1, MAX_PAYLOAD), min_size=5, max_size=40))
    def append_burst(self, sizes: list[int]) -> None:
        """Enough traffic to wrap the ring and to fill it."""
        for size in sizes:
            self._append(size)

    def _append(self, size: int) -> None:
        payload = self._payload(size)
        dropped_before = self.ring.stats().dropped
        try:
            seq = self.ring.append(payload)
        except SpoolFullError:
            assert self.policy is FullPolicy.REJECT
            needed = self._queued_bytes(self.queued) + frame_size(size)
            assert needed > CAPACITY - SLACK, "rejected although there was room"
            event("rejected")
            return
        assert seq == self.next_seq
        self.next_seq += 1
        newly_dropped = self.ring.stats().dropped - dropped_before
        if newly_dropped:
            assert self.policy is FullPolicy.DROP_OLDEST
            remaining = self.queued[newly_dropped - 1 :]
            needed = self._queued_bytes(remaining) + frame_size(size)
            assert needed > CAPACITY - SLACK, "dropped more than needed"
            del self.queued[:newly_dropped]
            self.cursor = max(0, self.cursor - newly_dropped)
            self.dropped += newly_dropped
            event("dropped")
        if self.ring.stats().tail_position > CAPACITY:
            event("wrapped")
        self.queued.append((seq, payload))

    @rule(max_records=st.integers(1, 50), max_bytes=st.integers(1, 20000))
    def read(self, max_records: int, max_bytes: int) -> None:
        batch = self.ring.read_batch(max_records, max_bytes)
        expected = self.queued[self.cursor : self.cursor + len(batch)]
        assert [(r.seq, r.payload) for r in batch] == expected
        if self.cursor < len(self.queued):
            assert batch, "records were waiting but none was handed out"
        self.cursor += len(batch)

    @precondition(lambda self: self.cursor > 0)
    @rule(data=st.data())
    def ack(self, data: st.DataObject) -> None:
        count = data.draw(st.integers(1, self.cursor))
        self.ring.ack(self.queued[count - 1][0])
        del self.queued[:count]
        self.cursor -= count

    @rule()
    def ack_stale(self) -> None:
        """Acknowledging below the head (a record already gone) never moves it back."""
        if self.queued and self.queued[0][0] > 0:
            self.ring.ack(self.queued[0][0] - 1)

    @rule()
    def rewind(self) -> None:
        self.ring.rewind()
        self.cursor = 0

    @rule(policy=st.sampled_from([FullPolicy.REJECT, FullPolicy.DROP_OLDEST]), clean=st.booleans())
    def reopen(self, policy: FullPolicy, clean: bool) -> None:
        """Close (or just abandon, as a crash would) and open again, maybe with a new policy."""
        if clean:
            self.ring.close()
        self.policy = policy
        self.ring = self._open()
        assert self.ring.recovery.skipped_records == 0
        assert not self.ring.recovery.corrupt_tail
        self.cursor = 0

    @invariant()
    def counters_agree(self) -> None:
        stats = self.ring.stats()
        assert stats.depth == len(self.queued)
        assert stats.dropped == self.dropped
        assert stats.next_seq == self.next_seq
        assert stats.bytes <= CAPACITY

    def teardown(self) -> None:
        self.ring.close()
        shutil.rmtree(self.directory, ignore_errors=True)


RingModel.TestCase.settings = settings(max_examples=200, stateful_step_count=60)
TestRingModel = RingModel.TestCase
