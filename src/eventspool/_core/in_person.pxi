# The blocking client's connection state that its callers share, and a `send()` made in
# person on it. Included by native.pyx; the pipeline's rules are written out in
# eventspool/client/sync_pipeline.py, whose Pipeline and Connection build on these.
#
# Why compiled: with 16 processes each sending and waiting on two cores, the Python
# around `_call_alone` (the writer role, the lock, the in-flight bookkeeping, the event
# object and the settling) cost 6.5 us of client CPU per send, against 1.9 us run hot in
# a loop. A caller resumed after its wait finds little of that in the CPU's caches; the
# same steps on C fields and in one C function touch far less.


cdef extern from "pythread.h":
    PyLockStatus PyThread_acquire_lock_timed(
        PyThread_type_lock lock, long long microseconds, int intr_flag
    ) nogil


cdef extern from "<sys/time.h>" nogil:
    cdef struct timeval:
        long tv_sec
        long tv_usec

cdef extern from "<sys/socket.h>" nogil:
    int setsockopt(int fd, int level, int name, const void *value, unsigned int size)
    int _socket_open "socket"(int domain, int kind, int protocol)
    int _socket_connect "connect"(int fd, const void *address, unsigned int size)
    enum:
        SOL_SOCKET
        SO_RCVTIMEO
        SO_SNDTIMEO
        AF_UNIX
        SOCK_STREAM
        SOCK_CLOEXEC

cdef extern from "<sys/un.h>" nogil:
    cdef struct sockaddr_un:
        unsigned short sun_family
        char sun_path[108]

cdef extern from "Python.h":
    bytes PyUnicode_EncodeFSDefault(object text)


cdef inline object _os_error(int error):
    return OSError(error, strerror(error).decode("utf-8", "replace"))


def block_with_timeout(int fd, double timeout) -> None:
    """Give the blocking socket `fd` reads and writes that give up after `timeout`
    seconds (SO_RCVTIMEO, SO_SNDTIMEO); at least 1 us, as a zero timeval means never.

    Compiled because `socket.setsockopt` with a struct first tries its value as an int
    and formats the TypeError it clears: twice per option, 24,000 of a short-lived
    client's 106,000 instructions per connect, send and close (callgrind).
    """
    cdef int error = _block_with_timeout(fd, timeout)
    if error:
        raise _os_error(error)


cdef int _block_with_timeout(int fd, double timeout) noexcept nogil:
    """`block_with_timeout`: 0, or the errno of the option the socket refused."""
    cdef timeval interval
    interval.tv_sec = <long>timeout
    interval.tv_usec = <long>((timeout - interval.tv_sec) * 1e6)
    if interval.tv_sec <= 0 and interval.tv_usec <= 0:
        interval.tv_sec, interval.tv_usec = 0, 1
    if (
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &interval, sizeof(interval)) != 0
        or setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &interval, sizeof(interval)) != 0
    ):
        return errno
    return 0


def connect_unix(str path not None, double timeout) -> int:
    """The descriptor of a blocking unix stream socket connected to `path` (a leading
    NUL names an abstract address, as for `socket.connect`), close-on-exec, its reads
    and writes bounded by `timeout` (`block_with_timeout`), set before connecting: a
    connect that waits for room in the agent's backlog gives up after SO_SNDTIMEO.

    Raises OSError as `socket.connect` does, the descriptor closed. Compiled, and no
    `socket.socket` made: for a short-lived caller, making, setting and closing one
    took more instructions than its whole `send()` (callgrind).
    """
    cdef bytes name = PyUnicode_EncodeFSDefault(path)
    cdef Py_ssize_t size = PyBytes_GET_SIZE(name)
    cdef const char *raw = PyBytes_AS_STRING(name)
    cdef sockaddr_un address
    # Abstract names are their bytes; a path is NUL-terminated.
    cdef bint abstract = size == 0 or raw[0] == 0
    cdef Py_ssize_t room = sizeof(address.sun_path) - (0 if abstract else 1)
    cdef unsigned int address_size
    cdef int fd, result, error
    if size > room:
        raise OSError("AF_UNIX path too long")
    memset(&address, 0, sizeof(address))
    address.sun_family = AF_UNIX
    memcpy(address.sun_path, raw, size)
    address_size = <unsigned int>(<char *>address.sun_path - <char *>&address + size)
    if not abstract:
        address_size += 1
    fd = _socket_open(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)
    if fd < 0:
        raise _os_error(errno)
    try:
        error = _block_with_timeout(fd, timeout)
        while error == 0:
            with nogil:
                result = _socket_connect(fd, &address, address_size)
                error = 0 if result == 0 else errno
            if error == 0:
                return fd
            if error == EINTR:  # a unix socket's connect starts over
                PyErr_CheckSignals()  # a handler's exception ends it, as in Python
                error = 0
        raise _os_error(error)
    except BaseException:
        unistd.close(fd)
        raise


