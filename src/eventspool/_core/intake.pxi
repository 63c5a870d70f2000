# The agent's intake: one SEND frame parsed and written into the rings in one call.
# Included by native.pyx. The frame format is written out in eventspool/wire/protocol.py.

cdef enum:
    # Each event costs the agent a few hundred bytes of bookkeeping, whatever its size:
    # capping the count keeps a frame of tiny events (tombstones are one byte) from
    # costing far more memory than the frame itself.
    SEND_MAX_EVENTS = 10000
    FRAME_LENGTH_SIZE = 4
    FRAME_MIN_LENGTH = 5  # type and request id
    FRAME_HEADER_SIZE = 9  # length, type, request id
    SEND_TYPE = 1
    PING_TYPE = 2
    PUBLISH_TYPE = 4
    SEND_RESULT_TYPE = 0x81
    PONG_TYPE = 0x82
    STATUS_OK = 0
    WIRE_KEY = 1
    WIRE_VALUE = 2
    WIRE_HEADERS = 4
    WIRE_EVENT_ID = 8
    OK_RESULT_SIZE = 3 + ID_LEN
    # A ring is held across at most this many events of one frame, so the sender,
    # which acknowledges under the same lock, never waits long behind a large frame.
    HELD_RUN_MAX = 256

# For eventspool/wire/protocol.py, which encodes and decodes every frame in Python too:
# the protocol's numbers that this compiled intake also reads and writes, defined here once.
WIRE_MAX_EVENTS_PER_SEND = SEND_MAX_EVENTS
WIRE_FRAME_HEADER_SIZE = FRAME_HEADER_SIZE
WIRE_SEND = SEND_TYPE
WIRE_PUBLISH = PUBLISH_TYPE
WIRE_SEND_RESULT = SEND_RESULT_TYPE
WIRE_STATUS_OK = STATUS_OK
WIRE_FLAG_KEY = WIRE_KEY
WIRE_FLAG_VALUE = WIRE_VALUE
WIRE_FLAG_HEADERS = WIRE_HEADERS
WIRE_FLAG_EVENT_ID = WIRE_EVENT_ID


cdef Py_ssize_t _scan_send(const char *p, Py_ssize_t size, uint32_t *count) noexcept:
    """Where a SEND body's events start, or -1 when Python must judge the body.

    -1 for anything the compiled intake leaves to the Python decoder: a body that does
    not parse (the decoder names the fault), and events with headers (whose names it
    checks as UTF-8 and whose policy it owns).
    """
    cdef Py_ssize_t pos, start
    cdef uint32_t n, i, length
    cdef uint8_t flags
    if size < 2:
        return -1
    pos = 2 + <Py_ssize_t>es_get_be16(p)
    if size - pos < 4:
        return -1
    n = es_get_be32(p + pos)
    pos += 4
    if n > SEND_MAX_EVENTS or <Py_ssize_t>n > size - pos:
        return -1
    start = pos
    for i in range(n):
        if pos >= size:
            return -1
        flags = <uint8_t>p[pos]
        pos += 1
        if flags & ~(WIRE_KEY | WIRE_VALUE):
            return -1
        if flags & WIRE_KEY:
            if size - pos < 4:
                return -1
            length = es_get_be32(p + pos)
            pos += 4
            if <Py_ssize_t>length > size - pos:
                return -1
            pos += length
        if flags & WIRE_VALUE:
            if size - pos < 4:
                return -1
            length = es_get_be32(p + pos)
            pos += 4
            if <Py_ssize_t>length > size - pos:
                return -1
            pos += length
    if pos != size:
        return -1
    count[0] = n
    return start


