# A blocking client's queued `send()` calls in C: queued on the lane, framed, written and
# noted in flight, then answered, all without the interpreter lock. Included by
# native.pyx before in_person.pxi, whose QueuedCall waits on an `Awaited`, whose
# PipelineCore keeps the `Lane` and whose ConnectionCore keeps a `SendsTable` and an
# `AnswerBuffer`. The pipeline's rules are written out in eventspool/client/sync_pipeline.py.
#
# Why: with 16 threads sharing one client on a 2-core VM, the client's CPU went to the
# interpreter lock's hand-offs (futex waits and wakes were most of its profile, the
# interpreter 2%), and the longer a caller held that lock, the more of them there were.
# A prototype against the same agent, alternated: callers that queue, write and wait
# in C and a reader that wakes them without the interpreter lock reached 84-123k
# events/s; the same reader taking that lock once per answer frame, 46-47k; the Python
# pipeline, 30-39k; the hand-off ceiling of the uds bench, 53-62k.

from cpython.list cimport PyList_New, PyList_SET_ITEM
from cpython.pythread cimport (
    NOWAIT_LOCK, PY_LOCK_ACQUIRED, WAIT_LOCK, PyLockStatus, PyThread_acquire_lock,
    PyThread_allocate_lock, PyThread_free_lock, PyThread_release_lock, PyThread_type_lock,
)
from cpython.ref cimport PyObject, Py_INCREF, Py_XDECREF
from cpython.unicode cimport PyUnicode_DecodeASCII
from libc.stdlib cimport free, malloc, realloc
from libc.string cimport memmove

cdef extern from "<poll.h>" nogil:
    struct pollfd:
        int fd
        short events
        short revents
    int poll(pollfd *fds, unsigned long count, int timeout_ms)
    enum:
        POLLIN

cdef enum:
    # How long the reader thread waits for answers with nothing in flight before it
    # leaves the reading to callers again (a caller alone then calls in person): with
    # 16 threads sharing a client, nothing is in flight for moments between their calls,
    # and a reader that left at once handed the reading to a caller at nearly every
    # call (4,358 times in 76,625 events), each hand-off under the interpreter lock.
    READER_LINGER_MS = 50
    ANSWER_READ_SIZE = 65536  # as the Python reader's READ_SIZE, below glibc's mmap threshold
    ANSWER_SPENT_MOST = 1024  # settled SENDs whose references wait for the interpreter lock

cdef enum:
    # A queued call's state: nobody settled it yet; its `outcome` is set (in Python);
    # its `event_id` holds the outcome (by the compiled reader, without the lock).
    SETTLED_NOT_YET = 0
    SETTLED_IN_PYTHON = 1
    SETTLED_WITH_ID = 2

cdef enum:
    # What one step of `ConnectionCore._read_step` ended on.
    READ_HANDED = 0  # frames for Python are in `out`
    READ_LOOK = 1  # the caller's condition to look again came about
    READ_END = 2  # the agent closed the connection
    READ_ERROR = 3  # a system call failed: `error` says why
    READ_NO_MEMORY = 4
    READ_SPENT = 5  # `spent` is full: its references are to be dropped

cdef enum:
    # How `_lane_write` ended.
    LANE_WRITTEN = 0  # all of it, or what the socket took: the rest is in `data`
    LANE_FAILED = 1  # the socket failed: `error` says why; the SENDs are noted
    LANE_CLOSED = 2  # the connection was dropped first: the SENDs are not noted
    LANE_NO_MEMORY = 3  # nothing was written; the calls are back on the lane


cdef struct Awaited:
    # What a queued `send()`'s caller waits on: `unsettled` is held from the call's
    # making until whoever settles it gives it back; `held` says whether it is held.
    PyThread_type_lock unsettled
    bint held
    uint64_t state  # SETTLED_*: stored with release, loaded with acquire
    char event_id[ID_LEN]


cdef inline void _awaited_settle(Awaited *awaited, uint64_t state) noexcept nogil:
    """Mark the call settled and wake its caller; once per call."""
    es_store_release_u64(&awaited.state, state)
    if awaited.held:
        awaited.held = False
        PyThread_release_lock(awaited.unsettled)


cdef inline object _answered_id(Awaited *awaited):
    """The event_id the compiled reader settled a call with."""
    return PyUnicode_DecodeASCII(awaited.event_id, ID_LEN, NULL)


