# The client's side of the wire: one event of a SEND (or PUBLISH) body, encoded when
# the caller hands it over, so a queued event is a bytes object and a frame is a join;
# and a blocking caller's call made whole while nobody else uses its connection.
# Included by native.pyx. The format is written out in eventspool/wire/protocol.py.

cdef enum:
    MAX_WIRE_U16 = 0xFFFF
    MAX_WIRE_I32 = 0x7FFFFFFF


cdef inline Py_ssize_t _wire_length(object data, str what) except -2:
    """The length of a field (-1 for None), refused when its u32 length cannot say it."""
    if data is None:
        return -1
    cdef Py_ssize_t length = PyBytes_GET_SIZE(<bytes>data)
    if <uint64_t>length > 0xFFFFFFFF:
        raise ValueError(f"{what} of {length} bytes is too large")
    return length


cdef inline char *_put_wire_field(char *p, object data, Py_ssize_t length) noexcept:
    if length < 0:
        return p
    es_put_be32(p, <uint32_t>length)
    memcpy(p + 4, PyBytes_AS_STRING(<bytes>data), length)
    return p + 4 + length


cpdef bytes encode_wire_event(bytes value, bytes key, object headers, str event_id):
    """One event as a SEND body carries it: flags, key, value, headers, event_id.

    `headers` are (str name, bytes | None value) pairs; subclasses of str and bytes
    count as such. Raises ValueError, naming the field, for what the format cannot
    carry (the caller adds which event it was), TypeError for other types.
    """
    cdef Py_ssize_t klen = _wire_length(key, "key")
    cdef Py_ssize_t vlen = _wire_length(value, "value")
    cdef Py_ssize_t size = 1, count = 0, i, length
    cdef uint8_t flags = (WIRE_KEY if klen >= 0 else 0) | (WIRE_VALUE if vlen >= 0 else 0)
    cdef list names = None
    cdef list values = None
    cdef bytes raw_id = None
    cdef char *p
    if klen >= 0:
        size += 4 + klen
    if vlen >= 0:
        size += 4 + vlen
    if headers is not None:
        flags |= WIRE_HEADERS
        headers = list(headers)
        count = len(headers)
        if count > MAX_WIRE_U16:
            raise ValueError(f"{count} headers; at most {MAX_WIRE_U16} are allowed")
        names = [None] * count
        values = [None] * count
        size += 2
        for i in range(count):
            name, header_value = headers[i]
            if not isinstance(name, str):
                raise TypeError(f"header name must be a str, got {type(name).__name__}")
            if header_value is not None and not isinstance(header_value, bytes):
                raise TypeError(
                    f"header {name!r} value must be bytes or None, got "
                    f"{type(header_value).__name__}"
                )
            try:
                raw_name = PyUnicode_AsUTF8String(name)
            except UnicodeEncodeError as exc:
                raise ValueError(
                    f"header name {name!r} is not encodable as UTF-8: {exc.reason}"
                ) from None
            if PyBytes_GET_SIZE(raw_name) > MAX_WIRE_U16:
                raise ValueError(
                    f"header name of {PyBytes_GET_SIZE(raw_name)} bytes; at most "
                    f"{MAX_WIRE_U16} are allowed"
                )
            length = -1 if header_value is None else PyBytes_GET_SIZE(header_value)
            if length > MAX_WIRE_I32:
                raise ValueError(f"header {name!r} value of {length} bytes is too large")
            names[i] = raw_name
            values[i] = header_value  # the very objects measured are the ones copied
            size += 2 + PyBytes_GET_SIZE(raw_name) + 4 + (length if length > 0 else 0)
    if event_id is not None:
        flags |= WIRE_EVENT_ID
        raw_id = event_id.encode("ascii", "replace")
        if PyBytes_GET_SIZE(raw_id) != ID_LEN:
            raise ValueError(
                f"event_id {event_id!r} is not {ID_LEN} characters: a UUID in its canonical "
                "text form is"
            )
        size += ID_LEN
    out = PyBytes_FromStringAndSize(NULL, size)
    p = PyBytes_AS_STRING(out)
    p[0] = <char>flags
    p = _put_wire_field(p + 1, key, klen)
    p = _put_wire_field(p, value, vlen)
    if headers is not None:
        es_put_be16(p, <uint16_t>count)
        p += 2
        for i in range(count):
            raw_name = names[i]
            length = PyBytes_GET_SIZE(raw_name)
            es_put_be16(p, <uint16_t>length)
            memcpy(p + 2, PyBytes_AS_STRING(raw_name), length)
            p += 2 + length
            header_value = values[i]
            length = -1 if header_value is None else PyBytes_GET_SIZE(header_value)
            es_put_be32(p, <uint32_t><int32_t>length)
            p += 4
            if length > 0:
                memcpy(p, PyBytes_AS_STRING(header_value), length)
                p += length
    if raw_id is not None:
        memcpy(p, PyBytes_AS_STRING(raw_id), ID_LEN)
    return out


