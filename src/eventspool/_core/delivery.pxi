# The sender's per-record work: produce a drained batch, account each delivery report.
# Included by native.pyx. What to do with a failure stays in Python (sender/sender.py).

from collections import deque as _deque


cdef class AckTracker:
    """Per-queue bookkeeping of records sent and acknowledged by the broker.

    The read position may move only to the end of the longest prefix the broker has
    acknowledged: a record acknowledged after a gap waits for the gap to close.
    """

    cdef public uint64_t acked_until
    cdef uint64_t _next_send
    cdef set _done
    cdef public Py_ssize_t in_flight
    cdef public bint failed

    def __init__(self, uint64_t first_seq) -> None:
        self.reset(first_seq)

    def reset(self, uint64_t first_seq) -> None:
        """Start over at `first_seq` (the queue's head) after a rewind."""
        self.acked_until = first_seq
        self._next_send = first_seq
        self._done = set()
        self.in_flight = 0
        self.failed = False

    cpdef void sent(self, uint64_t seq) except *:
        if seq > self._next_send:
            # drop_oldest removed records before they were read: nothing to wait for.
            self._done.update(range(self._next_send, seq))
        self._next_send = seq + 1
        self.in_flight += 1

    cpdef bint completed(self, uint64_t seq) except -1:
        """Note a final outcome for `seq`; True when the acknowledged prefix grew."""
        cdef uint64_t start = self.acked_until
        self.in_flight -= 1
        if seq < start:
            return False
        if seq == start and not self._done:
            self.acked_until = seq + 1
            return True
        self._done.add(seq)
        while self.acked_until in self._done:
            self._done.discard(self.acked_until)
            self.acked_until += 1
        return self.acked_until > start

    def failed_transiently(self) -> None:
        self.in_flight -= 1
        self.failed = True


cdef class Deliveries:
    """The delivery-report callback of one queue, and the sequences it has in flight.

    Reports of one partition arrive in produce order (librdkafka keeps it, and the
    idempotent producer guarantees it), so each report is for the oldest sequence in
    flight. A success is accounted here; a failure goes to `on_failure(seq, error,
    message)`, the sender's policy. `advanced` tells the sender that the acknowledged
    prefix grew since it last moved the read position.
    """

    cdef readonly AckTracker tracker
    cdef object _in_flight
    cdef object _on_failure
    cdef public bint advanced
    cdef public Py_ssize_t delivered
    cdef public Py_ssize_t stopped_at

    def __init__(self, AckTracker tracker not None, on_failure) -> None:
        self.tracker = tracker
        self._in_flight = _deque()
        self._on_failure = on_failure
        self.advanced = False
        self.delivered = 0
        self.stopped_at = -1

    def __call__(self, error, message) -> None:
        seq = self._in_flight.popleft()
        if error is None:
            self.delivered += 1
            if self.tracker.completed(seq):
                self.advanced = True
        else:
            self._on_failure(seq, error, message)

    def queued(self, uint64_t seq) -> None:
        """`seq` was handed to librdkafka: its report comes after those before it."""
        self._in_flight.append(seq)

    def produce_batch(self, produce, str topic, int partition, list batch, Py_ssize_t start) -> int:
        """Produce batch[start:] in order (records of RingCore.read_for_kafka).

        Returns the index of the first record not produced: len(batch) when all went,
        or an undecodable record's (headers None) for the caller to dead-letter. When
        produce() raises, `stopped_at` is that record's index and the exception
        propagates: waiting for room and sorting errors are the caller's.
        """
        cdef Py_ssize_t i, count = len(batch)
        cdef tuple record
        cdef AckTracker tracker = self.tracker
        append = self._in_flight.append
        for i in range(start, count):
            record = <tuple>batch[i]
            headers = record[4]
            if headers is None:
                return i
            seq = record[0]
            tracker.sent(seq)
            self.stopped_at = i
            # Positionally: (topic, value, key, partition, callback, on_delivery,
            # timestamp, headers). Keyword arguments cost produce() twice the parsing.
            produce(topic, record[2], record[1], partition, self, None, record[3], headers)
            append(seq)
        self.stopped_at = -1
        return count