cdef inline void _lock_holding_gil(PyThread_type_lock lock) noexcept:
    """Take a lock of this file's with the interpreter lock held: waited for without
    it, only when another thread holds the lock (letting go of the interpreter lock
    is a hand-off, which 16 threads sharing a client pay for)."""
    if PyThread_acquire_lock(lock, NOWAIT_LOCK) != PY_LOCK_ACQUIRED:
        with nogil:
            PyThread_acquire_lock(lock, WAIT_LOCK)


cdef int _grow(void **data, Py_ssize_t *room, Py_ssize_t need) noexcept nogil:
    """Grow `data` to hold `need` bytes; -1 without memory."""
    cdef void *grown
    if need <= room[0]:
        return 0
    grown = realloc(data[0], need)
    if grown == NULL:
        return -1
    data[0] = grown
    room[0] = need
    return 0


# ---- the SENDs in flight -----------------------------------------------------------------

cdef struct SendInFlight:
    uint32_t request_id
    Py_ssize_t count
    PyObject **calls  # the QueuedCalls, in the order of the SEND's events: references held
    Awaited **awaited  # theirs


cdef struct SendsTable:
    # The SENDs in flight that only queued `send()` calls wait on. `lock` guards it; it
    # is taken with and without the interpreter lock, and nothing waits holding it.
    # `closed` once a broken connection took them all: nothing is noted after that.
    PyThread_type_lock lock
    SendInFlight *sends
    Py_ssize_t count, room
    bint closed


cdef void _send_drop(SendInFlight *send) noexcept:
    """Drop a SEND's references; with the interpreter lock."""
    cdef Py_ssize_t i
    for i in range(send.count):
        Py_XDECREF(send.calls[i])
    free(send.calls)
    free(send.awaited)


cdef list _send_list(SendInFlight *send):
    """A SEND's calls as a list, which takes over their references."""
    cdef list calls = PyList_New(send.count)
    cdef Py_ssize_t i
    for i in range(send.count):
        PyList_SET_ITEM(calls, i, <object>send.calls[i])  # steals the reference
    free(send.calls)
    free(send.awaited)
    return calls


cdef SendsTable *_sends_table_new() except NULL:
    cdef SendsTable *table = <SendsTable *>malloc(sizeof(SendsTable))
    if table == NULL:
        raise MemoryError()
    memset(table, 0, sizeof(SendsTable))
    table.lock = PyThread_allocate_lock()
    if table.lock == NULL:
        free(table)
        raise MemoryError()
    return table


cdef void _sends_table_free(SendsTable *table) noexcept:
    cdef Py_ssize_t i
    for i in range(table.count):
        _send_drop(&table.sends[i])
    free(table.sends)
    PyThread_free_lock(table.lock)
    free(table)


cdef int _sends_insert(SendsTable *table, SendInFlight *sends, Py_ssize_t count) noexcept nogil:
    """Note `count` SENDs in flight; the table's lock is held. -1 without memory."""
    cdef Py_ssize_t room = table.room * sizeof(SendInFlight)
    if _grow(<void **>&table.sends, &room, (table.count + count) * sizeof(SendInFlight)) < 0:
        return -1
    table.room = room // sizeof(SendInFlight)
    memcpy(table.sends + table.count, sends, count * sizeof(SendInFlight))
    table.count += count
    return 0


cdef int _sends_note(SendsTable *table, uint32_t request_id, list request) except -1:
    """Note a SEND of queued calls, framed by the Python pipeline, as in flight; the
    caller checked that the connection is not dropped (under the pipeline's lock)."""
    cdef SendInFlight send
    cdef Py_ssize_t i
    cdef int noted
    send.request_id = request_id
    send.count = len(request)
    send.calls = <PyObject **>malloc(sizeof(PyObject *) * send.count)
    send.awaited = <Awaited **>malloc(sizeof(Awaited *) * send.count)
    if send.calls == NULL or send.awaited == NULL:
        free(send.calls)
        free(send.awaited)
        raise MemoryError()
    for i in range(send.count):
        call = request[i]
        Py_INCREF(call)
        send.calls[i] = <PyObject *>call
        send.awaited[i] = &(<QueuedCall>call)._awaited
    _lock_holding_gil(table.lock)
    noted = _sends_insert(table, &send, 1)
    PyThread_release_lock(table.lock)
    if noted < 0:
        _send_drop(&send)
        raise MemoryError()
    return 0


cdef inline SendInFlight _sends_remove(SendsTable *table, Py_ssize_t index) noexcept nogil:
    """Take the SEND at `index` out; the table's lock is held."""
    cdef SendInFlight send = table.sends[index]
    table.count -= 1
    table.sends[index] = table.sends[table.count]
    return send