cdef class _ResultBuffer:
    """A SEND_RESULT frame being built: mostly OK results of one size, some texts."""

    cdef bytearray data
    cdef Py_ssize_t used
    cdef Py_ssize_t start  # where the frame being built begins

    def __cinit__(self, Py_ssize_t expected):
        self.data = bytearray(expected)
        self.used = 0
        self.start = 0

    cdef int clear(self, Py_ssize_t kept) except -1:
        """Empty, for the next frames; memory beyond `kept` bytes is given back."""
        self.used = 0
        self.start = 0
        if len(self.data) > kept:
            self.data = bytearray(kept)
        return 0

    cdef char *reserve(self, Py_ssize_t size) except NULL:
        cdef Py_ssize_t have = len(self.data)
        if self.used + size > have:
            self.data.extend(bytes(max(self.used + size - have, have)))
        return <char *>self.data + self.used

    cdef int put_ok(self, const char *event_id) except -1:
        cdef char *out = self.reserve(OK_RESULT_SIZE)
        out[0] = STATUS_OK
        es_put_be16(out + 1, ID_LEN)
        memcpy(out + 3, event_id, ID_LEN)
        self.used += OK_RESULT_SIZE
        return 0

    cdef int put_text(self, int status, bytes text) except -1:
        cdef Py_ssize_t length = PyBytes_GET_SIZE(text)
        cdef char *out = self.reserve(3 + length)
        out[0] = <char>status
        es_put_be16(out + 1, <uint16_t>length)
        memcpy(out + 3, PyBytes_AS_STRING(text), length)
        self.used += 3 + length
        return 0

    cdef int put_frame(self, uint8_t frame_type, uint32_t request_id, const char *body, Py_ssize_t size) except -1:
        """A whole frame of its own, as a PONG."""
        cdef char *out = self.reserve(FRAME_HEADER_SIZE + size)
        es_put_be32(out, <uint32_t>(size + 5))
        out[4] = <char>frame_type
        es_put_be32(out + 5, request_id)
        memcpy(out + FRAME_HEADER_SIZE, body, size)
        self.used += FRAME_HEADER_SIZE + size
        return 0

    cdef int open_frame(self, uint32_t count) except -1:
        """Start a SEND_RESULT frame of `count` results; `close_frame` fills its header."""
        self.reserve(FRAME_HEADER_SIZE + 4 + <Py_ssize_t>count * OK_RESULT_SIZE)
        self.start = self.used
        self.used += FRAME_HEADER_SIZE + 4
        return 0

    cdef void close_frame(self, uint32_t request_id, uint32_t count) noexcept:
        cdef char *out = <char *>self.data + self.start
        es_put_be32(out, <uint32_t>(self.used - self.start - 4))
        out[4] = <char>SEND_RESULT_TYPE
        es_put_be32(out + 5, request_id)
        es_put_be32(out + FRAME_HEADER_SIZE, count)

    cdef bytes frames(self):
        return PyBytes_FromStringAndSize(<char *>self.data, self.used)


cdef class _NeverWaiting:
    """Which raw topic names of SEND frames may be spooled at once: those in `inline`,
    the raw names of topics that never wait, or that `learn(raw name)` judges so.

    It keeps the last such name and its str, since `inline` only grows: a run of SENDs
    to one topic then makes, hashes and decodes no name per frame (callgrind, one
    sequential caller: the listener's thread went from 4,542 to 3,404 instructions per
    blocking event).
    """

    cdef set inline
    cdef object learn
    cdef bytes last_raw
    cdef str last_topic

    def __init__(self, set inline not None, learn):
        self.inline = inline
        self.learn = learn

    cdef str topic(self, const char *name, Py_ssize_t size):
        """The topic of this raw name when its SENDs are spooled at once, else None."""
        cdef bytes last = self.last_raw
        if (
            last is not None
            and PyBytes_GET_SIZE(last) == size
            and memcmp(PyBytes_AS_STRING(last), name, size) == 0
        ):
            return self.last_topic
        raw = PyBytes_FromStringAndSize(name, size)
        if raw not in self.inline and not self.learn(raw):
            return None
        try:
            topic = PyUnicode_DecodeUTF8(name, size, NULL)
        except UnicodeDecodeError:
            return None
        self.last_raw = raw
        self.last_topic = topic
        return topic


