# The record area of one ring file (format: eventspool/spool/ring.py). Included by native.pyx.
#
# Frame, at a logical position p stored at 4096 + p % capacity, 8-byte aligned:
#     0   4  payload length; bit 31 marks a padding frame that runs to the area's end
#     4   4  crc32c of bytes 8..32+length, continuing from the length word
#     8   8  sequence          16  8  append time ms
#     24  4  writer generation 28  4  zero
#     32  n  payload, padded to a multiple of 8
# The length word is stored last: a record is visible only once it is complete.
# Position slots at 64 and 128: counter, head, head sequence, generation, dropped,
# skipped (u64 each), then the crc32c of those 48 bytes.

cdef enum:
    HEADER_SIZE = 4096
    PAGE = 4096  # the record area's capacity is a whole number of pages
    FRAME_HEADER = 32
    HINT_OFFSET = 32
    SLOT_A = 64
    SLOT_B = 128
    SLOT_SIZE = 48
cdef const uint32_t PADDING_FLAG = 0x80000000
cdef const uint32_t LENGTH_MASK = 0x7FFFFFFF

# The sizes and offsets above, for ring.py, which creates the file and reads its header:
# defined here once.
RING_HEADER_SIZE = HEADER_SIZE
RING_PAGE = PAGE
RING_FRAME_HEADER_SIZE = FRAME_HEADER
RING_SLOT_OFFSETS = (SLOT_A, SLOT_B)

# Outcomes of a write that Python turns into its own errors and policies.
APPEND_FULL = -1
APPEND_CLOSED = -2
APPEND_BAD_LENGTH = -3
ACK_DONE = 0
ACK_NOTHING = 1
ACK_NOT_HANDED_OUT = -4


cdef extern from "fault_in.h":
    ctypedef struct es_fault_in:
        pass
    void es_fault_in_writable(char *data, size_t size) nogil
    void es_fault_in_join(es_fault_in *job) nogil
    int es_fault_in_start(es_fault_in *job, char *data, size_t size) nogil


cdef inline uint64_t _frame_size(uint64_t length) noexcept nogil:
    return (FRAME_HEADER + length + 7) & ~(<uint64_t>7)