cdef object _sends_take(SendsTable *table, uint32_t request_id):
    """The calls `request_id` answers, out of the table; None when it is not there."""
    cdef Py_ssize_t i
    cdef SendInFlight send
    cdef bint found = False
    _lock_holding_gil(table.lock)
    for i in range(table.count):
        if table.sends[i].request_id == request_id:
            send = _sends_remove(table, i)
            found = True
            break
    PyThread_release_lock(table.lock)
    return _send_list(&send) if found else None


cdef list _sends_take_all(SendsTable *table):
    """Every SEND's calls, out of the table, which notes nothing after this: a broken
    connection fails them."""
    cdef Py_ssize_t count, i
    _lock_holding_gil(table.lock)
    table.closed = True
    cdef SendInFlight *sends = table.sends
    count = table.count
    table.sends, table.count, table.room = NULL, 0, 0
    PyThread_release_lock(table.lock)
    try:  # made outside the lock: the reader takes it without the interpreter lock
        return [_send_list(&sends[i]) for i in range(count)]
    finally:
        free(sends)


cdef bint _all_ids(const char *body, Py_ssize_t size, Py_ssize_t count) noexcept nogil:
    """Whether a SEND_RESULT body holds `count` results, each an event_id (OK, ASCII)."""
    cdef Py_ssize_t pos = 4, i, k
    if size < 4 or es_get_be32(body) != <uint32_t>count or size != 4 + count * (3 + ID_LEN):
        return False
    for i in range(count):
        if <uint8_t>body[pos] != STATUS_OK or es_get_be16(body + pos + 1) != ID_LEN:
            return False
        for k in range(ID_LEN):
            if <uint8_t>body[pos + 3 + k] >= 0x80:
                return False
        pos += 3 + ID_LEN
    return True


# ---- the answers read ------------------------------------------------------------------------

cdef struct AnswerBuffer:
    # Bytes read and not yet handed out: whole frames are settled or copied to `out`,
    # a partial one waits for the rest. After a fault (a frame too large or too small),
    # everything from it on goes to Python, whose decoder words the fault, and nothing
    # more is read (`failed`). `spent`: the SENDs settled here, whose references wait
    # for the reader to hold the interpreter lock (`ConnectionCore.read_answers`).
    char *data
    Py_ssize_t have, room
    char *out
    Py_ssize_t out_have, out_room
    SendInFlight *spent
    Py_ssize_t spent_count, spent_room  # spent_room in bytes
    bint failed
    int error


cdef AnswerBuffer *_answer_buffer_new() except NULL:
    cdef AnswerBuffer *buffer = <AnswerBuffer *>malloc(sizeof(AnswerBuffer))
    if buffer == NULL:
        raise MemoryError()
    memset(buffer, 0, sizeof(AnswerBuffer))
    return buffer


cdef void _answer_buffer_drop_spent(AnswerBuffer *buffer) noexcept:
    """Drop the references of the SENDs settled; with the interpreter lock."""
    cdef Py_ssize_t i
    for i in range(buffer.spent_count):
        _send_drop(&buffer.spent[i])
    buffer.spent_count = 0


cdef void _answer_buffer_free(AnswerBuffer *buffer) noexcept:
    _answer_buffer_drop_spent(buffer)
    free(buffer.data)
    free(buffer.out)
    free(buffer.spent)
    free(buffer)


cdef int _answer_buffer_keep(AnswerBuffer *buffer, const char *data, Py_ssize_t size) noexcept nogil:
    """Append bytes read; -1 without memory."""
    if _grow(<void **>&buffer.data, &buffer.room, buffer.have + size) < 0:
        return -1
    memcpy(buffer.data + buffer.have, data, size)
    buffer.have += size
    return 0


cdef int _answer_buffer_hand(AnswerBuffer *buffer, const char *frame, Py_ssize_t size) noexcept nogil:
    """Copy bytes for Python to `out`; -1 without memory."""
    if _grow(<void **>&buffer.out, &buffer.out_room, buffer.out_have + size) < 0:
        return -1
    memcpy(buffer.out + buffer.out_have, frame, size)
    buffer.out_have += size
    return 0