def intake_send(SpoolFront front not None, uint32_t request_id, bytes body not None, fallback):
    """Spool every event of a SEND body: (SEND_RESULT frame, bytes accepted), or None.

    None leaves the whole frame to the Python decoder: the body does not parse, or its
    events carry headers. Nothing has been written then. Otherwise each event is framed
    straight from the request into its ring, holding a ring's lock across consecutive
    events for it; an event the compiled path may not write (topic not open yet, ring
    full, busy, closed or fsync, event too large) goes to `fallback(topic, value, key)`,
    the Python policy, which answers (status, UTF-8 text). `bytes accepted` counts the
    keys and values spooled, for quotas.
    """
    # Sized for one result: `_intake_into` scans the body and reserves for all of them.
    cdef _ResultBuffer out = _ResultBuffer(FRAME_HEADER_SIZE + 4 + OK_RESULT_SIZE)
    accepted = _intake_into(
        front, request_id, PyBytes_AS_STRING(body), PyBytes_GET_SIZE(body), None, fallback, out
    )
    if accepted < 0:
        return None
    return out.frames(), accepted


def intake_frames(SpoolFront front not None, bytes data not None, Py_ssize_t max_frame, set inline not None, learn, fallback):
    """Answer the SENDs and PINGs at the start of one read: (their answers, bytes
    consumed, SENDs spooled).

    The agent's per-read path for a connection without access rules or quotas: it stops
    at the first frame it leaves to Python (see `_spool_frames`), and Python takes the
    read from there, so a connection's requests keep their order.
    """
    cdef int sends = 0
    cdef bint partial
    cdef _ResultBuffer out = _ResultBuffer(FRAME_HEADER_SIZE + 4 + OK_RESULT_SIZE)
    consumed = _spool_frames(
        front, PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data), max_frame,
        _NeverWaiting(inline, learn), fallback, out, &sends, &partial,
    )
    return out.frames(), consumed, sends


cdef Py_ssize_t _spool_frames(
    SpoolFront front, const char *p, Py_ssize_t size, Py_ssize_t max_frame,
    _NeverWaiting never_waiting, fallback, _ResultBuffer out, int *sends, bint *partial,
) except -1:
    """Spool and answer the whole SEND frames and PING frames that start `p`: the bytes
    they took.

    It stops at the end, at a partial SEND or PING (`partial` set: more bytes may make it
    whole), or at the first frame it leaves to Python: any other type, a length out of
    bounds, a SEND to a topic that may wait (`never_waiting` judges), or a body
    `intake_send` would leave to the decoder. Each SEND is spooled as `intake_send` spools it.
    """
    cdef Py_ssize_t pos = 0, end, body_size
    cdef uint32_t length
    cdef uint8_t frame_type
    cdef const char *body
    partial[0] = False
    while size - pos >= FRAME_LENGTH_SIZE:
        length = es_get_be32(p + pos)
        if length < FRAME_MIN_LENGTH or length > max_frame:
            return pos
        if size - pos < FRAME_HEADER_SIZE:
            break
        frame_type = <uint8_t>p[pos + 4]
        if frame_type != SEND_TYPE and frame_type != PING_TYPE:
            return pos
        end = pos + 4 + <Py_ssize_t>length
        if end > size:
            break
        body = p + pos + FRAME_HEADER_SIZE
        body_size = end - pos - FRAME_HEADER_SIZE
        if frame_type == PING_TYPE:
            out.put_frame(PONG_TYPE, es_get_be32(p + pos + 5), body, body_size)
            pos = end
            continue
        if body_size < 2 or 2 + <Py_ssize_t>es_get_be16(body) > body_size:
            return pos
        topic = never_waiting.topic(body + 2, es_get_be16(body))
        if topic is None:
            return pos
        if _intake_into(front, es_get_be32(p + pos + 5), body, body_size, topic, fallback, out) < 0:
            return pos
        sends[0] += 1
        pos = end
    partial[0] = pos < size
    return pos