cdef class RingCore:
    """The positions and bytes of one mapped ring; RingQueue (ring.py) owns its policy."""

    cdef Py_buffer _view
    cdef bint _has_view
    cdef char *_map
    cdef char *_area
    cdef pthread_mutex_t _lock
    cdef readonly uint64_t capacity
    cdef readonly uint64_t head
    cdef readonly uint64_t head_seq
    cdef readonly uint64_t tail
    cdef readonly uint64_t next_seq
    cdef readonly uint64_t read
    cdef readonly uint64_t read_seq
    cdef readonly uint64_t slot_counter
    cdef readonly uint64_t dropped
    cdef readonly uint64_t skipped
    cdef readonly uint32_t generation
    cdef readonly uint64_t max_payload
    cdef readonly bint writable
    cdef readonly bint closed
    cdef public bint sealed
    cdef public bint drop_oldest
    cdef bint _fast
    cdef es_fault_in _fault_in

    def __cinit__(
        self, mm, uint64_t capacity, tuple slot, uint64_t max_payload,
        bint drop_oldest, bint fast, bint writable,
    ):
        pthread_mutex_init(&self._lock, NULL)
        PyObject_GetBuffer(mm, &self._view, PyBUF_WRITABLE if writable else PyBUF_SIMPLE)
        self._has_view = True
        if <uint64_t>self._view.len < HEADER_SIZE + capacity or capacity < PAGE:
            raise ValueError(f"a mapping of {self._view.len} bytes cannot hold capacity {capacity}")
        self._map = <char *>self._view.buf
        self._area = self._map + HEADER_SIZE
        self.capacity = capacity
        self.slot_counter, self.head, self.head_seq, generation, self.dropped, self.skipped = slot
        self.generation = <uint32_t>generation
        self.tail = self.read = self.head
        self.next_seq = self.read_seq = self.head_seq
        self.max_payload = min(max_payload, capacity // 4)
        self.drop_oldest = drop_oldest
        self._fast = fast
        self.writable = writable

    def __dealloc__(self):
        es_fault_in_join(&self._fault_in)
        if self._has_view:
            PyBuffer_Release(&self._view)
        pthread_mutex_destroy(&self._lock)

    # ---- the lock ----------------------------------------------------------------

    cdef inline void _acquire(self) noexcept:
        if pthread_mutex_trylock(&self._lock) != 0:
            with nogil:
                pthread_mutex_lock(&self._lock)

    cdef inline bint _try_acquire(self) noexcept:
        return pthread_mutex_trylock(&self._lock) == 0

    cdef inline void _release(self) noexcept nogil:
        pthread_mutex_unlock(&self._lock)

    def acquire(self) -> None:
        """Hold the ring for several calls (append_to_each); never blocks other threads' Python."""
        self._acquire()

    def release(self) -> None:
        self._release()

    cdef int _check_writable(self) except -1:
        if not self.writable:
            raise ValueError("the queue was opened read-only")
        return 0

    cdef int _check_open_locked(self) except -1:
        """Raise (letting go of the lock) when the mapping is gone; call with the lock held."""
        if self.closed:
            self._release()
            raise ValueError("the queue is closed")
        return 0

    # ---- opening -------------------------------------------------------------------

    def scan(self) -> tuple:
        """Find the end of the valid records after the acknowledged position.

        Returns (records, corrupt, stop position, write hint); sets the tail there.
        """
        cdef uint64_t records
        cdef bint corrupt = False
        # A ring with no record at its head (a new one) is scanned without letting go of
        # the interpreter lock: a thread that makes spares would wait to have it back.
        if es_get_u32(self._area + self.head % self.capacity) == 0:
            records = self._scan(&corrupt)
        else:
            with nogil:
                records = self._scan(&corrupt)
        self.read = self.head
        self.read_seq = self.head_seq
        return records, corrupt, self.tail, es_get_u64(self._map + HINT_OFFSET)

    cdef uint64_t _scan(self, bint *corrupt) noexcept nogil:
        """The scan itself: sets the tail and next sequence, returns the records found."""
        cdef uint64_t pos = self.head, seq = self.head_seq, cap = self.capacity
        cdef uint64_t records = 0, phys, room, fseq
        cdef uint32_t word, length, gen, prev_gen = 0
        cdef bint padding
        cdef const char *base
        while pos - self.head < cap:
            phys = pos % cap
            room = cap - phys
            if room < FRAME_HEADER:
                pos += room
                continue
            base = self._area + phys
            word = es_get_u32(base)
            if word == 0:
                break
            length = word & LENGTH_MASK
            padding = (word & PADDING_FLAG) != 0
            fseq = es_get_u64(base + 8)
            gen = es_get_u32(base + 24)
            if fseq < seq or gen < prev_gen:
                break
            if (
                fseq != seq
                or gen > self.generation
                or es_get_u32(base + 28) != 0
                or (padding and length != room)
                or (not padding and _frame_size(length) > room)
                or es_get_u32(base + 4)
                != es_crc32c(word, base + 8, 24 + (0 if padding else length))
            ):
                corrupt[0] = True
                break
            prev_gen = gen
            if padding:
                pos += room
                continue
            pos += _frame_size(length)
            seq += 1
            records += 1
        self.tail = pos
        self.next_seq = seq
        return records

    def start_writing(self, uint64_t skipped, bint scrub) -> None:
        """Take the file over after a scan: a new generation, and garbage past the tail zeroed.

        What lies past a damaged tail is garbage or records that could not be verified;
        left in place, a later scan starting beyond the rewritten part could take them
        for valid.
        """
        cdef uint64_t cap = self.capacity, start, free, first
        self._check_writable()
        self.generation += 1
        self.skipped += skipped
        if scrub:
            start = self.tail % cap
            free = cap - (self.tail - self.head)
            first = min(free, cap - start)
            memset(self._area + start, 0, first)
            if free > first:
                memset(self._area, 0, free - first)
        self._persist_head()
        es_put_u64(self._map + HINT_OFFSET, self.next_seq)

    # ---- writing -------------------------------------------------------------------

    cdef void _persist_head(self) noexcept nogil:
        cdef char *slot
        self.slot_counter += 1
        slot = self._map + (SLOT_A if self.slot_counter % 2 == 0 else SLOT_B)
        es_put_u64(slot, self.slot_counter)
        es_put_u64(slot + 8, self.head)
        es_put_u64(slot + 16, self.head_seq)
        es_put_u64(slot + 24, self.generation)
        es_put_u64(slot + 32, self.dropped)
        es_put_u64(slot + 40, self.skipped)
        es_put_u32(slot + SLOT_SIZE, es_crc32c(0, slot, SLOT_SIZE))

    cdef uint64_t _skip_padding(self, uint64_t pos) noexcept nogil:
        cdef uint64_t phys, room
        while pos < self.tail:
            phys = pos % self.capacity
            room = self.capacity - phys
            if room >= FRAME_HEADER and not es_get_u32(self._area + phys) & PADDING_FLAG:
                break
            pos += room
        return pos

    cdef uint64_t _next_position(self, uint64_t pos) noexcept nogil:
        pos = self._skip_padding(pos)
        return pos + _frame_size(es_get_u32(self._area + pos % self.capacity))

    cdef void _drop_head(self) noexcept nogil:
        self.head = self._next_position(self.head)
        self.head_seq += 1
        self.dropped += 1
        if self.read_seq < self.head_seq:
            self.read = self.head
            self.read_seq = self.head_seq

    cdef bint _fits(self, uint64_t size) noexcept nogil:
        cdef uint64_t room = self.capacity - self.tail % self.capacity
        return self.capacity - (self.tail - self.head) >= size + (room if room < size else 0)

    cdef void _write_padding(self, uint64_t phys, uint64_t room, int64_t ts) noexcept nogil:
        cdef char *base = self._area + phys
        cdef uint32_t word = PADDING_FLAG | <uint32_t>room
        es_put_u64(base + 8, self.next_seq)
        es_put_u64(base + 16, <uint64_t>ts)
        es_put_u32(base + 24, self.generation)
        es_put_u32(base + 28, 0)
        es_put_u32(base + 4, es_crc32c(word, base + 8, 24))
        es_publish_u32(base, word)

    cdef int64_t _reserve(self, uint64_t size, int64_t ts) noexcept nogil:
        """Room for a frame of `size` bytes at the tail: its offset in the area, or -1.

        Under drop_oldest the oldest records make room; otherwise a full ring is left
        as it is. A frame that would not fit before the area's end is preceded by padding.
        """
        cdef uint64_t cap = self.capacity, room
        cdef bint dropped = False
        if self.sealed:
            return -1
        while not self._fits(size):
            if not self.drop_oldest:
                return -1
            self._drop_head()
            dropped = True
        if dropped:
            self._persist_head()
        room = cap - self.tail % cap
        if room < size:
            if room >= FRAME_HEADER:
                self._write_padding(self.tail % cap, room, ts)
            self.tail += room
        return self.tail % cap

    cdef void _seal(self, uint64_t phys, uint32_t length, int64_t ts) noexcept nogil:
        """Complete the frame whose payload is in place, and publish it."""
        cdef char *base = self._area + phys
        es_put_u64(base + 8, self.next_seq)
        es_put_u64(base + 16, <uint64_t>ts)
        es_put_u32(base + 24, self.generation)
        es_put_u32(base + 28, 0)
        es_put_u32(base + 4, es_crc32c(length, base + 8, 24 + length))
        es_publish_u32(base, length)
        self.tail += _frame_size(length)
        self.next_seq += 1
        es_put_u64(self._map + HINT_OFFSET, self.next_seq)

    cdef int64_t _write(self, const char *data, uint64_t length, int64_t ts) noexcept:
        """Append one payload with the lock held: its sequence, or APPEND_FULL."""
        cdef int64_t phys = self._reserve(_frame_size(length), ts)
        cdef int64_t seq = self.next_seq
        if phys < 0:
            return -1
        if length >= NOGIL_BYTES:
            with nogil:
                memcpy(self._area + phys + FRAME_HEADER, data, length)
                self._seal(phys, <uint32_t>length, ts)
        else:
            memcpy(self._area + phys + FRAME_HEADER, data, length)
            self._seal(phys, <uint32_t>length, ts)
        return seq

    cdef int64_t write_envelope(
        self, const char *event_id, int64_t now,
        const char *key, Py_ssize_t klen, const char *value, Py_ssize_t vlen,
    ) noexcept:
        """The compiled send: one envelope framed straight into the ring, or a status < 0.

        Gives up (APPEND_FULL) rather than wait or fail whenever Python has a policy to
        apply: a full ring that may not drop, a busy lock, a closed or fsync ring.
        """
        cdef int64_t seq
        if not self._try_acquire():
            return -1
        seq = self.write_envelope_locked(event_id, now, key, klen, value, vlen)
        self._release()
        return seq

    cdef int64_t write_envelope_locked(
        self, const char *event_id, int64_t now,
        const char *key, Py_ssize_t klen, const char *value, Py_ssize_t vlen,
    ) noexcept:
        """`write_envelope` for a caller that holds the lock across several events."""
        cdef Py_ssize_t length = _envelope_size(klen, vlen, -1)
        cdef int64_t phys, seq
        if not self._fast or <uint64_t>length > self.max_payload or self.closed:
            return -1
        phys = self._reserve(_frame_size(length), now)
        if phys < 0:
            return -1
        seq = self.next_seq
        if length >= NOGIL_BYTES:
            with nogil:
                _put_envelope(self._area + phys + FRAME_HEADER, event_id, now, key, klen, value, vlen, NULL, -1)
                self._seal(phys, <uint32_t>length, now)
        else:
            _put_envelope(self._area + phys + FRAME_HEADER, event_id, now, key, klen, value, vlen, NULL, -1)
            self._seal(phys, <uint32_t>length, now)
        return seq

    def append(self, bytes payload not None, int64_t timestamp_ms) -> int:
        """Append one record: its sequence, or APPEND_FULL / APPEND_CLOSED / APPEND_BAD_LENGTH."""
        cdef uint64_t length = PyBytes_GET_SIZE(payload)
        cdef int64_t seq
        self._check_writable()
        if length == 0 or length > self.max_payload:
            return APPEND_BAD_LENGTH
        self._acquire()
        if self.closed:
            self._release()
            return APPEND_CLOSED
        seq = self._write(PyBytes_AS_STRING(payload), length, timestamp_ms)
        self._release()
        return seq

    def append_many(self, list payloads not None, int64_t timestamp_ms) -> tuple:
        """Append in order under one lock: (first sequence, records written, status).

        Status is 0, or APPEND_FULL / APPEND_CLOSED for the record where writing stopped;
        the records before it stay written. Lengths were checked by the caller.
        """
        cdef int64_t first, seq
        cdef Py_ssize_t written = 0
        cdef int status = 0
        self._check_writable()
        for payload in payloads:
            if type(payload) is not bytes:
                raise TypeError(f"queue records must be bytes, got {type(payload).__name__}")
        self._acquire()
        first = self.next_seq
        if self.closed:
            status = APPEND_CLOSED
        else:
            for payload in payloads:
                seq = self._write(PyBytes_AS_STRING(payload), PyBytes_GET_SIZE(payload), timestamp_ms)
                if seq < 0:
                    status = APPEND_FULL
                    break
                written += 1
        self._release()
        return first, written, status

    def write_locked(self, bytes payload not None, int64_t timestamp_ms) -> int:
        """append() for a caller that holds the lock (acquire) and checked the room."""
        self._check_writable()
        if self.closed:
            raise ValueError("the queue is closed")
        return self._write(PyBytes_AS_STRING(payload), PyBytes_GET_SIZE(payload), timestamp_ms)

    def fits(self, uint64_t size) -> bool:
        """Whether a frame of `size` bytes fits without dropping anything."""
        self._acquire()
        fits = self.fits_locked(size)
        self._release()
        return fits

    def fits_locked(self, uint64_t size) -> bool:
        return not self.sealed and self._fits(size)

    def seal(self) -> int:
        """Refuse every later append (APPEND_FULL): the queue writes to a newer segment.

        Returns the sequence after the last record, where the next segment starts; a
        writer that holds the lock finishes first, so none lands here afterwards. Setting
        `sealed` back to False undoes it (the next segment could not be made).
        """
        self._acquire()
        self.sealed = True
        seq = self.next_seq
        self._release()
        return seq

    def start_fault_in(self) -> bool:
        """Have the mapping faulted in writable by a thread that never takes the
        interpreter lock (fault_in.h: why, and how), for a spare segment (spares.py);
        whether one started (not while the last one runs, nor once closed)."""
        cdef bint started
        self._acquire()
        started = self.writable and not self.closed and es_fault_in_start(
            &self._fault_in, self._map, <size_t>self._view.len
        )
        self._release()
        return started

    def wait_fault_in(self) -> None:
        """Wait for the thread start_fault_in started, if any (close waits for it too)."""
        with nogil:
            es_fault_in_join(&self._fault_in)

    def restart(self, uint64_t head_seq, uint64_t dropped, uint64_t skipped) -> None:
        """Make an empty ring start at `head_seq` with these totals: a spare segment
        prepared ahead of need becomes the queue's next one without a syscall."""
        self._check_writable()
        self._acquire()
        self._check_open_locked()
        if self.next_seq != self.head_seq:
            self._release()
            raise ValueError("only an empty ring can be restarted")
        self.head = self.tail = self.read = 0
        self.head_seq = self.next_seq = self.read_seq = head_seq
        self.dropped = dropped
        self.skipped = skipped
        self._persist_head()
        es_put_u64(self._map + HINT_OFFSET, head_seq)
        self._release()

    def add_counts(self, uint64_t dropped, uint64_t skipped) -> None:
        """Add to the persisted totals: records of deleted segments, skips found elsewhere."""
        self._check_writable()
        self._acquire()
        self._check_open_locked()
        self.dropped += dropped
        self.skipped += skipped
        self._persist_head()
        self._release()

    # ---- reading -------------------------------------------------------------------

    def read_records(self, Py_ssize_t max_records, uint64_t max_bytes) -> list:
        """The next (sequence, timestamp, payload) after those handed out, not removed.

        At least one record when any is waiting, even one larger than `max_bytes`.
        """
        cdef uint64_t pos, total = 0, length
        cdef const char *base
        out = []
        self._acquire()
        self._check_open_locked()
        try:
            pos = self.read
            while self.read_seq < self.next_seq and len(out) < max_records:
                pos = self._skip_padding(pos)
                base = self._area + pos % self.capacity
                length = es_get_u32(base)
                if out and total + length > max_bytes:
                    break
                out.append((
                    es_get_u64(base + 8),
                    <int64_t>es_get_u64(base + 16),
                    PyBytes_FromStringAndSize(base + FRAME_HEADER, length),
                ))
                total += length
                pos += _frame_size(length)
                self.read = pos
                self.read_seq += 1
        finally:
            self._release()
        return out

    def read_for_kafka(self, Py_ssize_t max_records, uint64_t max_bytes) -> list:
        """The next records as (sequence, key, value, create ms, headers) for produce().

        The headers start with ("event_id", id). A record whose envelope cannot be
        parsed comes as (sequence, None, payload, append ms, None): no Kafka message can
        be made of it.
        """
        cdef uint64_t pos, total = 0, length
        cdef const char *base
        out = []
        self._acquire()
        self._check_open_locked()
        try:
            pos = self.read
            while self.read_seq < self.next_seq and len(out) < max_records:
                pos = self._skip_padding(pos)
                base = self._area + pos % self.capacity
                length = es_get_u32(base)
                if out and total + length > max_bytes:
                    break
                seq = es_get_u64(base + 8)
                try:
                    raw_id, create_ms, key, value, extra = _decode(base + FRAME_HEADER, length, False)
                except ValueError:
                    payload = PyBytes_FromStringAndSize(base + FRAME_HEADER, length)
                    out.append((seq, None, payload, <int64_t>es_get_u64(base + 16), None))
                else:
                    headers = [(EVENT_ID_HEADER, raw_id)]
                    if extra:
                        headers.extend(extra)
                    out.append((seq, key, value, create_ms, headers))
                total += length
                pos += _frame_size(length)
                self.read = pos
                self.read_seq += 1
        finally:
            self._release()
        return out

    def rewind(self) -> None:
        """Hand out again every record not yet acknowledged."""
        self._acquire()
        self._check_open_locked()
        self.read = self.head
        self.read_seq = self.head_seq
        self._release()

    def ack(self, uint64_t up_to_seq) -> int:
        """Remove every record up to `up_to_seq`: ACK_DONE, ACK_NOTHING or ACK_NOT_HANDED_OUT."""
        cdef int outcome = ACK_DONE
        self._check_writable()
        self._acquire()
        self._check_open_locked()
        if up_to_seq < self.head_seq:
            outcome = ACK_NOTHING
        elif up_to_seq >= self.read_seq:
            outcome = ACK_NOT_HANDED_OUT
        else:
            while self.head_seq <= up_to_seq:
                self.head = self._next_position(self.head)
                self.head_seq += 1
            self._persist_head()
        self._release()
        return outcome

    def oldest_timestamp(self) -> int:
        """Append time of the oldest queued record, or -1 when the ring is empty."""
        cdef int64_t ts = -1
        self._acquire()
        self._check_open_locked()
        if self.next_seq > self.head_seq:
            ts = <int64_t>es_get_u64(self._area + self._skip_padding(self.head) % self.capacity + 16)
        self._release()
        return ts

    def close(self) -> None:
        """Persist the read position (when writable) and let go of the mapping."""
        self._acquire()
        with nogil:
            es_fault_in_join(&self._fault_in)  # under the lock: none starts after it
        if not self.closed:
            self.closed = True
            if self.writable:
                self._persist_head()
            PyBuffer_Release(&self._view)
            self._has_view = False
            self._map = self._area = NULL
        self._release()