# Topic names that eventspool.wire.checks has checked already (its rule costs more than
# the rest of a send). It adds them, and bounds the set.
cdef set _checked_topics = set()
CHECKED_TOPICS = _checked_topics


def common_event_payload(topic, value, key, headers, event_id):
    """The SEND body of the common event: bytes or None for value and key, no headers,
    no event_id, a topic checked before. None for any other event, which
    `eventspool.wire.checks` checks and encodes, its errors in its own words.

    One compiled call instead of three Python frames: with 16 caller processes of their
    own on two cores, those frames' code and data cost about 3 us of client CPU per
    blocking send, most of it in cache misses after each wait.
    """
    return _common_event_payload(topic, value, key, headers, event_id)


cdef object _common_event_payload(topic, value, key, headers, event_id):
    """`common_event_payload`, called in C by the blocking client's `send()`."""
    if headers is not None or event_id is not None:
        return None
    if (value is not None and type(value) is not bytes) or (key is not None and type(key) is not bytes):
        return None
    if type(topic) is not str or topic not in _checked_topics:
        return None
    try:
        return encode_wire_event(value, key, None, None)
    except ValueError:  # a size no frame carries: the checks say so in their words
        return None

cdef inline char *_put_batch_head(
    char *p,
    Py_ssize_t size,
    uint8_t frame_type,
    uint32_t request_id,
    const char *name,
    Py_ssize_t name_size,
    Py_ssize_t count,
) noexcept nogil:
    """A SEND or PUBLISH frame of `size` bytes up to its events: header, name (UTF-8),
    count; where its events go. The caller checked that the sizes fit their fields."""
    es_put_be32(p, <uint32_t>(size - 4))
    p[4] = <char>frame_type
    es_put_be32(p + 5, request_id)
    es_put_be16(p + FRAME_HEADER_SIZE, <uint16_t>name_size)
    memcpy(p + FRAME_HEADER_SIZE + 2, name, name_size)
    es_put_be32(p + FRAME_HEADER_SIZE + 2 + name_size, <uint32_t>count)
    return p + FRAME_HEADER_SIZE + 6 + name_size


cdef inline bint _frame_full(
    Py_ssize_t frame_size,
    Py_ssize_t events,
    Py_ssize_t event_size,
    Py_ssize_t max_frame_bytes,
    Py_ssize_t max_events,
) noexcept nogil:
    """The rule of `wire.batching.frame_slices`: whether an event of `event_size` starts a
    new frame after `events` events that make `frame_size` bytes (its overhead too). A
    frame is at most `max_frame_bytes` unless one event alone is larger, and holds at
    most `max_events` events."""
    return events > 0 and (frame_size + event_size > max_frame_bytes or events >= max_events)


def frame_cuts(
    list sizes not None, Py_ssize_t overhead, Py_ssize_t max_frame_bytes, Py_ssize_t max_events
) -> list:
    """The loop of `wire.batching.frame_slices`, whose rule this is: the slices of
    `sizes` (each event's encoded size) that make one frame each, every frame
    `overhead` bytes and its events, at most `max_frame_bytes` unless one event alone
    is larger, and at most `max_events` events. Compiled, as the blocking client cuts
    every batch it writes: a Python loop per event."""
    cdef Py_ssize_t count = len(sizes), start = 0, index, size = overhead, event_size
    cuts = []
    for index in range(count):
        event_size = sizes[index]
        if _frame_full(size, index - start, event_size, max_frame_bytes, max_events):
            cuts.append(slice(start, index))
            start = index
            size = overhead
        size += event_size
    if start < count:
        cuts.append(slice(start, count))
    return cuts


