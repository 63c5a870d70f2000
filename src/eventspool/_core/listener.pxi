# The agent's unix socket served by the compiled core on a thread of its own: accept,
# read, spool and answer, with no event loop in between. Included by native.pyx;
# eventspool/agent/unix_listener.py runs it and takes the connections it hands over.

from cpython.bytearray cimport PyByteArray_FromStringAndSize
from libc.errno cimport ECONNABORTED, EMFILE, ENFILE, ENOBUFS, ENOMEM
from libc.math cimport INFINITY
from posix.time cimport CLOCK_MONOTONIC


cdef extern from "<sys/epoll.h>" nogil:
    ctypedef union epoll_data_t:
        int fd
        uint64_t u64
    struct epoll_event:
        uint32_t events
        epoll_data_t data
    int epoll_create1(int flags)
    int epoll_ctl(int epoll_fd, int op, int fd, epoll_event *event)
    int epoll_wait(int epoll_fd, epoll_event *events, int max_events, int timeout_ms)
    enum:
        EPOLLIN
        EPOLLOUT
        EPOLL_CTL_ADD
        EPOLL_CTL_MOD
        EPOLL_CTL_DEL
        EPOLL_CLOEXEC


cdef extern from "<sys/eventfd.h>" nogil:
    int eventfd(unsigned int initial, int flags)
    enum:
        EFD_NONBLOCK
        EFD_CLOEXEC


cdef extern from "<sys/prctl.h>" nogil:
    int prctl(int option, unsigned long arg2, unsigned long arg3, unsigned long arg4, unsigned long arg5)
    enum:
        PR_SET_NAME


cdef extern from "<sys/socket.h>" nogil:
    int accept4(int fd, void *address, void *address_length, int flags)
    enum:
        SOCK_NONBLOCK


cdef enum:
    LISTENER_EVENTS = 64  # epoll events taken per wake
    LISTENER_READ_SIZE = 262144  # as the Python server reads
    ACCEPTS_PER_WAKE = 64  # so that a burst of connections does not starve the others
    LISTENER_ANSWERS_KEPT = 65536  # the answer buffer shrinks back to this after a larger read


# Out of descriptors or memory: accepting pauses this long, as asyncio's servers do.
LISTENER_ACCEPT_RETRY_S = 1.0


cdef inline double _monotonic_s() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return ts.tv_sec + ts.tv_nsec * 1e-9


# The epoll tags that are not a peer's address.
cdef enum:
    WAKE_TAG = 0
    LISTEN_TAG = 1


cdef class _UnixPeer:
    """One connection the compiled listener serves."""

    cdef int fd
    cdef bint heard  # it sent something: it is no longer timed as a silent connection
    cdef bint answered  # the listener consumed frames of it: it is past its first bytes
    cdef bytearray pending  # a partial frame's bytes, kept between reads
    cdef bytes unsent  # answers the socket did not take yet; it is not read meanwhile
    cdef double since  # when it connected, while silent; when its partial frame began


cdef inline uint64_t _tag_of(_UnixPeer peer) noexcept:
    return <uint64_t><uintptr_t><void *>peer