cdef class CoreLock:
    """A lock used as `threading.Lock` is (`with`, `acquire`, `release`, `locked`, and
    under a `threading.Condition`) that compiled code takes and gives back without a
    Python call: a `send()` alone takes the pipeline's locks three times, and those
    method calls were a quarter of the client's instructions per send (callgrind)."""

    cdef PyThread_type_lock _handle
    cdef bint _held

    def __cinit__(self):
        self._handle = PyThread_allocate_lock()
        if self._handle == NULL:
            raise MemoryError()

    def __dealloc__(self):
        if self._handle == NULL:  # the allocation failed
            return
        if self._held:
            PyThread_release_lock(self._handle)
        PyThread_free_lock(self._handle)

    cdef inline bint try_take(self) noexcept:
        """Take the lock if it is free; under the interpreter lock, so it is atomic."""
        if PyThread_acquire_lock(self._handle, NOWAIT_LOCK) == PY_LOCK_ACQUIRED:
            self._held = True
            return True
        return False

    cdef inline void take(self) noexcept:
        """Take the lock, waiting for it without the interpreter lock."""
        if not self.try_take():
            with nogil:
                PyThread_acquire_lock(self._handle, WAIT_LOCK)
            self._held = True

    cdef inline int give(self) except -1:
        if not self._held:
            raise RuntimeError("release unlocked lock")
        self._held = False
        PyThread_release_lock(self._handle)
        return 0

    def acquire(self, bint blocking=True, double timeout=-1) -> bool:
        if not blocking and timeout != -1:
            raise ValueError("can't specify a timeout for a non-blocking call")
        if self.try_take():
            return True
        if not blocking:
            return False
        if timeout < 0:
            self.take()
            return True
        return self.take_within(timeout)

    cdef bint take_within(self, double timeout) noexcept:
        """Take the lock within `timeout` seconds, waiting without the interpreter lock."""
        cdef PyLockStatus status
        cdef long long microseconds = <long long>(timeout * 1e6)
        with nogil:
            status = PyThread_acquire_lock_timed(self._handle, microseconds, 0)
        if status != PY_LOCK_ACQUIRED:
            return False
        self._held = True
        return True

    def release(self) -> None:
        self.give()

    def locked(self) -> bool:
        return self._held

    def __enter__(self) -> bool:
        self.take()
        return True

    def __exit__(self, *exc_info) -> None:
        self.give()


cdef class SendCall:
    """A `send()`'s event, and its outcome once settled: the event_id, or the error that
    refused it. `InPerson` when its caller makes the call alone, `QueuedCall` when it
    queues it."""

    cdef readonly object _topic  # None: published through `_exchange`
    cdef readonly object _exchange
    cdef public bytes _payload
    cdef readonly object outcome

    def done(self) -> bool:
        return self.outcome is not None


cdef class InPerson(SendCall):
    """The event of a `send()` whose caller found the connection idle: it writes the
    event and reads the answer itself, so only it (or a broken connection) settles it,
    and its outcome needs no lock to wait on. Always a topic's."""

    def __init__(self, str topic not None, bytes payload not None):
        self._topic = topic
        self._payload = payload

    def _settle(self, outcome) -> None:
        self.outcome = outcome


cdef class QueuedCall(SendCall):
    """The event of a `send()` that found the connection busy, and what its caller waits
    on: settled by whoever reads its answer, which gives back the lock held since it was
    made. One C object where a `Waiting` and its `Reply` were two Python ones with
    their own lock (with 16 threads sharing a client, most calls come this way). The
    compiled reader settles it without the interpreter lock (queued_calls.pxi): it leaves the
    event_id in `_awaited`, and the caller makes the `outcome` of it once woken."""

    cdef Awaited _awaited

    def __cinit__(self, *args, **kwargs):
        self._awaited.unsettled = PyThread_allocate_lock()
        if self._awaited.unsettled == NULL:
            raise MemoryError()
        PyThread_acquire_lock(self._awaited.unsettled, NOWAIT_LOCK)
        self._awaited.held = True

    def __dealloc__(self):
        if self._awaited.unsettled == NULL:  # the allocation failed
            return
        if self._awaited.held:
            PyThread_release_lock(self._awaited.unsettled)
        PyThread_free_lock(self._awaited.unsettled)

    def __init__(self, topic, exchange, bytes payload not None):
        self._topic = topic
        self._exchange = exchange
        self._payload = payload

    def done(self) -> bool:
        return self._settled()

    cdef inline bint _settled(self) noexcept:
        return es_load_acquire_u64(&self._awaited.state) != SETTLED_NOT_YET

    def _settle(self, outcome) -> None:
        """Set once, by the reader of its answer or by whoever fails it."""
        self._settle_now(outcome)

    cdef inline int _settle_now(self, outcome) except -1:
        if self._settled():
            raise RuntimeError("the call was settled already")
        self.outcome = outcome
        _awaited_settle(&self._awaited, SETTLED_IN_PYTHON)
        return 0

    cdef bint _take_within(self, double timeout) noexcept:
        """Wait until the call is settled, `timeout` seconds at most, without the
        interpreter lock."""
        cdef PyLockStatus status
        cdef long long microseconds = <long long>(timeout * 1e6)
        with nogil:
            status = PyThread_acquire_lock_timed(self._awaited.unsettled, microseconds, 0)
        if status != PY_LOCK_ACQUIRED:
            return False
        self._awaited.held = True
        return True

    def _wait_done(self, double timeout) -> bool:
        return self._take_within(timeout)

    cdef object _resolved(self):
        """The outcome, made from the event_id once the compiled reader settled the call."""
        if self.outcome is None and es_load_acquire_u64(&self._awaited.state) == SETTLED_WITH_ID:
            self.outcome = _answered_id(&self._awaited)
        return self.outcome