def encode_batch_frame(uint8_t frame_type, uint32_t request_id, bytes raw_name not None, list payloads not None):
    """A whole SEND or PUBLISH frame: header, name, count, the events encoded already.

    None when its length cannot be said in the frame's u32 (the caller words the error).
    """
    return _batch_frame(frame_type, request_id, raw_name, payloads)


cdef bytes _batch_frame(uint8_t frame_type, uint32_t request_id, bytes raw_name, list payloads):
    """`encode_batch_frame`."""
    cdef Py_ssize_t name_size = PyBytes_GET_SIZE(raw_name), count = len(payloads), i
    cdef Py_ssize_t size = FRAME_HEADER_SIZE + 2 + name_size + 4, length
    cdef char *p
    if name_size > MAX_WIRE_U16 or <uint64_t>count > 0xFFFFFFFF:
        return None
    for i in range(count):
        size += PyBytes_GET_SIZE(<bytes?>payloads[i])
    if <uint64_t>(size - 4) > 0xFFFFFFFF:
        return None
    out = PyBytes_FromStringAndSize(NULL, size)
    p = _put_batch_head(
        PyBytes_AS_STRING(out),
        size,
        frame_type,
        request_id,
        PyBytes_AS_STRING(raw_name),
        name_size,
        count,
    )
    for i in range(count):
        payload = <bytes>payloads[i]
        length = PyBytes_GET_SIZE(payload)
        memcpy(p, PyBytes_AS_STRING(payload), length)
        p += length
    return out


# ---- a blocking caller alone on its connection -----------------------------------------

cdef extern from "<sys/socket.h>" nogil:
    ssize_t _socket_send "send"(int fd, const void *data, size_t size, int flags)
    ssize_t _socket_recv "recv"(int fd, void *data, size_t size, int flags)
    enum:
        MSG_DONTWAIT
        MSG_NOSIGNAL

# What `_call_alone` did: answered the call, or left the rest of it to the Python path.
CALL_ANSWERED = 0
CALL_UNWRITTEN = 1
CALL_READ = 2

cdef enum:
    CALL_FRAME_ON_STACK = 2048
    CALL_ANSWER_ON_STACK = 4096
    ONE_RESULT_OFFSET = FRAME_HEADER_SIZE + 4  # after the header and the result count


cdef Py_ssize_t _send_now(int fd, const char *data, Py_ssize_t size) except -1:
    """What the socket takes of `data` without waiting for room."""
    cdef Py_ssize_t sent
    cdef int error = 0
    while True:
        with nogil:
            sent = _socket_send(fd, data, size, MSG_DONTWAIT | MSG_NOSIGNAL)
            if sent < 0:
                error = errno
        if sent >= 0:
            return sent
        if error == EAGAIN:
            return 0
        if error != EINTR:
            raise OSError(error, strerror(error).decode("utf-8", "replace"))
        PyErr_CheckSignals()


cdef Py_ssize_t _receive(int fd, char *into, Py_ssize_t room) except -1:
    """One read of the blocking socket (SO_RCVTIMEO bounds it), as `socket.recv_into`."""
    cdef Py_ssize_t got
    cdef int error = 0
    while True:
        with nogil:
            got = _socket_recv(fd, into, room, 0)
            if got < 0:
                error = errno
        if got >= 0:
            return got
        if error != EINTR:
            raise OSError(error, strerror(error).decode("utf-8", "replace"))
        PyErr_CheckSignals()


cdef object _lone_outcome(const char *p, Py_ssize_t size, uint32_t request_id):
    """The one result of the SEND_RESULT that `p` holds whole and alone, for `request_id`:
    the event_id, or (status, text); None for anything else."""
    cdef Py_ssize_t length
    if size < ONE_RESULT_OFFSET + 3 or <Py_ssize_t>es_get_be32(p) != size - 4:
        return None
    if <uint8_t>p[4] != SEND_RESULT_TYPE or es_get_be32(p + 5) != request_id:
        return None
    if es_get_be32(p + FRAME_HEADER_SIZE) != 1:
        return None
    length = es_get_be16(p + ONE_RESULT_OFFSET + 1)
    if ONE_RESULT_OFFSET + 3 + length != size:
        return None
    try:
        text = PyUnicode_DecodeUTF8(p + ONE_RESULT_OFFSET + 3, length, NULL)
    except UnicodeDecodeError:
        return None
    if p[ONE_RESULT_OFFSET] == STATUS_OK:
        return text
    return <uint8_t>p[ONE_RESULT_OFFSET], text


