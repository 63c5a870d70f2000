"""Per-queue bookkeeping of records sent and acknowledged by the broker.

The read position may move only to the end of the longest prefix the broker has
acknowledged: a record acknowledged after a gap waits for the gap to close.
"""

from __future__ import annotations


class AckTracker:
    def __init__(self, first_seq: int) -> None:
        self.reset(first_seq)

    def reset(self, first_seq: int) -> None:
        """Start over at `first_seq` (the queue's head) after a rewind."""
        self.acked_until = first_seq
        self._next_send = first_seq
        self._done: set[int] = set()
        self.in_flight = 0
        self.failed = False

    def sent(self, seq: int) -> None:
        if seq > self._next_send:
            # drop_oldest removed records before they were read: nothing to wait for.
            self._done.update(range(self._next_send, seq))
        self._next_send = seq + 1
        self.in_flight += 1

    def completed(self, seq: int) -> bool:
        """Note a final outcome for `seq`; True when the acknowledged prefix grew."""
        self.in_flight -= 1
        if seq < self.acked_until:
            return False
        self._done.add(seq)
        start = self.acked_until
        while self.acked_until in self._done:
            self._done.discard(self.acked_until)
            self.acked_until += 1
        return self.acked_until > start

    def failed_transiently(self) -> None:
        self.in_flight -= 1
        self.failed = True