cdef bint _answer_settle(
    AnswerBuffer *buffer, SendsTable *table, const char *frame, Py_ssize_t size
) noexcept nogil:
    """Settle the calls a whole frame answers, when it is a SEND_RESULT of event_ids for
    a SEND in the table; False for anything else (refusals, other frames), which Python
    hands out."""
    cdef uint32_t request_id = es_get_be32(frame + FRAME_LENGTH_SIZE + 1)
    cdef const char *body = frame + FRAME_HEADER_SIZE
    cdef Py_ssize_t i, index = -1
    cdef SendInFlight send
    if <uint8_t>frame[FRAME_LENGTH_SIZE] != SEND_RESULT_TYPE:
        return False
    if _grow(
        <void **>&buffer.spent, &buffer.spent_room, sizeof(SendInFlight) * (buffer.spent_count + 1)
    ) < 0:
        return False
    PyThread_acquire_lock(table.lock, WAIT_LOCK)
    for i in range(table.count):
        if table.sends[i].request_id == request_id:
            index = i
            break
    if index < 0 or not _all_ids(body, size - FRAME_HEADER_SIZE, table.sends[index].count):
        PyThread_release_lock(table.lock)
        return False
    send = _sends_remove(table, index)
    PyThread_release_lock(table.lock)
    # Woken outside the lock (each wake-up is a system call, and writers note their
    # SENDs under it meanwhile): the SEND's references, the reader's alone now, keep
    # the calls alive until it drops them holding the interpreter lock.
    for i in range(send.count):
        memcpy(send.awaited[i].event_id, body + 4 + i * (3 + ID_LEN) + 3, ID_LEN)
        _awaited_settle(send.awaited[i], SETTLED_WITH_ID)
    buffer.spent[buffer.spent_count] = send
    buffer.spent_count += 1
    return True


cdef int _answer_buffer_settle(
    AnswerBuffer *buffer, SendsTable *table, Py_ssize_t max_frame, bint *answered
) noexcept nogil:
    """Settle or hand out every whole frame buffered; `answered` once any was settled
    here. -1 without memory (what is left stays buffered)."""
    cdef Py_ssize_t pos = 0, size
    cdef uint32_t length
    cdef int result = 0
    while buffer.have - pos >= FRAME_LENGTH_SIZE:
        length = es_get_be32(buffer.data + pos)
        if length > <uint64_t>max_frame or length < FRAME_MIN_LENGTH:
            result = _answer_buffer_hand(buffer, buffer.data + pos, buffer.have - pos)
            if result == 0:
                buffer.failed = True
                pos = buffer.have
            break
        size = FRAME_LENGTH_SIZE + length
        if buffer.have - pos < size:
            break
        if table != NULL and _answer_settle(buffer, table, buffer.data + pos, size):
            answered[0] = True
        else:
            result = _answer_buffer_hand(buffer, buffer.data + pos, size)
            if result < 0:
                break
        pos += size
    if pos:
        memmove(buffer.data, buffer.data + pos, buffer.have - pos)
        buffer.have -= pos
    return result


cdef bint _answers_within(int fd, int milliseconds, int *error) noexcept nogil:
    """Whether `fd` has bytes to read (or its end) within `milliseconds`; `error` is set
    when poll() failed."""
    cdef pollfd ready
    ready.fd = fd
    ready.events = POLLIN
    ready.revents = 0
    cdef int found = poll(&ready, 1, milliseconds)
    error[0] = errno if found < 0 else 0
    return found > 0


# ---- the lane: queued calls, framed and written -----------------------------------------

cdef struct LaneCall:
    PyObject *call  # the QueuedCall: a reference the lane holds
    Awaited *awaited
    const char *topic  # its topic's UTF-8 and its SEND body, kept alive by the call
    Py_ssize_t topic_size
    const char *payload
    Py_ssize_t payload_size


cdef struct Lane:
    # The queued `send()` calls no writer took yet, in order. `lock` guards it, taken
    # as the table's is.
    PyThread_type_lock lock
    LaneCall *calls
    Py_ssize_t count, room  # room in bytes


cdef struct LaneWrite:
    # What `_lane_write` did: LANE_*; the frames and how much of them the socket took;
    # with LANE_CLOSED, the SENDs not noted (their calls' references are theirs); with
    # LANE_NO_MEMORY, the calls taken off the lane (and their references).
    int status
    int error
    char *data
    Py_ssize_t size, written
    SendInFlight *sends
    Py_ssize_t send_count
    LaneCall *calls
    Py_ssize_t call_count