cdef Py_ssize_t _polled_recv(int fd, char *into, Py_ssize_t room, BusyPoll *poll) noexcept nogil:
    """One read of the blocking socket, tried without waiting until `poll` gives up:
    as recv(), errno set on -1."""
    cdef Py_ssize_t got
    cdef double until = _busy_poll_start(poll)
    if until:
        while True:
            got = _socket_recv(fd, into, room, MSG_DONTWAIT)
            if got >= 0:
                _busy_poll_met(poll)
                return got
            if errno != EAGAIN:
                return got  # its error is the socket's to report, read once
            if not _busy_poll_again(poll, until):
                break
    return _socket_recv(fd, into, room, 0)


cdef tuple _call_alone(int fd, uint32_t request_id, str topic, bytes payload, BusyPoll *poll):
    """One event's SEND written and its answer read, on a blocking socket nobody else
    writes or reads now: (CALL_ANSWERED, the event_id or (status, text)). The read
    busy-polls by `poll` before it blocks.

    The blocking client's `send()` alone on its connection, in one call instead of the
    Python pipeline's steps (its bookkeeping was most of the client's CPU per event).
    Anything out of the ordinary is left to that pipeline: (CALL_UNWRITTEN, the bytes
    of the frame the socket did not take), or (CALL_READ, the bytes read) when they are
    not this call's whole answer alone. Raises OSError as the socket module does
    (BlockingIOError once SO_RCVTIMEO ran out).
    """
    cdef Py_ssize_t topic_size, payload_size = PyBytes_GET_SIZE(payload)
    cdef const char *raw_topic = PyUnicode_AsUTF8AndSize(topic, &topic_size)
    cdef Py_ssize_t size = FRAME_HEADER_SIZE + 2 + topic_size + 4 + payload_size, sent, got
    cdef char on_stack[CALL_FRAME_ON_STACK]
    cdef char *frame = on_stack
    # One event's answer is under 100 bytes; more is read on by the Python pipeline.
    cdef char into[CALL_ANSWER_ON_STACK]
    if topic_size > MAX_WIRE_U16 or <uint64_t>(size - 4) > 0xFFFFFFFF:
        raise ValueError(f"a SEND of {size} bytes does not fit a frame")
    on_heap = None
    if size > CALL_FRAME_ON_STACK:
        on_heap = PyBytes_FromStringAndSize(NULL, size)
        frame = PyBytes_AS_STRING(on_heap)
    memcpy(
        _put_batch_head(frame, size, SEND_TYPE, request_id, raw_topic, topic_size, 1),
        PyBytes_AS_STRING(payload),
        payload_size,
    )
    cdef Py_ssize_t room = CALL_ANSWER_ON_STACK
    cdef int error = 0
    # Written whole, the answer is waited for without taking the interpreter lock back
    # in between; anything else goes through the steps that handle it.
    with nogil:
        sent = _socket_send(fd, frame, size, MSG_DONTWAIT | MSG_NOSIGNAL)
        if sent == size:
            got = _polled_recv(fd, into, room, poll)
            if got < 0:
                error = errno
    if sent != size:
        if sent < 0:  # nothing was written: trying again says why, or writes
            sent = _send_now(fd, frame, size)
        if sent < size:
            return CALL_UNWRITTEN, PyBytes_FromStringAndSize(frame + sent, size - sent)
        got = _receive(fd, into, room)
    elif got < 0:
        if error != EINTR:
            raise OSError(error, strerror(error).decode("utf-8", "replace"))
        PyErr_CheckSignals()
        got = _receive(fd, into, room)
    outcome = _lone_outcome(into, got, request_id)
    if outcome is None:
        return CALL_READ, PyBytes_FromStringAndSize(into, got)
    return CALL_ANSWERED, outcome