cdef class ConnectionCore:
    """What one blocking client's callers share about its connection: the requests in
    flight, who reads, what is left unsent. The pipeline's lock guards it. In C, so a
    `send()` alone on it (`PipelineCore.call`) reads and sets it without attribute
    lookups; `Connection` adds the socket's Python side."""

    cdef public int fd
    cdef public Py_ssize_t max_frame
    # The pipeline's `recv_into` target on a connection with TLS, made on its first
    # read and reused after it (without TLS the compiled reader reads, `read_answers`).
    cdef public bytearray buffer
    cdef public dict in_flight
    # SENDs and PUBLISHes in flight per target: an event for a busy target waits for the
    # reader, which writes it with the others queued meanwhile, in one frame.
    cdef public dict targets
    # Frames the reader wrote only in part; the writer role owns it.
    cdef public bytes unsent
    cdef public object tls
    cdef public bint closed, answered, reading
    # True while a reader handles answers it has received: it writes what is queued
    # before it reads again, so callers that see it busy leave their events to it.
    cdef public bint reader_busy
    # The reader thread, started only once an answer is due that no caller reads (see
    # `Pipeline`), and woken through `reader_wanted` for more; the thread reading the
    # answers (`reader_ident`), while one is.
    cdef public object reader, reader_wanted, reader_ident
    # The request of a call in person while it is made (`PipelineCore._in_person`), in
    # flight beside `in_flight`: an entry there cost the call a boxed id, an insertion
    # and a removal. It is read, like the rest, only while `reading`.
    cdef readonly object alone
    # The SENDs in flight that only queued `send()` calls wait on, beside `in_flight`,
    # and the bytes read and not handed out yet: the compiled reader's (`read_answers`).
    # Made on their first use.
    cdef SendsTable *_sends
    cdef AnswerBuffer *_answers

    def __cinit__(self, *args, **kwargs):
        self.in_flight = {}
        self.targets = {}
        self.unsent = b""

    def __dealloc__(self):
        if self._sends != NULL:
            _sends_table_free(self._sends)
        if self._answers != NULL:
            _answer_buffer_free(self._answers)

    def __init__(self, int fd, Py_ssize_t max_frame, tls=None) -> None:
        self.fd = fd
        self.max_frame = max_frame
        self.tls = tls

    cpdef bint idle(self):
        """Whether a caller may make its call alone: nothing in flight or being read, and
        nothing left unsent (`unsent` goes out before anything else: the pipeline's,
        then). The caller holds the lock."""
        return not (
            self.closed
            or self.reading
            or self.in_flight
            or self.unsent
            or (self._sends != NULL and self._sends.count)
            or (self._answers != NULL and self._answers.have)
        )

    def awaiting(self) -> bool:
        """Whether any request written awaits its answer."""
        return bool(self.in_flight) or (self._sends != NULL and self._sends.count > 0)

    def take_in_flight(self) -> list:
        """Every request written and not answered, the call in person's too, no longer in
        flight: those a broken connection fails. The caller holds the lock."""
        requests = list(self.in_flight.values())
        self.in_flight.clear()
        self.targets.clear()
        if self._sends != NULL:
            requests.extend(_sends_take_all(self._sends))
        if self.alone is not None:
            requests.append(self.alone)
            self.alone = None
        return requests

    cpdef note_in_flight(self, dict requests):
        """Note written requests as awaiting their answers; the caller holds the lock.

        A SEND of queued `send()` calls only, on a connection without TLS, goes to the
        compiled reader's table: it is not counted in `targets`, as no event waits for
        the reader to write it (their callers write their own, on the lane).
        """
        cdef dict targets = self.targets
        for request_id, request in requests.items():
            if self.tls is None and _awaits_in_c(request):
                if self._sends == NULL:
                    self._sends = _sends_table_new()
                _sends_note(self._sends, request_id, <list>request)
                continue
            self.in_flight[request_id] = request
            if type(request) is list:
                target = _request_target(<list>request)
                targets[target] = targets.get(target, 0) + 1

    cpdef take_answered(self, uint32_t request_id):
        """The request that `request_id` answers, no longer in flight; None when there
        is none. The caller holds the lock."""
        cdef dict targets = self.targets
        request = self.in_flight.pop(request_id, None)
        if request is None and self._sends != NULL:
            return _sends_take(self._sends, request_id)
        if type(request) is list:
            target = _request_target(<list>request)
            left = targets[target] - 1
            if left:
                targets[target] = left
            else:
                del targets[target]
        return request


    def keep_read(self, bytes data not None) -> None:
        """Bytes a call in person read that are not its whole answer alone: the reader
        hands them out before it reads on."""
        cdef Py_ssize_t size = PyBytes_GET_SIZE(data)
        if self._answers == NULL:
            self._answers = _answer_buffer_new()
        if _answer_buffer_keep(self._answers, PyBytes_AS_STRING(data), size) < 0:
            raise MemoryError()

    def read_answers(self, reply, double deadline, bint others):
        """Read answers off the socket until there are some for Python to hand out: the
        bytes of their whole frames. Those to queued `send()` calls of the table are
        settled here, without the interpreter lock, and never come out.

        Returns b"" to have the reader look again: `reply` (a call waiting in person) is
        settled, `deadline` (monotonic seconds; 0 for none) passed, or without a
        `reply` nothing is in flight any more (`others`: requests in `in_flight` at the
        call, whose answers will come out). Any other `reply`, and a connection with
        frames left unsent, get one read at a time.
        None once the agent closed the connection; after a frame too large or too small,
        its bytes come out for the decoder to word the fault, and the next call ends.
        Raises OSError as the socket module does (BlockingIOError once SO_RCVTIMEO ran
        out). Only the reader calls this, and only for a connection without TLS.
        """
        cdef Awaited *own = NULL
        # With frames left unsent, the reader writes them between its reads.
        cdef bint one_read = bool(self.unsent)
        cdef int step
        if type(reply) is QueuedCall:
            own = &(<QueuedCall>reply)._awaited
        elif reply is not None:
            one_read = True
        if self._answers == NULL:
            self._answers = _answer_buffer_new()
        cdef AnswerBuffer *buffer = self._answers
        while True:
            with nogil:
                step = self._read_step(own, one_read, others, deadline)
            _answer_buffer_drop_spent(buffer)
            if step == READ_SPENT:
                continue
            if step == READ_HANDED:
                out = PyBytes_FromStringAndSize(buffer.out, buffer.out_have)
                buffer.out_have = 0
                return out
            if step == READ_LOOK:
                return b""
            if step == READ_END:
                return None
            if step == READ_NO_MEMORY:
                raise MemoryError()
            if buffer.error != EINTR:
                raise _os_error(buffer.error)
            PyErr_CheckSignals()

    cdef int _read_step(
        self, Awaited *own, bint one_read, bint others, double deadline
    ) noexcept nogil:
        """Settle and hand out what is buffered, then read, until one of READ_*."""
        cdef AnswerBuffer *buffer = self._answers
        cdef bint answered = False, read = False
        cdef Py_ssize_t got
        while True:
            if _answer_buffer_settle(buffer, self._sends, self.max_frame, &answered) < 0:
                return READ_NO_MEMORY
            if answered:
                self.answered = True
            if buffer.out_have:
                return READ_HANDED
            if buffer.spent_count >= ANSWER_SPENT_MOST:
                return READ_SPENT
            if own != NULL and es_load_acquire_u64(&own.state) != SETTLED_NOT_YET:
                return READ_LOOK
            if one_read and read:
                return READ_LOOK
            if own == NULL and not one_read and not others and (
                self._sends == NULL or self._sends.count == 0
            ):
                if not _answers_within(self.fd, READER_LINGER_MS, &buffer.error):
                    return READ_ERROR if buffer.error else READ_LOOK
            if deadline > 0 and _monotonic_s() >= deadline:
                return READ_LOOK
            if buffer.failed or self.closed:
                return READ_END
            if _grow(<void **>&buffer.data, &buffer.room, buffer.have + ANSWER_READ_SIZE) < 0:
                return READ_NO_MEMORY
            got = _socket_recv(self.fd, buffer.data + buffer.have, buffer.room - buffer.have, 0)
            if got == 0:
                return READ_END
            if got < 0:
                buffer.error = errno
                return READ_ERROR
            buffer.have += got
            read = True