cdef Lane *_lane_new() except NULL:
    cdef Lane *lane = <Lane *>malloc(sizeof(Lane))
    if lane == NULL:
        raise MemoryError()
    memset(lane, 0, sizeof(Lane))
    lane.lock = PyThread_allocate_lock()
    if lane.lock == NULL:
        free(lane)
        raise MemoryError()
    return lane


cdef void _lane_free(Lane *lane) noexcept:
    cdef Py_ssize_t i
    for i in range(lane.count):
        Py_XDECREF(lane.calls[i].call)
    free(lane.calls)
    PyThread_free_lock(lane.lock)
    free(lane)


cdef int _lane_push(Lane *lane, QueuedCall call) except -1:
    """Queue a call of a topic on the lane."""
    cdef LaneCall entry
    cdef int grown
    entry.topic = PyUnicode_AsUTF8AndSize(call._topic, &entry.topic_size)
    entry.payload = PyBytes_AS_STRING(call._payload)
    entry.payload_size = PyBytes_GET_SIZE(call._payload)
    entry.awaited = &call._awaited
    entry.call = <PyObject *>call
    _lock_holding_gil(lane.lock)
    grown = _grow(<void **>&lane.calls, &lane.room, (lane.count + 1) * sizeof(LaneCall))
    if grown == 0:
        Py_INCREF(call)
        lane.calls[lane.count] = entry
        lane.count += 1
    PyThread_release_lock(lane.lock)
    if grown < 0:
        raise MemoryError()
    return 0


cdef list _lane_calls(LaneCall *calls, Py_ssize_t count):
    """Calls taken off the lane as a list, which takes over their references."""
    cdef list taken = PyList_New(count)
    cdef Py_ssize_t i
    for i in range(count):
        PyList_SET_ITEM(taken, i, <object>calls[i].call)  # steals the reference
    free(calls)
    return taken


cdef list _lane_take(Lane *lane):
    """Every call on the lane, in order, off it: for the Python pipeline to write."""
    _lock_holding_gil(lane.lock)
    cdef LaneCall *calls = lane.calls
    cdef Py_ssize_t count = lane.count
    lane.calls, lane.count, lane.room = NULL, 0, 0
    PyThread_release_lock(lane.lock)
    return _lane_calls(calls, count)


cdef inline uint32_t _next_request_id(uint32_t *last) noexcept nogil:
    """Request ids wrap around but skip 0, the id of connection-level errors. In
    uint32_t arithmetic: with the literal 0xFFFFFFFF, a modulo was made of Python
    integers (PyNumber_Remainder, 400 instructions a call)."""
    last[0] += 1  # wraps to 0 after 0xFFFFFFFF
    if last[0] == 0:
        last[0] = 1
    return last[0]


cdef inline bint _same_topic(LaneCall *first, LaneCall *second) noexcept nogil:
    return first.topic == second.topic or (
        first.topic_size == second.topic_size
        and memcmp(first.topic, second.topic, first.topic_size) == 0
    )


cdef Py_ssize_t _lane_frame_end(
    LaneCall *calls,
    Py_ssize_t *order,
    Py_ssize_t count,
    Py_ssize_t start,
    Py_ssize_t max_frame_bytes,
    Py_ssize_t *frame_size,
) noexcept nogil:
    """Where the frame that starts at `order[start]` ends, and its length (`frame_size`):
    the calls of its topic that follow, cut by `_frame_full`."""
    cdef LaneCall *first = &calls[order[start]]
    cdef Py_ssize_t end = start, size = FRAME_MIN_LENGTH + 6 + first.topic_size
    while end < count and _same_topic(first, &calls[order[end]]) and not _frame_full(
        size, end - start, calls[order[end]].payload_size, max_frame_bytes, SEND_MAX_EVENTS
    ):
        size += calls[order[end]].payload_size
        end += 1
    frame_size[0] = size
    return end


cdef void _lane_group(LaneCall *calls, Py_ssize_t count, Py_ssize_t *order) noexcept nogil:
    """`order`: the calls' indexes with one topic's together, in order, the topics in
    the order they first came (as the Python pipeline groups them)."""
    cdef Py_ssize_t i, j, at = 0
    cdef uintptr_t grouped = 1  # a mark in a call's pointer, aligned to more than 1
    for i in range(count):
        if <uintptr_t>calls[i].call & grouped:
            continue
        for j in range(i, count):
            if not (<uintptr_t>calls[j].call & grouped) and _same_topic(&calls[i], &calls[j]):
                order[at] = j
                at += 1
                calls[j].call = <PyObject *>(<uintptr_t>calls[j].call | grouped)
    for i in range(count):
        calls[i].call = <PyObject *>(<uintptr_t>calls[i].call & ~grouped)


