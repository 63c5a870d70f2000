# Which ring an event goes to, and the compiled send. Included by native.pyx.

import random as _random


def _eligible(int partition_count, available):
    """Partitions a sticky switch may choose from; all of them when none is known to lead.

    Kafka falls back to every partition when none has a live leader, since queueing on
    any partition beats rejecting the event.
    """
    if available:
        usable = sorted({p for p in available if 0 <= p < partition_count})
        if usable:
            return usable
    return range(partition_count)


cdef class StickyPartitioner:
    """Spread keyless events like Kafka's built-in sticky partitioner (KIP-480).

    Sticking to one partition until about `batch_bytes` have gone to it yields full
    batches (fewer requests, better compression) while random switching still spreads
    load over time. A switch prefers a partition other than the current one, when there
    is a choice, so a full batch is not followed by more data for the same partition.
    The event that reaches `batch_bytes` still goes to the current partition (as in
    Kafka); the next one switches. Safe to share between threads: a choice is made
    under the interpreter lock.
    """

    cdef readonly Py_ssize_t batch_bytes
    cdef object _rng
    cdef int _current
    cdef Py_ssize_t _produced
    # The frozenset of available partitions last found to hold `_current`: the same set
    # again needs no lookup (a boxed int and a hash per event otherwise).
    cdef object _current_available_in

    def __init__(self, Py_ssize_t batch_bytes=16384, rng=None) -> None:
        if batch_bytes < 1:
            raise ValueError(f"batch_bytes must be at least 1, got {batch_bytes}")
        self.batch_bytes = batch_bytes
        self._rng = rng if rng is not None else _random.Random()
        self._current = -1
        self._produced = 0

    cdef int choose(self, int partition_count, Py_ssize_t size, object available) except -1:
        cdef int current = self._current
        if not (
            self._produced < self.batch_bytes
            and 0 <= current < partition_count
            and (
                not available
                or available is self._current_available_in
                or self._available_holds_current(available)
            )
        ):
            eligible = _eligible(partition_count, available)
            if self._produced >= self.batch_bytes or current not in eligible:
                current = self._pick(eligible, current)
                self._current = current
                self._current_available_in = None
                self._produced = 0
        self._produced += size
        return current

    cdef bint _available_holds_current(self, available) except -1:
        if self._current not in available:
            return False
        if type(available) is frozenset:  # a list or set may change in place
            self._current_available_in = available
        return True

    cdef int _pick(self, eligible, int current) except -1:
        """Draw uniformly among `eligible`, excluding `current` when possible."""
        cdef Py_ssize_t count = len(eligible)
        if count == 1:
            return eligible[0]
        if current not in eligible:
            return eligible[self._rng.randrange(count)]
        # Draw from the first count-1 slots and let the last stand in for the current
        # partition: uniform over the others, one draw only.
        choice = eligible[self._rng.randrange(count - 1)]
        return eligible[count - 1] if choice == current else choice

    def partition(self, int partition_count, Py_ssize_t size, available=None) -> int:
        """The partition for a keyless event of `size` bytes.

        `available` lists partitions whose leader is reachable; an empty or missing list
        means "no information", so every partition is allowed.
        """
        if partition_count < 1:
            raise ValueError(f"partition_count must be at least 1, got {partition_count}")
        if size < 0:
            raise ValueError(f"size must not be negative, got {size}")
        return self.choose(partition_count, size, available)