cdef inline bint _awaits_in_c(request):
    """Whether only queued `send()` calls of a topic wait on `request`: the compiled
    reader settles them."""
    if type(request) is not list:
        return False
    for item in <list>request:
        if type(item) is not QueuedCall or (<QueuedCall>item)._exchange is not None:
            return False
    return True


cdef inline tuple _request_target(list request):
    first = request[0]
    return first._topic, first._exchange


def settle_results(list request not None, bytes body not None, refusal_error not None) -> None:
    """Settle each event of `request` with its result in the SEND_RESULT `body`: its
    event_id, or `refusal_error((status, text))`. Raises ValueError, naming the fault,
    for a body that does not parse or holds another count of results; nothing is
    settled then, nor when `refusal_error` raises. A `send()`'s own call is settled
    without a Python call."""
    cdef list outcomes = decode_results(body)
    cdef Py_ssize_t count = len(request), i
    if len(outcomes) != count:
        raise ValueError(f"SEND_RESULT has {len(outcomes)} results for a SEND of {count} events")
    for i in range(count):
        result = outcomes[i]
        if type(result) is not str:
            outcomes[i] = refusal_error(result)
    for i in range(count):
        item = request[i]
        if type(item) is QueuedCall:
            (<QueuedCall>item)._settle_now(outcomes[i])
        else:
            item._settle(outcomes[i])


cdef bytes _encode_events(uint32_t request_id, list chunk):
    """A SEND frame of one topic's events, a PUBLISH frame of one exchange's; None when
    the name or the size fits no frame (the pipeline's Python says why, and fails them).
    The events give their bytes up to it: a written event is never written again (a
    broken connection fails it), and a future its caller keeps should not keep them."""
    first = chunk[0]
    exchange = first._exchange
    try:
        raw_name = PyUnicode_AsUTF8String(first._topic if exchange is None else exchange)
    except UnicodeEncodeError:
        return None
    cdef list payloads = [event._payload for event in chunk]
    frame = _batch_frame(
        SEND_TYPE if exchange is None else PUBLISH_TYPE, request_id, raw_name, payloads
    )
    if frame is not None:
        for event in chunk:
            event._payload = b""
    return frame