cdef int64_t _intake_into(
    SpoolFront front, uint32_t request_id, const char *p, Py_ssize_t size, str topic,
    fallback, _ResultBuffer out,
) except -2:
    """Spool a SEND body's events and add its SEND_RESULT frame to `out`: the bytes
    accepted, or -1 (nothing written) for a body the Python decoder must judge. `topic`
    is the body's topic when the caller has decoded it already, else None."""
    cdef Py_ssize_t pos, klen, vlen
    cdef uint32_t count = 0, i
    cdef uint8_t flags
    cdef const char *k
    cdef const char *v
    cdef char event_id[ID_LEN]
    cdef int64_t now, accepted = 0
    cdef int run = 0, partition
    cdef TopicRoute route = None
    cdef RingCore held = None
    cdef RingCore ring
    pos = _scan_send(p, size, &count)
    if pos < 0:
        return -1
    if topic is None:
        try:
            topic = PyUnicode_DecodeUTF8(p + 2, es_get_be16(p), NULL)
        except UnicodeDecodeError:
            return -1
    out.open_frame(count)
    found = front._routes.get(topic)
    if found is not None:
        route = <TopicRoute>found
    try:
        for i in range(count):
            flags = <uint8_t>p[pos]
            pos += 1
            k = NULL
            klen = -1
            v = NULL
            vlen = -1
            if flags & WIRE_KEY:
                klen = es_get_be32(p + pos)
                k = p + pos + 4
                pos += 4 + klen
            if flags & WIRE_VALUE:
                vlen = es_get_be32(p + pos)
                v = p + pos + 4
                pos += 4 + vlen
            if route is not None and route._count >= 0 and _envelope_size(klen, vlen, -1) <= route._max_event:
                if k == NULL:
                    partition = route.sticky.choose(route._count, _envelope_size(klen, vlen, -1), route.available)
                else:
                    partition = (es_murmur2(k, klen) & 0x7FFFFFFF) % route._count
                found = route._rings[partition]
                if found is not None:
                    ring = <RingCore>found
                    if ring is not held or run >= HELD_RUN_MAX:
                        if held is not None:
                            held._release()
                            held = None
                        if ring._try_acquire():
                            held = ring
                            run = 0
                    if held is ring:
                        now = route._ids.now_ms()
                        route._ids.make_into(now, event_id)
                        if ring.write_envelope_locked(event_id, now, k, klen, v, vlen) >= 0:
                            out.put_ok(event_id)
                            accepted += (klen if klen > 0 else 0) + (vlen if vlen > 0 else 0)
                            run += 1
                            continue
            if held is not None:
                held._release()
                held = None
            status, text = fallback(
                topic,
                None if v == NULL else PyBytes_FromStringAndSize(v, vlen),
                None if k == NULL else PyBytes_FromStringAndSize(k, klen),
            )
            out.put_text(status, text)
            if status == STATUS_OK:
                accepted += (klen if klen > 0 else 0) + (vlen if vlen > 0 else 0)
            found = front._routes.get(topic)
            route = None if found is None else <TopicRoute>found
    finally:
        if held is not None:
            held._release()
    out.close_frame(request_id, count)
    return accepted


def decode_results(bytes body not None) -> list:
    """A SEND_RESULT body as one outcome per event: the event_id (str) when OK, else
    (status, text). Raises ValueError, naming the fault, for a body that does not parse.
    """
    cdef const char *p = PyBytes_AS_STRING(body)
    cdef Py_ssize_t size = PyBytes_GET_SIZE(body), pos = 4, length
    cdef uint32_t count, i
    cdef uint8_t status
    if size < 4:
        raise ValueError(f"SEND_RESULT: body of {size} bytes ends before the count")
    count = es_get_be32(p)
    if <Py_ssize_t>count * 3 > size - pos:
        raise ValueError(f"SEND_RESULT: {count} results announced but only {size - pos} bytes follow")
    outcomes = [None] * count
    for i in range(count):
        if size - pos < 3:
            raise ValueError(f"SEND_RESULT: result {i}: body ends inside the status at offset {pos}")
        status = <uint8_t>p[pos]
        length = es_get_be16(p + pos + 1)
        pos += 3
        if length > size - pos:
            raise ValueError(f"SEND_RESULT: result {i}: {length} bytes at offset {pos} overrun the body of {size} bytes")
        text = PyUnicode_DecodeUTF8(p + pos, length, NULL)
        pos += length
        outcomes[i] = text if status == STATUS_OK else (status, text)
    if pos != size:
        raise ValueError(f"SEND_RESULT: {size - pos} trailing bytes after {count} results")
    return outcomes
