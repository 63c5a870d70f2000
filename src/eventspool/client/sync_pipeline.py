"""How the blocking `Client`'s requests reach the agent and its answers come back: the
queue, the writer role, the reader (a waiting caller, or the reader thread), and the
connection they share.

A Client's sends are pipelined over one connection: a caller queues its event and,
unless another caller is already writing, writes everything queued as SEND frames (one
per topic) without waiting for answers. Then it waits for its answer, reading the socket
itself when nobody else is: the reader hands each answer, matched by request id, to the
callers waiting for it and wakes exactly those. A reader whose own answer came leaves
the reading to the client's reader thread if other answers are due. No caller polls, one
caller alone pays one wake-up per call, and many callers share the round trips.

An event for a topic that already has a request in flight is not written at once: the
reader writes it, with everything queued meanwhile, as soon as it has handled its next
answers. Callers that fire faster than the round trip so share frames (one write and
one answer per frame, not per event), and the agent keeps one topic's requests in order
anyway. Once `max_batch` events are queued, though, the caller writes them (unless the
reader is handing out answers, and about to write them): a reader that busy callers keep
from the interpreter lock must not leave the agent idle (measured with 8 threads firing:
the agent then spooled a burst while it came, instead of half of it after the callers
were done). The reader never waits for room in the socket: what does not fit waits until
the socket is writable again, and it reads answers meanwhile, so a full socket both ways
cannot stall the two sides. Done callbacks run on the reader, and a `send_async()` there
never waits for its own answer over `max_queued`: nobody else would read it.

A `send()` that queues goes on the lane instead (`_core/queued_calls.pxi`) when its
connection has no TLS and nothing waits in the Python queue before it: the writer
frames the lane's calls and writes them, and the reader wakes their callers, without the
interpreter lock; the reader hands the rest (refusals, futures, controls) to
`_answer_all` here. The reader thread waits 50 ms for answers once nothing is in flight
before it leaves the reading to callers again.

A broken connection fails the requests written on it with AgentError (their outcome is
unknown: the agent may have spooled them before it died); the next call reconnects,
with backoff for as long as `timeout` allows.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import time
from collections import deque
from collections.abc import Sequence
from typing import ClassVar

from eventspool._core.native import (
    CALL_ANSWERED,
    CALL_UNWRITTEN,
    InPerson,
    PipelineCore,
    QueuedCall,
    connect_unix,
)
from eventspool.client.common import Target, connect_failure, next_backoff
from eventspool.client.sync_connection import (
    Connection,
    connect_tcp,
    receive,
    write_now,
)
from eventspool.client.sync_requests import (
    Control,
    Event,
    EventFuture,
    Reply,
    Request,
    fail,
    refusal_error,
    settle,
    unframed_error,
)
from eventspool.errors import AgentError, EventspoolError, InvalidEventError
from eventspool.wire.batching import frame_slices
from eventspool.wire.protocol import (
    DEFAULT_MAX_FRAME,
    Frame,
    FrameType,
    ProtocolError,
    decode_error,
    encode_frame,
)

# How many `max_batch` chunks the reader writes at most per turn between its reads.
_READER_BATCHES = 16


class Pipeline(PipelineCore):
    """One client's requests on their way: queued, written, in flight, answered (a
    `send()` alone on the connection runs through the compiled `PipelineCore.call`)."""

    # Made by PipelineCore.__init__(target, timeout, max_batch, reconnect_backoff_s,
    # max_frame_bytes, busy_poll_s); typed here as this layer knows them.
    _target: Target
    _pending: deque[Event | Control]
    _connection: Connection | None

    # What PipelineCore's compiled batch path tells apart, and how it words a refusal.
    _control_type: ClassVar[type] = Control
    _future_type: ClassVar[type] = EventFuture
    _refusal_error = staticmethod(refusal_error)

    def close(self) -> None:
        """Disconnect; calls still waiting fail with AgentError, later calls too."""
        connection, idle = self._mark_closed()
        if idle:
            connection.close()
            return
        if self.has_queued() and (pending := self._take(len(self._pending))):
            fail(pending, AgentError(f"agent at {self.target}: the client was closed"))
        if connection is not None:
            self._drop(connection, "the client was closed")
            # Read under the lock: a dropped connection starts no reader after this.
            with self._lock:
                reader = connection.reader
            if reader is not None and reader is not threading.current_thread():
                reader.join(self.timeout)

    # ---- callers' side (queuing and waiting: `PipelineCore.submit`, `.wait`) -------------

    def _no_answer(self) -> AgentError:
        return AgentError(
            f"agent at {self.target}: no answer within {self.timeout} s; the "
            "outcome is unknown: the request may or may not have been processed"
        )

    def _closed_error(self) -> AgentError:
        return AgentError(f"agent at {self.target}: the client is closed")

    def _write_alone(self, event: QueuedCall) -> None:
        """Write a `send()` and read its answer in person when nothing else is queued, in
        flight or being read; otherwise `submit()` it. The caller holds the writer role,
        given back here; `PipelineCore.wait` waits for the event as usual.

        Alone, the caller holds the writer role and claims the reading before writing,
        so a caller who comes meanwhile queues and waits as it would for any reader: the
        answers it gets are handed out by `_read()`. What this skips is the queue, the
        batching and the wake-up of a reader (measured with one caller on a 2-core VM:
        64-72 us of client CPU per send through the pipeline, 31-38 us alone).
        """
        deadline = time.monotonic() + self.timeout
        try:
            connection = self._claim_alone(event)
        finally:
            self._writer.release()
        if connection is not None:
            self._read(connection, event, deadline)
        elif not event.done():
            self.submit([event])

    def _claim_alone(self, event: QueuedCall) -> Connection | None:
        """The writer writes `event` alone and returns its connection, read by nobody
        else now; None when others were first (or the event failed already)."""
        connection = self._connect_or_fail([event])
        if connection is None:
            return None
        payload = event._payload
        request_id = self._next_id()
        frame = self._frame_of(request_id, [event])
        if frame is None:
            return None
        with self._lock:
            alone = connection.idle()
            if alone:
                connection.note_in_flight({request_id: [event]})
                connection.reading = True
        if not alone:
            event._payload = payload  # the pipeline writes it after what came first
            return None
        if connection.tls is not None:
            frame = connection.tls.seal(frame)
        self._write_waiting(connection, frame)
        return connection

    def _finish_in_person(
        self,
        connection: Connection,
        event: InPerson,
        kind: int,
        value: object,
        error: Exception | None,
    ) -> None:
        """End a call made in person that the compiled call left unsettled: a refusal, a
        size no frame carries, a broken socket, a frame the socket did not take whole, or
        bytes that are not this call's whole answer alone (the last two are in flight)."""
        if kind == CALL_ANSWERED:
            connection.answered = True
            assert isinstance(value, tuple)
            event._settle(refusal_error(value))
        elif isinstance(error, ValueError):  # only sizes no frame can carry get here
            event._settle(InvalidEventError(str(error)))
        elif isinstance(error, BlockingIOError):  # SO_RCVTIMEO ran out
            self._drop(connection, f"no answer within {self.timeout} s")
        elif error is not None:
            self._drop(connection, str(error) or type(error).__name__)
        elif kind == CALL_UNWRITTEN:
            assert isinstance(value, bytes)
            self._write_waiting(connection, value)
        elif not value:
            self._drop(connection, "the agent closed the connection")
        else:
            assert isinstance(value, bytes)
            connection.keep_read(value)  # handed out by the reader: this caller, next

    # ---- the writing caller ---------------------------------------------------------------

    def _write_pending(self) -> None:
        """Write what is queued, and what is queued meanwhile; the caller is the writer."""
        while True:
            batch = self._take(self.max_batch)
            if not batch:
                return
            if self._closed:  # queued just before close(); a closed client connects no more
                fail(batch, AgentError(f"agent at {self.target}: the client was closed"))
                continue
            connection = self._connect_or_fail(batch)
            if connection is None:
                continue
            frames = self._frames(connection, batch)
            if connection.tls is not None:
                frames = connection.tls.seal(frames)
            data = connection.unsent + frames
            connection.unsent = b""
            self._write_waiting(connection, data)

    def _write_waiting(self, connection: Connection, data: bytes) -> None:
        """Write all of `data`, waiting for room when the socket is full.

        Only a caller waits here, and only while someone reads the answers: an agent
        whose answers are not read stops reading requests.
        """
        deadline = time.monotonic() + self.timeout
        try:
            written = write_now(connection, data)
            if written < len(data):
                with self._lock:
                    if not connection.reading:
                        self._wake_reader(connection)
            rest = memoryview(data)[written:]
            while rest:  # each send() waits for room up to SO_SNDTIMEO
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no room to write within {self.timeout} s")
                rest = rest[connection.sock.send(rest) :]
        except BlockingIOError:
            self._drop(connection, f"writing failed: no room to write within {self.timeout} s")
        except OSError as exc:
            self._drop(connection, f"writing failed: {exc}")

    def _flush_from_reader(self, connection: Connection) -> None:
        """The reader writes what callers left to it, never waiting for room: whatever
        the socket does not take now stays in `unsent` until it polls writable."""
        while (self.has_queued() or connection.unsent) and self._writer.acquire(blocking=False):
            try:
                if connection.closed or self._connection is not connection:
                    return  # queued events go out on the next connection, by a caller
                batch = self._take(_READER_BATCHES * self.max_batch)
                frames = self._frames(connection, batch) if batch else b""
                if frames and connection.tls is not None:
                    frames = connection.tls.seal(frames)
                data = connection.unsent + frames
                written = write_now(connection, data)
                connection.unsent = data[written:]
                if connection.unsent:
                    return
            finally:
                self._writer.release()

    # ---- what the compiled batch path (`PipelineCore._frames`, `_answer_all`) asks of it --

    def _cut(self, name: str, sizes: list[int]) -> list[slice]:
        """The events of each frame of one target (`frame_slices`)."""
        return frame_slices(name, sizes, self.max_frame_bytes)

    def _encode_other(self, request_id: int, request: Request) -> bytes | None:
        """The frame of a PING or STATS. For events whose frame the compiled encoder could
        not make (a name or size no frame carries): None, once they failed with why."""
        if isinstance(request, Control):
            return encode_frame(request.type, request_id, b"")
        fail(request, unframed_error(request))
        return None

    def _fail_unwritten(self, requests: list[Request]) -> None:
        """Fail requests framed for a connection dropped before they were written."""
        unsent = AgentError(
            f"agent at {self.target}: the connection closed before the request was written"
        )
        for request in requests:
            fail([request] if isinstance(request, Control) else request, unsent)

    def _connect_or_fail(self, batch: Sequence[Event | Control]) -> Connection | None:
        """The connection, or None once `batch` failed with the reason there is none."""
        try:
            return self._connect()
        except OSError as exc:
            reason = exc.strerror or str(exc) or type(exc).__name__
            fail(batch, AgentError(f"agent at {self.target}: {reason}"))
        except EventspoolError as exc:  # refused: TLS, the token
            fail(batch, exc)
        return None

    def _connect(self) -> Connection:
        """The open connection, or a new one (with backoff while the agent is away)."""
        connection = self._connection
        if connection is not None and not connection.closed:
            return connection
        deadline = time.monotonic() + self.timeout
        while True:
            if self._backoff > 0:
                time.sleep(self._backoff)
            try:
                connection = self._open_connection()
            except OSError as exc:
                self._backoff = next_backoff(self._backoff, self.reconnect_backoff_s)
                if time.monotonic() + self._backoff > deadline:
                    raise OSError(exc.errno, connect_failure(self._target, exc)) from exc
                continue
            except EventspoolError:  # refused: TLS, the token
                self._backoff = next_backoff(self._backoff, self.reconnect_backoff_s)
                raise
            break
        if not self._keep(connection):
            connection.close()
            raise AgentError(f"agent at {self.target}: the client was closed")
        return connection

    def _open_connection(self) -> Connection:
        """Its own method, so a test can act while a writer connects (close() meanwhile)."""
        max_frame = max(self.max_frame_bytes, DEFAULT_MAX_FRAME)
        if self._target.path is not None:
            return Connection(connect_unix(self._target.path, self.timeout), max_frame)
        return connect_tcp(self._target, max_frame, self._next_id(), self.timeout)

    # ---- reading: a waiting caller, or the reader thread ---------------------------------

    def reading_here(self) -> bool:
        """Whether this thread reads the answers now (in a done callback): waiting for its
        own answer would wait for itself."""
        connection = self._connection
        return connection is not None and connection.reader_ident == threading.get_ident()

    def _wake_reader(self, connection: Connection) -> None:
        """Have the reader thread read the answers due; the caller holds `_lock`.

        The thread is started here, on the first answer that no caller reads: a caller
        alone reads its own, so a short-lived one never starts (and joins) a thread,
        which took 60% of its time.
        """
        if connection.closed:  # close() may be joining the reader: start none after it
            return
        if connection.reader_wanted is None:
            # Made with the thread: a Condition costs a short-lived client 2 us of CPU.
            # It takes any lock with acquire() and release(); typeshed names only its own.
            wanted = threading.Condition(self._lock)  # type: ignore[arg-type]
            connection.reader_wanted = wanted
            connection.reader = threading.Thread(
                target=self._read_in_background,
                args=(connection, wanted),
                name="eventspool-client-reader",
                daemon=True,
            )
            connection.reader.start()
        else:
            connection.reader_wanted.notify()

    def _read_in_background(self, connection: Connection, wanted: threading.Condition) -> None:
        """Read the answers nobody waits for in person: those of `send_async()`, and the
        rest when the caller who was reading got its own; `wanted` wakes it for more."""
        while True:
            with self._lock:
                while not connection.closed and (connection.reading or not connection.awaiting()):
                    wanted.wait()
                if connection.closed:
                    return
                connection.reading = True
            self._read(connection, None, None)

    def _read(
        self,
        connection: Connection,
        reply: Reply | EventFuture | InPerson | QueuedCall | None,
        deadline: float | None,
    ) -> None:
        """Hand out answers until `reply` is done (or, without one, none is due)."""
        reason = ""
        connection.reader_ident = threading.get_ident()
        try:
            while True:
                # Not busy first, then the queue: a caller queues first, then looks at
                # `reader_busy`, so whatever it left to this reader is written here.
                connection.reader_busy = False
                self._flush_from_reader(connection)
                if reply is not None:
                    if reply.done() or time.monotonic() >= (deadline or 0.0):
                        break
                elif not connection.awaiting():
                    break
                if connection.unsent and not self._readable_or_writable(connection, deadline):
                    continue  # room to write the rest: do it before reading on
                try:
                    data = self._receive(connection, reply, deadline)
                except (TimeoutError, BlockingIOError):  # SO_RCVTIMEO ran out
                    reason = f"no answer within {self.timeout} s"
                    break
                if data is None:
                    reason = "the agent closed the connection"
                    break
                if not data:
                    continue
                connection.reader_busy = True
                self._answer_all(connection, connection.decoder.feed(data))
        except (OSError, ProtocolError, ValueError, MemoryError) as exc:
            reason = str(exc) or type(exc).__name__
        connection.reader_busy = False
        connection.reader_ident = None
        if reason:
            # Dropped while still the reader: a reader after this one would find only
            # the end of what this one read, and fail the calls in flight without why.
            self._drop(connection, reason)
        with self._lock:
            connection.reading = False
        self._flush()
        # What is still due, and what that wrote, which may be all its callers wait on,
        # each not reading as this reader was: somebody reads it.
        with self._lock:
            if not (connection.reading or connection.closed) and connection.awaiting():
                self._wake_reader(connection)

    def _receive(
        self,
        connection: Connection,
        reply: Reply | EventFuture | InPerson | QueuedCall | None,
        deadline: float | None,
    ) -> bytes | None:
        """The next answers' bytes for Python to hand out; b"" to look again, None at the
        agent's end of file. Without TLS the compiled reader reads, and settles what
        queued `send()` calls wait on itself (`ConnectionCore.read_answers`)."""
        if connection.tls is None:
            others = bool(connection.in_flight)
            return connection.read_answers(reply, deadline or 0.0, others)
        data = receive(connection)
        return connection.tls.open(data) if data else None

    def _readable_or_writable(self, connection: Connection, deadline: float | None) -> bool:
        """Wait until answers come (True) or the socket takes more (False)."""
        left = self.timeout if deadline is None else max(deadline - time.monotonic(), 0.0)
        poller = select.poll()
        poller.register(connection.fd, select.POLLIN | select.POLLOUT)
        ready = poller.poll(left * 1000)
        return not ready or any(event & ~select.POLLOUT for _, event in ready)

    def _settle_other(self, request: Request | None, frame: Frame) -> None:
        """An answer the compiled `_answer_all` leaves: to a PING or STATS, an ERROR, or one
        whose request is gone (an ERROR then is about the connection: it ends it)."""
        if request is not None:
            settle(request, frame, f"agent at {self.target}")
        elif frame.type is FrameType.ERROR:
            raise ProtocolError(f"the agent refused the request: {decode_error(frame.body).text}")

    def _drop(self, connection: Connection, reason: str) -> None:
        """Close `connection`; what was written on it has an unknown outcome.

        Dropped already, it still fails what is in flight: a request whose answer the
        reader took could not be handed out, and was put back after `close()` dropped
        the connection. No later drop would fail it.
        """
        with self._lock:
            requests = connection.take_in_flight()
            dropped_before = connection.closed
            connection.closed = True
            if not dropped_before:
                if connection.reader_wanted is not None:
                    connection.reader_wanted.notify_all()
                if self._connection is connection:
                    self._connection = None
                if connection.answered:
                    self._backoff = 0.0
                else:
                    self._backoff = next_backoff(self._backoff, self.reconnect_backoff_s)
                # Shutting it down wakes a thread waiting in a read or a write of it,
                # which closing does not. Nobody starts one now that it is closed, so
                # when nobody reads or writes (a short-lived client's close) it is saved.
                in_use = connection.reading or self._writer.locked()
        if not dropped_before:
            if in_use:
                with contextlib.suppress(OSError):  # already broken: closing is all that is left
                    connection.sock.shutdown(socket.SHUT_RDWR)
            connection.close()
        self._fail_lost(requests, reason)

    def _fail_lost(self, requests: list[Request], reason: str) -> None:
        """Fail `requests`, written on a connection that broke: their outcome is unknown."""
        if not requests:
            return
        lost = AgentError(
            f"agent at {self.target}: the connection broke after the request was "
            f"written ({reason}); the outcome is unknown: it may or may not have been processed"
        )
        for request in requests:
            fail([request] if isinstance(request, Control) else request, lost)