cdef class PipelineCore:
    """The part of a blocking client's `Pipeline` that a `send()` alone runs through:
    the writer role, the lock, the queue and the connection it looks at, and the call
    itself. Everything out of the ordinary is the Python subclass's."""

    cdef public CoreLock _lock, _writer
    cdef public object _pending, _connection, _target
    cdef public str target
    cdef public bint _closed
    cdef public double timeout, reconnect_backoff_s, _backoff
    cdef public Py_ssize_t max_batch, max_frame_bytes
    cdef public uint32_t _last_request_id  # public for the test of its wrap-around
    # Queued `send()` calls that the writer frames and writes in C (queued_calls.pxi);
    # made on its first use.
    cdef Lane *_lane
    # How a lone call's read tries before it blocks (busy_poll.pxi): only the holder of
    # the writer role touches it (`_call_alone` runs under it; so does the setter).
    cdef BusyPoll _busy_poll

    def __init__(
        self,
        target,
        double timeout,
        Py_ssize_t max_batch,
        double reconnect_backoff_s,
        Py_ssize_t max_frame_bytes,
        double busy_poll_s,
    ) -> None:
        """`target`: the client's parsed `Target`. Compiled, with the fields in C, as a
        short-lived client makes a pipeline per call."""
        self._target = target
        self.target = target.text
        self.timeout = timeout
        self.max_batch = max_batch
        self.reconnect_backoff_s = reconnect_backoff_s
        self.max_frame_bytes = max_frame_bytes
        _busy_poll_set(&self._busy_poll, busy_poll_s)
        self._lock = CoreLock()
        # Appended to by callers and emptied by the writer without a lock: deque
        # operations are atomic, and the writer role is a try-lock, so callers never
        # queue on a lock.
        self._pending = _deque()
        self._writer = CoreLock()
        self._connection = None
        self._backoff = 0.0
        self._closed = False

    def __dealloc__(self):
        if self._lane != NULL:
            _lane_free(self._lane)

    def _next_id(self) -> int:
        return self._new_id()

    @property
    def busy_poll_s(self) -> float:
        return self._busy_poll.budget_s

    @busy_poll_s.setter
    def busy_poll_s(self, double value) -> None:
        self._writer.take()
        _busy_poll_set(&self._busy_poll, value)
        self._writer.give()

    @property
    def _busy_poll_skip(self) -> int:
        """Lone calls left that block at once: for the tests of the backoff."""
        return self._busy_poll.skip

    def has_queued(self) -> bool:
        """Whether requests wait to be written."""
        return self._has_queued()

    cdef inline bint _has_queued(self):
        return bool(self._pending) or (self._lane != NULL and self._lane.count > 0)

    def _keep(self, ConnectionCore connection not None) -> bool:
        """Make a new `connection` the pipeline's; False when close() came while it was
        being made (it could not drop it: the caller closes it)."""
        cdef bint kept
        self._lock.take()
        kept = not self._closed
        if kept:
            self._connection = connection
        self._lock.give()
        return kept

    def _mark_closed(self):
        """Mark the pipeline closed, and return its connection (or None) and whether
        nobody queued, wrote, read or waits for anything on it. If so, it is taken off
        and marked closed, and closing its socket is all that is left: a short-lived
        client's close. Else `_drop` does the rest."""
        cdef ConnectionCore connection
        cdef bint idle = False
        self._lock.take()
        self._closed = True
        found = self._connection
        if found is not None:
            connection = <ConnectionCore>found
            idle = (
                connection.idle()
                and connection.reader is None
                and not self._has_queued()
                and not self._writer._held
            )
            if idle:
                connection.closed = True
                self._connection = None
        self._lock.give()
        return found, idle

    cdef inline uint32_t _new_id(self) noexcept:
        return _next_request_id(&self._last_request_id)

    cdef str call(self, topic, exchange, bytes payload):
        """A blocking `send()` (`ClientCore.send`): the event_id, or raises the error that
        refused the event. Made in person when nothing else is queued, in flight or being
        read (`_in_person`); otherwise queued, and waited for, like any call."""
        cdef InPerson event
        outcome = None
        if (
            topic is not None  # else an exchange's
            and not self._has_queued()
            and not self._closed
            and not self._busy()
            and self._writer.try_take()
        ):
            event = InPerson(topic, payload)
            try:
                reading = self._in_person(event)
            finally:
                self._writer.give()
            if reading is not None:  # what others queued meanwhile, or a broken answer
                self._read(reading, event, _monotonic_s() + self.timeout)
                outcome = event.outcome or self._no_answer()
            elif event.outcome is not None:
                if self._has_queued():  # queued while this caller held the writer role
                    self._flush()
                outcome = event.outcome
        if outcome is None:
            outcome = self._queued(topic, exchange, payload)
        if type(outcome) is str:
            return <str>outcome
        raise outcome

    cdef inline bint _busy(self):
        """Whether the connection has requests in flight, being read or left unsent: a
        call then queues behind them, as a call alone (`_in_person`, `_write_alone`)
        would find out only after making its frame. Read without the lock, as a hint:
        those calls look again under it."""
        found = self._connection
        if found is None:
            return False
        connection = <ConnectionCore>found
        return not connection.closed and not connection.idle()

    cdef object _queued(self, topic, exchange, bytes payload):
        """A `send()` not made in person: written alone when the writer role is free and
        nothing is queued or in flight (`_write_alone`, which gives the role back), else
        queued, on the lane when it may (`_on_lane`); then waited for, like any call."""
        cdef QueuedCall event = QueuedCall(topic, exchange, payload)
        if self._has_queued() or self._closed or self._busy() or not self._writer.try_take():
            if not self._on_lane(event):
                self.submit([event])
        else:
            self._write_alone(event)
        self.wait(event)
        return event._resolved()

    cdef bint _on_lane(self, QueuedCall event) except -1:
        """Queue a topic's call on the lane and write what is queued unless another
        thread is writing; False when it must queue in Python: on a connection with TLS
        or none yet, and behind requests queued there (one thread's requests are written
        in the order it made them)."""
        cdef ConnectionCore connection
        found = self._connection
        if event._exchange is not None or found is None or self._closed or self._pending:
            return False
        if PyBytes_GET_SIZE(event._payload) > self.max_frame_bytes:
            return False  # a frame of its own, or none: the Python pipeline's checks
        connection = <ConnectionCore>found
        if connection.closed or connection.tls is not None:
            return False
        if self._lane == NULL:
            self._lane = _lane_new()
        _lane_push(self._lane, event)
        self._flush()
        return True

    cpdef submit(self, list items, bint control=False):
        """Queue requests (events of one call, or one PING or STATS: `control`); write
        them unless another thread is writing (it takes them).

        An event for a target with a request in flight, or queued while the reader
        handles answers, is left to the reader: it writes after its next answers, so
        callers that fire faster than the round trip share frames instead of each paying
        a write and a wake-up. The agent answers one target's requests in order anyway.
        A full batch queued is written at once, unless the reader is busy.
        """
        cdef ConnectionCore connection
        if self._closed:
            raise self._closed_error()
        pending = self._pending
        pending.extend(items)
        found = self._connection
        if found is not None:
            connection = <ConnectionCore>found
            # A busy reader writes next in any case; the caller may be that very reader,
            # in a done callback, and must not wait for room while nobody reads.
            if connection.reader_busy:
                return
            if not control and len(pending) < self.max_batch:
                first = items[0]
                if (first._topic, first._exchange) in connection.targets:
                    return
        self._flush()

    cpdef _flush(self):
        """Write what is queued, unless another thread is writing (it takes it along):
        the pipeline's `_write_pending`, as the writer. Compiled, as most calls of 16
        threads sharing a client come here to find the writer role taken."""
        # Whoever holds the writer role looks at the queue again after letting go of it,
        # so a request queued while it was letting go is never left behind.
        while self._has_queued() and self._writer.try_take():
            try:
                self._write_queued()
            finally:
                self._writer.give()

    cdef int _write_queued(self) except -1:
        """The writer writes what is queued: the lane's calls in C when the connection
        takes them as they are (plain, nothing left unsent), the rest in Python
        (`_write_pending`, which takes the lane's first)."""
        cdef ConnectionCore connection
        while self._lane != NULL and self._lane.count:
            found = self._connection
            if found is None:
                break
            connection = <ConnectionCore>found
            if connection.closed or connection.tls is not None or connection.unsent:
                break
            self._write_lane(connection)
        if self._has_queued():
            self._write_pending()
        return 0

    cdef int _write_lane(self, ConnectionCore connection) except -1:
        """Frame, note and write the lane's calls without the interpreter lock, and those
        queued meanwhile; what is out of the ordinary goes on in Python: a partial write (`_write_waiting`), a
        broken socket (`_drop`), a connection dropped meanwhile (`_fail_unwritten`), no
        memory (the calls go back to the front of the queue)."""
        cdef LaneWrite done
        cdef Py_ssize_t i
        if connection._sends == NULL:
            connection._sends = _sends_table_new()
        with nogil:  # and on, while callers queue more meanwhile and all goes well
            while True:
                done = _lane_write(
                    self._lane,
                    connection._sends,
                    connection.fd,
                    &self._last_request_id,
                    self.max_frame_bytes,
                )
                if done.status != LANE_WRITTEN or done.written < done.size or not self._lane.count:
                    break
                free(done.data)
                free(done.sends)
        try:
            if done.status == LANE_NO_MEMORY:
                self._pending.extendleft(reversed(_lane_calls(done.calls, done.call_count)))
            elif done.status == LANE_CLOSED:
                self._fail_unwritten([_send_list(&done.sends[i]) for i in range(done.send_count)])
            elif done.status == LANE_FAILED:
                self._drop(connection, f"writing failed: {_os_error(done.error)}")
            else:
                # Its callers may all wait on their calls, if the one who was reading
                # just left: somebody reads what was written.
                self._lock.take()
                try:
                    if not (connection.reading or connection.closed):
                        self._wake_reader(connection)
                finally:
                    self._lock.give()
                if done.written < done.size:
                    self._write_waiting(
                        connection,
                        PyBytes_FromStringAndSize(done.data + done.written, done.size - done.written),
                    )
        finally:
            free(done.data)
            free(done.sends)
        return 0

    def wait(self, reply) -> None:
        """Wait until `reply` (a call's, or a future) is done, reading the answers while
        nobody else does; AgentError once `timeout` ran out."""
        cdef double deadline = _monotonic_s() + self.timeout, left
        # A `send()`'s own call is waited on in C; the others through their methods.
        cdef QueuedCall call = reply if type(reply) is QueuedCall else None
        while not (call._settled() if call is not None else reply.done()):
            left = deadline - _monotonic_s()
            if left <= 0:
                raise self._no_answer()
            connection = self._take_reading()
            if connection is None:
                if call is not None:
                    call._take_within(left)
                else:
                    reply._wait_done(left)
            else:
                self._read(connection, reply, deadline)

    cdef object _take_reading(self):
        """The connection, when the caller may read it: nobody else is reading."""
        cdef ConnectionCore connection
        self._lock.take()
        found = self._connection
        if found is not None:
            connection = <ConnectionCore>found
            if connection.closed or connection.reading:
                found = None
            else:
                connection.reading = True
        self._lock.give()
        return found

    # ---- the writer's batch and the reader's answers -------------------------------------
    #
    # Compiled: with 16 threads sharing one client, the reader writes and settles a batch
    # of a few events per round trip, and these loops per event were two thirds of the
    # client's Python lines and most of its user time (11-12 us per event, against 4-5
    # us for a bare hand-off of the same batches to the agent). What needs the wire's
    # words or rules goes through the Pipeline's methods: `_cut`, `_encode_other`,
    # `_fail_unwritten` and `_settle_other`.

    def _take(self, Py_ssize_t most) -> list:
        """The lane's calls, then up to `most` requests from the front of the queue;
        callers may append meanwhile, and close() may take them too."""
        cdef list taken = _lane_take(self._lane) if self._lane != NULL else []
        cdef Py_ssize_t n
        take = self._pending.popleft
        for n in range(most):
            try:
                taken.append(take())
            except IndexError:  # emptied
                break
        return taken

    def _frames(self, ConnectionCore connection not None, list batch not None) -> bytes:
        """Encode a batch and note it in flight; only the writer calls this, so ids need
        no lock."""
        cdef list frames = []
        cdef dict requests = {}
        cdef uint32_t request_id
        cdef bint closed
        for request in self._requests(batch):
            request_id = self._new_id()
            frame = self._frame_of(request_id, request)
            if frame is not None:
                requests[request_id] = request
                frames.append(frame)
        self._lock.take()
        try:
            # Dropped meanwhile (by the reader, or close()): nobody would settle these.
            closed = connection.closed
            if not closed:
                connection.note_in_flight(requests)
                if not connection.reading and self._waits_for_nobody(batch):
                    self._wake_reader(connection)
        finally:
            self._lock.give()
        if closed:
            self._fail_unwritten(list(requests.values()))
            return b""
        return b"".join(frames)

    cpdef bytes _frame_of(self, uint32_t request_id, request):
        """The frame of `request`; None when it fits no frame, and its events failed."""
        if type(request) is list:
            frame = _encode_events(request_id, <list>request)
            if frame is not None:
                return frame
        return self._encode_other(request_id, request)

    cdef bint _waits_for_nobody(self, list batch) except -1:
        """Whether `batch` holds a `send_async()` future, whose answer no caller reads."""
        future_type = self._future_type
        for item in batch:
            if type(item) is future_type:
                return True
        return False

    cdef list _requests(self, list batch):
        """One SEND per topic (PUBLISH per exchange), cut by `_cut` to stay under the
        agent's maximum; a PING or STATS as it is."""
        cdef list requests = [], group = None, sizes
        cdef dict by_target = {}
        control_type = self._control_type
        last_topic = last_exchange = None
        for item in batch:
            if type(item) is control_type:
                requests.append(item)
                continue
            topic, exchange = item._topic, item._exchange
            if group is None or topic is not last_topic or exchange is not last_exchange:
                target = (topic, exchange)
                group = by_target.get(target)
                if group is None:
                    group = by_target[target] = []
                last_topic, last_exchange = topic, exchange
            group.append(item)
        for target, found in by_target.items():
            group = <list>found
            topic, exchange = target
            sizes = [len(item._payload) for item in group]
            cuts = self._cut(exchange if exchange is not None else topic, sizes)
            if len(cuts) == 1:
                requests.append(group)
            else:
                requests.extend([group[cut] for cut in cuts])
        return requests

    def _answer_all(self, ConnectionCore connection not None, list frames not None) -> None:
        """Hand each answer to the callers of its request, matched by request id.

        Raises ValueError for a SEND_RESULT that does not answer its request (see
        `settle_results`), and what `_settle_other` raises for other answers; the
        request stays in flight then, to fail with the connection the caller drops.
        """
        cdef Frame frame
        for found in frames:
            frame = <Frame>found
            self._lock.take()
            try:
                request = connection.take_answered(frame.request_id)
            finally:
                self._lock.give()
            try:
                if request is not None:
                    connection.answered = True
                    if type(request) is list and frame.type == SEND_RESULT_TYPE:
                        settle_results(<list>request, frame.body, self._refusal_error)
                        continue
                self._settle_other(request, frame)
            except BaseException:
                if request is not None:
                    self._lock.take()
                    connection.note_in_flight({frame.request_id: request})
                    self._lock.give()
                raise

    cdef object _in_person(self, InPerson event):
        """The writer makes `event`'s call whole with `_call_alone`: written, its answer
        read and settled. Returns the connection when `_read` must go on reading it;
        None when the call is over (or was not made: not alone, or no connection, whose
        reason is then the event's outcome).

        What `_call_alone` leaves (a frame the socket did not take whole, an answer that
        is not this call's alone) is in flight as any request, and the Python side
        (`_finish_in_person`) goes on with it; so is the reading when others queued
        meanwhile (they queue, as the writer role is held): `_read` writes their events
        as the reader, then hands the reading on.
        """
        cdef ConnectionCore connection
        cdef uint32_t request_id
        cdef bint answered, over
        found = self._connection
        if found is None or (<ConnectionCore>found).closed:
            found = self._connect_or_fail([event])
            if found is None:
                return None
        connection = <ConnectionCore>found
        if connection.tls is not None:
            return None
        cdef CoreLock lock = self._lock
        lock.take()
        try:
            if not connection.idle():
                return None
            request_id = self._new_id()
            # In flight for `_drop`; its target is noted only if it comes to `_read`.
            connection.alone = [event]
            connection.reading = True
        finally:
            lock.give()
        error = None
        try:
            kind, value = _call_alone(
                connection.fd, request_id, event._topic, event._payload, &self._busy_poll
            )
        except (ValueError, OSError) as exc:  # a size no frame carries; a broken socket
            kind, value, error = CALL_READ, b"", exc
        event._payload = b""  # written: a broken connection fails it, it is never resent
        answered = kind == CALL_ANSWERED
        lock.take()
        try:
            request = connection.alone
            connection.alone = None
            if request is not None and not answered and not isinstance(error, ValueError):
                connection.note_in_flight({request_id: request})
            # Nobody queued meanwhile: nobody waits for this reader to write for them.
            over = answered and not self._has_queued()
            if over:
                connection.reading = False
        finally:
            lock.give()
        if request is None:  # dropped meanwhile: failed with the others
            return connection
        if answered and type(value) is str:
            connection.answered = True
            event.outcome = value
        else:
            self._finish_in_person(connection, event, kind, value, error)
        return None if over else connection