cdef LaneWrite _lane_write(
    Lane *lane, SendsTable *table, int fd, uint32_t *last_request_id, Py_ssize_t max_frame_bytes
) noexcept nogil:
    """Take every call off the lane, frame them as the Python pipeline does (one SEND per
    topic, cut by `_frame_full`), note the SENDs in flight and write them without
    waiting for room. The writer role is held; the caller frees `data` and `sends`."""
    cdef LaneWrite result
    cdef LaneCall *calls
    cdef Py_ssize_t count, i, start, end, frame_size, size = 0, frames = 0, at
    cdef Py_ssize_t *order
    cdef SendInFlight *send
    cdef char *p
    cdef ssize_t sent
    memset(&result, 0, sizeof(LaneWrite))
    PyThread_acquire_lock(lane.lock, WAIT_LOCK)
    calls, count = lane.calls, lane.count
    lane.calls, lane.count, lane.room = NULL, 0, 0
    PyThread_release_lock(lane.lock)
    if count == 0:
        return result
    order = <Py_ssize_t *>malloc(sizeof(Py_ssize_t) * count)
    if order == NULL:
        return _lane_unframed(calls, count, result)
    _lane_group(calls, count, order)
    start = 0
    while start < count:
        start = _lane_frame_end(calls, order, count, start, max_frame_bytes, &frame_size)
        size += FRAME_LENGTH_SIZE + frame_size
        frames += 1
    result.data = <char *>malloc(size)
    result.sends = <SendInFlight *>malloc(sizeof(SendInFlight) * frames)
    if result.data == NULL or result.sends == NULL:
        free(order)
        return _lane_unframed(calls, count, result)
    p = result.data
    start = 0
    while start < count:
        end = _lane_frame_end(calls, order, count, start, max_frame_bytes, &frame_size)
        send = &result.sends[result.send_count]
        send.count = end - start
        send.calls = <PyObject **>malloc(sizeof(PyObject *) * send.count)
        send.awaited = <Awaited **>malloc(sizeof(Awaited *) * send.count)
        if send.calls == NULL or send.awaited == NULL:
            result.send_count += 1  # freed with the others
            free(order)
            return _lane_unframed(calls, count, result)
        result.send_count += 1
        send.request_id = _next_request_id(last_request_id)
        p = _put_batch_head(
            p,
            FRAME_LENGTH_SIZE + frame_size,
            SEND_TYPE,
            send.request_id,
            calls[order[start]].topic,
            calls[order[start]].topic_size,
            send.count,
        )
        for i in range(send.count):
            at = order[start + i]
            memcpy(p, calls[at].payload, calls[at].payload_size)
            p += calls[at].payload_size
            send.calls[i] = calls[at].call
            send.awaited[i] = calls[at].awaited
        start = end
    free(order)
    free(calls)  # their references are the SENDs' now
    result.size = size
    # Noted before they are written: an answer may come before the write returns. The
    # lock is held through the write (which never waits for room): a connection dropped
    # meanwhile has its table closed first, under this lock, and its descriptor closed
    # after, so the write never goes to a descriptor closed (or reused) meanwhile.
    PyThread_acquire_lock(table.lock, WAIT_LOCK)
    if table.closed or _sends_insert(table, result.sends, result.send_count) < 0:
        result.status = LANE_CLOSED  # without memory to note them, as good as dropped
    while result.status == LANE_WRITTEN and result.written < size:
        sent = _socket_send(
            fd, result.data + result.written, size - result.written, MSG_DONTWAIT | MSG_NOSIGNAL
        )
        if sent >= 0:
            result.written += sent
        elif errno == EAGAIN:
            break  # the rest waits for room, in Python (`_write_waiting`)
        elif errno != EINTR:
            result.status = LANE_FAILED
            result.error = errno
    PyThread_release_lock(table.lock)
    return result


cdef LaneWrite _lane_unframed(LaneCall *calls, Py_ssize_t count, LaneWrite result) noexcept nogil:
    """Give the calls back without memory to frame them (the Python pipeline writes
    them); what was made for them is freed."""
    cdef Py_ssize_t i
    for i in range(result.send_count):
        free(result.sends[i].calls)
        free(result.sends[i].awaited)
    free(result.data)
    free(result.sends)
    memset(&result, 0, sizeof(LaneWrite))
    result.status = LANE_NO_MEMORY
    result.calls, result.call_count = calls, count
    return result