cdef class TopicRoute:
    """The routing state of one topic that `send()` reads on every event.

    The partition count (None while unknown: events then wait in the pending ring),
    the partitions whose leader is reachable, the sticky partitioner and the rings
    opened so far. TopicQueues (spool/registry.py) owns the rings and decides when
    these change; `send` only reads them.
    """

    cdef readonly str name
    cdef int _count
    cdef list _rings
    cdef public object available
    cdef readonly StickyPartitioner sticky
    cdef EventIdGenerator _ids
    cdef Py_ssize_t _max_event

    def __init__(
        self, str name, partition_count, StickyPartitioner sticky not None,
        EventIdGenerator ids not None, Py_ssize_t max_event_bytes,
    ) -> None:
        self.name = name
        self._rings = []
        self._count = -1
        self.available = None
        self.sticky = sticky
        self._ids = ids
        self._max_event = max_event_bytes
        self.partition_count = partition_count

    @property
    def partition_count(self):
        return None if self._count < 0 else self._count

    @partition_count.setter
    def partition_count(self, count) -> None:
        if count is None:
            self._count = -1
            return
        self._count = count
        if len(self._rings) < count:
            self._rings.extend([None] * (count - len(self._rings)))

    def set_ring(self, int partition, RingCore ring) -> None:
        """Let `send` write to `ring` for `partition` (None: not any more)."""
        if len(self._rings) <= partition:
            self._rings.extend([None] * (partition + 1 - len(self._rings)))
        self._rings[partition] = ring

    def choose(self, key, Py_ssize_t size) -> int:
        """The partition of an event once the count is known: murmur2 of the key, or sticky."""
        if key is None:
            return self.sticky.choose(self._count, size, self.available)
        return (es_murmur2(PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key)) & 0x7FFFFFFF) % self._count

    def send(self, key, value):
        """Write one event without headers straight into its ring: its event_id, or None.

        None means Python must take the event: the count is unknown, the ring is not
        open, full, busy, closed or durable by fsync, or the event is too large. The
        types of `key` and `value` (bytes or None) were checked by the caller.
        """
        return self._send(key, value)

    cdef object _send(self, key, value):
        cdef Py_ssize_t klen, vlen, size
        cdef int partition
        cdef int64_t now
        cdef char event_id[ID_LEN]
        cdef const char *k = _bytes_or_null(key, &klen)
        cdef const char *v = _bytes_or_null(value, &vlen)
        size = _envelope_size(klen, vlen, -1)
        if self._count < 0 or size > self._max_event:
            return None
        if k == NULL:
            partition = self.sticky.choose(self._count, size, self.available)
        else:
            partition = (es_murmur2(k, klen) & 0x7FFFFFFF) % self._count
        ring = self._rings[partition]
        if ring is None:
            return None
        now = self._ids.now_ms()
        self._ids.make_into(now, event_id)
        if (<RingCore>ring).write_envelope(event_id, now, k, klen, v, vlen) < 0:
            return None
        return _ascii(event_id, ID_LEN)


cdef class SpoolFront:
    """The compiled front of `Spool.send()`: the common case without a Python frame.

    An event without headers or exchange, for a topic already open, with a bytes (or
    None) value and key, is written by its TopicRoute here. Anything else, and anything
    the route gives back, goes to `_send_python`, the Python path that checks every
    argument, applies the policies and raises the errors.
    """

    cdef public dict _routes

    def __cinit__(self, *args, **kwargs):
        self._routes = {}

    def send(self, topic, value, key=None, headers=None, exchange=None, routing_key="", event_id=None):
        """Spool one event and return its event_id once it is durable.

        `value=None` is a tombstone (delete marker for compacted topics), distinct from
        `b""`. Raises InvalidEventError for a bad topic, value, key, header or event_id,
        or an event over `max_event_bytes`; SpoolFullError when the queue is full under
        `reject` (or `block` timed out). With `exchange` (and `topic=None`) the event is
        routed by `routing_key` instead. `event_id` (a UUID) replaces the id eventspool
        would give the event: a retry that reuses it is recognised downstream as a copy.
        """
        if exchange is None and headers is None and event_id is None and type(topic) is str:
            route = self._routes.get(topic)
            if (
                route is not None
                and (value is None or type(value) is bytes)
                and (key is None or type(key) is bytes)
            ):
                event_id = (<TopicRoute>route)._send(key, value)
                if event_id is not None:
                    return event_id
        return self._send_python(topic, value, key, headers, exchange, routing_key, event_id)