cdef class ClientCore:
    """The part of the blocking `Client` that `send()` and `send_async()` run through,
    compiled down to the pipeline: with 16 caller processes of their own on two cores, the
    Python frame of `send()` alone cost 0.8 us of client CPU per call (14.9 against 13.9
    us, medians of 8 alternated pairs), most of it in cache misses after each wait. The
    rest of the client is the Python subclass's: it makes `_pipeline` and `_outstanding`,
    checks the uncommon event (`_checked_payload`) and names the error a wait over
    `max_queued` lets pass (`_unreachable`)."""

    cdef public PipelineCore _pipeline
    cdef public object _outstanding
    cdef public Py_ssize_t max_queued

    def send(
        self,
        topic,
        value,
        key=None,
        headers=None,
        *,
        exchange=None,
        routing_key="",
        event_id=None,
    ) -> str:
        """Hand one event to the agent; returns its event_id once the agent spooled it.

        Raises what `Spool.send()` raises for the event itself, AgentError when the agent
        cannot be reached within `timeout` (the event may or may not have been spooled
        if the connection broke after it was written: send it again with the same
        `event_id` and consumers drop the copy). With `exchange` (and `topic=None`) the
        agent routes the event by `routing_key`, as `Spool.send()` does.
        """
        payload = self._payload(topic, value, key, headers, event_id, exchange, routing_key)
        return self._made().call(topic, exchange, payload)

    def send_async(
        self,
        topic,
        value,
        key=None,
        headers=None,
        *,
        exchange=None,
        routing_key="",
        event_id=None,
    ):
        """Queue one event and return at once; the future gives its event_id or error.

        Arguments are checked as in `send()`, and a bad one raises here. The future fails
        with AgentError when the agent cannot be reached; it does not time out by itself
        (`future.result(timeout)` does). While more than `max_queued` events of this
        client await their answer, the call waits for its own (at most `timeout`): callers
        that fire faster than the agent spools are slowed to its pace, not left to fill
        the memory, as librdkafka's `queue.buffering.max.messages` does.
        """
        payload = self._payload(topic, value, key, headers, event_id, exchange, routing_key)
        cdef PipelineCore pipeline = self._made()
        outstanding = self._outstanding
        future = pipeline._future_type(topic, exchange, payload, outstanding)
        pipeline.submit([future])
        if (
            next(outstanding.queued) - outstanding.settled_total > self.max_queued
            and not pipeline.reading_here()
        ):
            try:
                pipeline.wait(future)
            except self._unreachable:  # queued all the same: the future tells
                pass
        return future

    cdef inline bytes _payload(
        self, topic, value, key, headers, event_id, exchange, routing_key
    ):
        """The event's SEND (PUBLISH) body: the common event's made here, any other's
        checked in Python, whose errors say what is wrong in their own words."""
        payload = _common_event_payload(topic, value, key, headers, event_id)
        if payload is None or exchange is not None:
            payload = self._checked_payload(
                topic, value, key, headers, event_id, exchange, routing_key
            )
        return payload

    cdef inline PipelineCore _made(self):
        """The pipeline; a C method of None would read through a null table."""
        if self._pipeline is None:
            raise TypeError("the client was not initialised")
        return self._pipeline