cdef class UnixIntake:
    """The unix socket's connections, served on the thread that calls `run`.

    Only for an agent that judges nothing (no access rules, no quotas). A read's SENDs to
    topics that never wait and its PINGs are answered from it at once (`_spool_frames`);
    the answers of one read go out in one write. At the first frame it leaves to Python
    the connection is handed over for good: `hand_over(fd, the bytes from that frame on,
    answers not written yet, whether frames were answered before)`, called on this
    thread. A connection that stays silent, or whose frame takes longer than
    `frame_timeout_s` to arrive, is closed, as the Python server closes them; a client
    that does not read its answers is not read either.
    """

    cdef int listen_fd
    cdef int epoll_fd
    cdef int wake_fd
    cdef SpoolFront front
    cdef Py_ssize_t max_frame
    cdef double frame_timeout_s
    cdef _NeverWaiting never_waiting
    cdef object fallback
    cdef object hand_over
    cdef object counters
    cdef Py_ssize_t requests  # SENDs spooled this turn, added to `counters` at its end
    cdef object failed
    cdef dict peers  # by descriptor, holding them; each is the tag of its epoll entry
    cdef bytearray read_buffer
    cdef _ResultBuffer answers  # a read's answers, reused read after read
    cdef bint stopping
    cdef bint listening
    cdef double next_deadline  # the earliest a silent or partial connection times out
    cdef double accept_again  # when accepting resumes after running out of descriptors
    cdef BusyPoll busy_poll  # how a wait for the sockets tries before it blocks

    def __cinit__(self, *args, **kwargs):
        self.epoll_fd = -1
        self.wake_fd = -1

    def __init__(
        self,
        int listen_fd,
        SpoolFront front not None,
        Py_ssize_t max_frame,
        double frame_timeout_s,
        set inline not None,
        learn,
        fallback,
        hand_over,
        counters,
        failed,
        double busy_poll_s,
    ):
        """`listen_fd` stays the caller's to close; `learn`, `fallback` and `inline` are
        those of `intake_frames`; `counters` gets `requests` and `protocol_errors` added
        to; `failed(what, exc)` reports what went wrong with one connection or with
        accepting (the listener goes on). A wait for the sockets busy-polls for
        `busy_poll_s` (busy_poll.pxi) before it blocks."""
        if self.epoll_fd >= 0:
            raise RuntimeError("UnixIntake is initialised once")
        self.listen_fd = listen_fd
        self.front = front
        self.max_frame = max_frame
        self.frame_timeout_s = frame_timeout_s
        _busy_poll_set(&self.busy_poll, busy_poll_s)
        self.never_waiting = _NeverWaiting(inline, learn)
        self.fallback = fallback
        self.hand_over = hand_over
        self.counters = counters
        self.failed = failed
        self.peers = {}
        self.read_buffer = bytearray(LISTENER_READ_SIZE)
        self.answers = _ResultBuffer(LISTENER_ANSWERS_KEPT)
        self.next_deadline = INFINITY
        self.accept_again = 0.0
        self.epoll_fd = epoll_create1(EPOLL_CLOEXEC)
        if self.epoll_fd < 0:
            raise _os_error(errno)
        self.wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)
        if self.wake_fd < 0:
            raise _os_error(errno)
        self._watch(self.wake_fd, EPOLL_CTL_ADD, EPOLLIN, WAKE_TAG)
        self._watch(listen_fd, EPOLL_CTL_ADD, EPOLLIN, LISTEN_TAG)
        self.listening = True

    def __dealloc__(self):
        if self.epoll_fd >= 0:
            unistd.close(self.epoll_fd)
        if self.wake_fd >= 0:
            unistd.close(self.wake_fd)

    @property
    def connections(self) -> int:
        return len(self.peers)

    def stop(self) -> None:
        """From any thread: `run` returns after the turn it is in."""
        cdef uint64_t one = 1
        unistd.write(self.wake_fd, &one, sizeof(one))

    def run(self) -> None:
        """Serve until `stop()`, then close the connections still here.

        The interpreter lock is let go only while waiting for the sockets: the reads and
        writes never block, and taking the lock back after each would cost more.
        """
        cdef epoll_event events[LISTENER_EVENTS]
        cdef int ready, i, timeout_ms, error = 0
        # The name `top -H`, `perf` and /proc show for this thread.
        prctl(PR_SET_NAME, <unsigned long><const char *>b"es-unix-intake", 0, 0, 0)
        try:
            while not self.stopping:
                timeout_ms = self._timeout_ms()
                with nogil:
                    ready = self._wait(events, timeout_ms)
                    if ready < 0:
                        error = errno
                if ready < 0:
                    if error == EINTR:
                        continue
                    raise _os_error(error)
                for i in range(ready):
                    self._ready(events[i].data.u64)
                self._expire()
                self._end_turn()
        finally:
            self._end_turn()
            for found in list(self.peers.values()):
                peer = <_UnixPeer>found
                try:
                    if peer.unsent is None:
                        self._close(peer)
                    else:  # answers of spooled events: the server writes them, then closes
                        self._hand_over(peer, NULL, 0, peer.unsent, True)
                except Exception as exc:
                    self._close(peer)
                    self._report("closing a connection", exc)

    cdef int _wait(self, epoll_event *events, int timeout_ms) noexcept nogil:
        """epoll_wait for up to `timeout_ms`, tried without waiting first while
        `busy_poll` keeps trying."""
        cdef int ready
        cdef double until = _busy_poll_start(&self.busy_poll) if timeout_ms != 0 else 0
        if until:
            while True:
                ready = epoll_wait(self.epoll_fd, events, LISTENER_EVENTS, 0)
                if ready > 0:
                    _busy_poll_met(&self.busy_poll)
                if ready != 0 or not _busy_poll_again(&self.busy_poll, until):
                    break
            if ready != 0:
                return ready
        return epoll_wait(self.epoll_fd, events, LISTENER_EVENTS, timeout_ms)

    cdef int _ready(self, uint64_t tag) except -1:
        """Serve what epoll found ready: its tag is a peer itself (no lookup by
        descriptor), or names the wake-up or the listening socket.

        A turn's events name each connection once, and a peer is closed or handed over
        (let go by `peers`) only while its own event is served or between turns, so no
        event names a peer that is gone. `peer` holds a reference while it is served:
        `_close` lets go of the one in `peers`, then marks the peer closed.
        """
        cdef _UnixPeer peer
        if tag == WAKE_TAG:
            self.stopping = True
        elif tag == LISTEN_TAG:
            try:
                self._accept()
            except Exception as exc:
                self._report("accepting a connection", exc)
        else:
            peer = <_UnixPeer><void *><uintptr_t>tag
            self._serve(peer)
        return 0

    cdef int _end_turn(self) except -1:
        """Add the turn's SENDs to the counters: once a turn, not once a read."""
        if self.requests:
            self.counters.requests += self.requests
            self.requests = 0
        return 0

    cdef int _serve(self, _UnixPeer peer) except -1:
        """Write what waits to be written, else read; a failure closes the connection."""
        try:
            if peer.unsent is not None:
                self._flush(peer)
            else:
                self._read(peer)
        except Exception as exc:
            self._close(peer)
            self._report("serving a connection", exc)
        return 0

    cdef int _report(self, str what, exc) noexcept:
        """`failed(what, exc)`; whatever it raises cannot stop the listener."""
        try:
            self.failed(what, exc)
        except BaseException:
            pass
        return 0

    cdef int _watch(self, int fd, int op, uint32_t flags, uint64_t tag) except -1:
        cdef epoll_event event
        event.events = flags
        event.data.u64 = tag
        if epoll_ctl(self.epoll_fd, op, fd, &event) < 0:
            raise _os_error(errno)
        return 0

    cdef int _timeout_ms(self) noexcept:
        """Until the next connection may time out or accepting resumes; -1 for never."""
        cdef double deadline = self.next_deadline
        if not self.listening and self.accept_again < deadline:
            deadline = self.accept_again
        if deadline == INFINITY:
            return -1
        deadline -= _monotonic_s()
        if deadline <= 0:
            return 0
        return <int>(deadline * 1000) + 1

    cdef int _waits_until(self, double deadline) noexcept:
        if deadline < self.next_deadline:
            self.next_deadline = deadline
        return 0

    cdef int _accept(self) except -1:
        cdef int fd, error, n
        cdef _UnixPeer peer
        for n in range(ACCEPTS_PER_WAKE):
            fd = accept4(self.listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC)
            if fd < 0:
                error = errno
                if error == EAGAIN:
                    return 0
                if error == EINTR or error == ECONNABORTED:
                    continue
                if error == EMFILE or error == ENFILE or error == ENOBUFS or error == ENOMEM:
                    self._watch(self.listen_fd, EPOLL_CTL_DEL, 0, LISTEN_TAG)
                    self.listening = False
                    self.accept_again = _monotonic_s() + LISTENER_ACCEPT_RETRY_S
                raise _os_error(error)
            peer = _UnixPeer.__new__(_UnixPeer)
            peer.fd = fd
            peer.since = _monotonic_s()
            self.peers[fd] = peer
            try:
                self._watch(fd, EPOLL_CTL_ADD, EPOLLIN, _tag_of(peer))
            except OSError:
                self._close(peer)
                raise
            self._waits_until(peer.since + self.frame_timeout_s)
            # A short-lived caller writes its request as soon as it is connected: read
            # now, it is answered without waiting for the next turn, and the listener
            # saves a wake-up and a turn for the interpreter lock.
            self._serve(peer)
        return 0

    cdef int _read(self, _UnixPeer peer) except -1:
        """One read: answer its whole frames, keep a partial one, or hand the connection
        over at the first frame left to Python."""
        cdef Py_ssize_t got, size, consumed
        cdef int sends = 0
        cdef bint partial
        cdef const char *p
        cdef char *into = PyByteArray_AS_STRING(self.read_buffer)
        got = _socket_recv(peer.fd, into, LISTENER_READ_SIZE, MSG_DONTWAIT)
        if got <= 0:
            if got < 0 and (errno == EAGAIN or errno == EINTR):
                return 0
            self._close(peer)  # the client's end of file, or a reset: all read was answered
            return 0
        peer.heard = True
        data = peer.pending
        if data is None:
            p = into
            size = got
        else:
            data.extend(memoryview(self.read_buffer)[:got])
            p = PyByteArray_AS_STRING(data)
            size = PyByteArray_GET_SIZE(data)
        out = self.answers
        out.clear(LISTENER_ANSWERS_KEPT)
        consumed = _spool_frames(
            self.front, p, size, self.max_frame, self.never_waiting, self.fallback, out,
            &sends, &partial,
        )
        self.requests += sends
        if consumed < size and not partial:
            self._hand_over(
                peer,
                p + consumed,
                size - consumed,
                PyBytes_FromStringAndSize(PyByteArray_AS_STRING(out.data), out.used),
                peer.answered or consumed > 0,
            )
            return 0
        if consumed:
            peer.answered = True
        if not partial:
            peer.pending = None
        elif data is None or consumed:  # a new partial frame: its time starts now
            if data is None:
                peer.pending = PyByteArray_FromStringAndSize(p + consumed, size - consumed)
            else:
                del data[:consumed]
            peer.since = _monotonic_s()
            self._waits_until(peer.since + self.frame_timeout_s)
        if out.used:
            self._write(peer, PyByteArray_AS_STRING(out.data), out.used)
        return 0

    cdef int _write(self, _UnixPeer peer, const char *data, Py_ssize_t size) except -1:
        """Write what the socket takes now; the rest waits, and reading with it."""
        cdef Py_ssize_t sent = _socket_send(peer.fd, data, size, MSG_DONTWAIT | MSG_NOSIGNAL)
        if sent < 0:
            if errno != EAGAIN and errno != EINTR:  # the client is gone
                self._close(peer)
                return 0
            sent = 0
        if sent < size:
            peer.unsent = PyBytes_FromStringAndSize(data + sent, size - sent)
            self._watch(peer.fd, EPOLL_CTL_MOD, EPOLLOUT, _tag_of(peer))
        return 0

    cdef int _flush(self, _UnixPeer peer) except -1:
        unsent = peer.unsent
        peer.unsent = None
        self._watch(peer.fd, EPOLL_CTL_MOD, EPOLLIN, _tag_of(peer))
        self._write(peer, PyBytes_AS_STRING(unsent), PyBytes_GET_SIZE(unsent))
        return 0

    cdef int _hand_over(
        self, _UnixPeer peer, const char *rest, Py_ssize_t size, bytes unsent, bint answered
    ) except -1:
        cdef int fd = peer.fd
        self._watch(fd, EPOLL_CTL_DEL, 0, 0)
        del self.peers[fd]
        peer.fd = -1
        try:
            self.hand_over(fd, PyBytes_FromStringAndSize(rest, size), unsent, answered)
        except BaseException:
            unistd.close(fd)  # nobody took it
            raise
        return 0

    cdef int _close(self, _UnixPeer peer) except -1:
        if peer.fd < 0:
            return 0
        if peer.unsent is not None:  # the last answers, if the socket takes them now
            _socket_send(peer.fd, PyBytes_AS_STRING(peer.unsent), PyBytes_GET_SIZE(peer.unsent), MSG_DONTWAIT | MSG_NOSIGNAL)
        unistd.close(peer.fd)  # which takes it out of the epoll set too
        self.peers.pop(peer.fd, None)
        peer.fd = -1
        return 0

    cdef int _expire(self) except -1:
        """Close the connections silent or inside one frame for `frame_timeout_s`, and
        resume accepting when it is time."""
        cdef double now = _monotonic_s(), deadline, next_deadline = INFINITY
        cdef _UnixPeer peer
        if not self.listening and now >= self.accept_again:
            try:
                self._watch(self.listen_fd, EPOLL_CTL_ADD, EPOLLIN, LISTEN_TAG)
                self.listening = True
            except OSError as exc:
                self.accept_again = now + LISTENER_ACCEPT_RETRY_S
                self._report("accepting again", exc)
        if now < self.next_deadline:
            return 0
        for found in list(self.peers.values()):
            peer = <_UnixPeer>found
            if peer.heard and peer.pending is None:
                continue
            deadline = peer.since + self.frame_timeout_s
            if deadline > now:
                if deadline < next_deadline:
                    next_deadline = deadline
                continue
            if peer.heard:  # a frame arriving too slowly: a slowloris
                self.counters.protocol_errors += 1
            self._close(peer)
        self.next_deadline = next_deadline
        return 0
