"""The blocking client: `Client(socket).send(topic, value, key, headers) -> event_id`.

One Client is meant to be shared by every thread of a process. Its sends are pipelined
over one connection: a caller queues its event and, unless another caller is already
writing, writes everything queued as SEND frames (one per topic) without waiting for
answers. Then it waits for its answer, reading the socket itself when nobody else is:
the reader hands each answer, matched by request id, to the callers waiting for it and
wakes exactly those. A reader whose own answer came leaves the reading to the client's
reader thread if other answers are due. No caller polls, one caller alone pays one
wake-up per call, and many callers share the round trips.

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

`send_many()` hands a batch for one topic over in one call; `send_async()` returns at
once with a future, for callers that want fire-and-go latency yet learn each outcome.
At most `max_queued` of its events wait for an answer; a call over that waits for its own.

A call checks its arguments and encodes its event (compiled) before queuing it, so a
frame is a join of bytes, and a size the format cannot carry fails its own call. What
waits is one object per event: the future itself for `send_async()`. The cyclic
collector walks every tracked object that lives through its young generation, and
queued events do; with a queue entry, a reply and a future per event it took half of
the client's time (measured, 8 callers firing).

A broken connection fails the requests written on it with AgentError (their outcome is
unknown: the agent may have spooled them before it died); the next call reconnects,
with backoff for as long as `timeout` allows.

"tcp://host:port" reaches an agent's TCP listener, with TLS when given `ssl_context` and
presenting `token` (AUTH) when given one. TLS runs on memory buffers over the same
socket, so writing and reading keep the scheme above. A TCP connection is
used only once the agent answered its AUTH (or a PING): a refused certificate or token,
or a plaintext client at a TLS listener, fails the calls that connect with the reason
(ForbiddenError for a token, AgentError otherwise), never leaving a request of unknown
outcome.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import select
import socket
import ssl
import struct
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterable, Sequence
from concurrent.futures import Future, InvalidStateError
from concurrent.futures import wait as futures_wait
from dataclasses import dataclass, field
from typing import Any

from eventspool._core.native import decode_results
from eventspool.client.common import (
    Greeting,
    Target,
    connect_failure,
    greeting_failure,
    parse_target,
    routed_event_payload,
)
from eventspool.client.future import LazyFuture
from eventspool.envelope import HeadersInput
from eventspool.errors import (
    AgentError,
    EventspoolError,
    InvalidEventError,
)
from eventspool.wire.checks import BatchEvent, Outcome, event_payload, split_batch_event
from eventspool.wire.protocol import (
    DEFAULT_MAX_FRAME,
    MAX_EVENTS_PER_SEND,
    SEND_OVERHEAD,
    EventResult,
    Frame,
    FrameDecoder,
    FrameType,
    ProtocolError,
    Status,
    decode_error,
    encode_frame,
    encode_publish_payloads,
    encode_send_payloads,
)
from eventspool.wire.status import error_for

__all__ = ["AgentError", "Client"]


_READ_SIZE = 256 * 1024
# How many `max_batch` chunks the reader writes at most per turn between its reads.
_READER_BATCHES = 16
_MAX_BACKOFF_S = 1.0


class _Reply:
    """Where the outcomes of one call go; whoever reads the answers fills it."""

    __slots__ = ("_finished", "_guard", "_left", "_lock", "outcomes")

    def __init__(self, count: int) -> None:
        self.outcomes: list[Outcome | None] = [None] * count
        self._finished = False
        self._left = count
        self._lock = threading.Lock()
        self._lock.acquire()
        # Each slot is set once, but two threads may set two slots of one batch at once.
        self._guard = threading.Lock() if count > 1 else None

    def set(self, index: int, outcome: Outcome) -> None:
        self.outcomes[index] = outcome
        if self._guard is None:
            self._finished = True
            self._lock.release()
            return
        with self._guard:
            self._left -= 1
            if self._left == 0:
                self._finished = True
                self._lock.release()

    def done(self) -> bool:
        return self._finished

    def _wait_done(self, timeout: float) -> bool:
        return self._lock.acquire(timeout=timeout)


class _Outstanding:
    """How many `send_async()` events were queued and settled; `itertools.count` steps
    atomically, so callers and readers count without a lock. Queued minus settled is
    roughly how many are unsettled, ample for a bound."""

    __slots__ = ("queued", "settled", "settled_total")

    def __init__(self) -> None:
        self.queued = itertools.count(1)
        self.settled = itertools.count(1)
        self.settled_total = 0


class _EventFuture(LazyFuture[str]):
    """The future `send_async()` returns, and the event it stands for while it waits to
    be written and answered: one object per event, where a queue entry, a reply and a
    future would be three for the cyclic collector to track (measured: with 8 callers
    firing, the collector took half of the client's time). What the client keeps on it
    is named as private, as the future is the caller's to hold."""

    def __init__(
        self, topic: str | None, exchange: str | None, payload: bytes, outstanding: _Outstanding
    ) -> None:
        LazyFuture.__init__(self)
        self._topic = topic
        self._exchange = exchange
        self._payload = payload
        self._outstanding = outstanding

    def _wait_done(self, timeout: float) -> bool:
        return bool(futures_wait((self,), timeout).done)

    def _settle(self, outcome: Outcome) -> None:
        outstanding = self._outstanding
        outstanding.settled_total = next(outstanding.settled)
        try:
            if isinstance(outcome, str):
                self._finish(outcome, None)
            else:
                self._finish(None, outcome)
        except InvalidStateError:  # cancelled by its caller
            pass


@dataclass(slots=True, eq=False)
class _Waiting:
    """One event of `send()` or `send_many()` queued or written, and the slot of its
    caller's reply."""

    _topic: str | None  # None: published through `exchange`
    _exchange: str | None
    _payload: bytes  # the event as its SEND (PUBLISH) body carries it
    reply: _Reply
    index: int = 0

    def _settle(self, outcome: Outcome) -> None:
        self.reply.set(self.index, outcome)


#: One event on its way: the caller waits in person, or holds its future.
_Event = _Waiting | _EventFuture


@dataclass(slots=True, eq=False)
class _Control:
    """A PING or STATS in flight; `body` holds the answer once `reply` is done."""

    type: FrameType
    answer: FrameType
    reply: _Reply = field(default_factory=lambda: _Reply(1))
    body: bytes = b""


_Request = list[_Event] | _Control

#: The topic (or exchange) of a SEND (PUBLISH) in flight.
_Target = tuple[str | None, str | None]


class _Tls:
    """TLS on memory buffers: the client writes and reads the socket itself, as without
    TLS. The writer seals (under the writer role) and the reader opens; one lock keeps
    them from using the TLS state at once."""

    def __init__(self, context: ssl.SSLContext, host: str) -> None:
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._tls = context.wrap_bio(self._incoming, self._outgoing, server_hostname=host)
        self._lock = threading.Lock()

    def handshake(self, sock: socket.socket) -> None:
        """The handshake, on the connecting caller's blocking socket."""
        while True:
            try:
                self._tls.do_handshake()
            except ssl.SSLWantReadError:
                sock.sendall(self._outgoing.read())
                data = sock.recv(_READ_SIZE)
                if not data:
                    raise ConnectionResetError from None
                self._incoming.write(data)
            else:
                sock.sendall(self._outgoing.read())
                return

    def seal(self, data: bytes) -> bytes:
        """The records that carry `data`, and any the reader's work left to send."""
        with self._lock:
            view = memoryview(data)
            while view:
                view = view[self._tls.write(view) :]
            return self._outgoing.read()

    def open(self, data: bytes) -> bytes:
        """What the whole records received so far carry; b"" until one is complete.

        After the agent's close_notify there is nothing more to read (the socket's end
        of file follows), but what came before it is returned.
        """
        with self._lock:
            self._incoming.write(data)
            parts = []
            while True:
                try:
                    chunk = self._tls.read(_READ_SIZE)
                except (ssl.SSLWantReadError, ssl.SSLZeroReturnError):
                    break
                if not chunk:  # the close_notify, once received
                    break
                parts.append(chunk)
            return b"".join(parts)


class _Connection:
    """One socket to the agent, what awaits an answer on it, and who reads it now."""

    def __init__(self, sock: socket.socket, max_frame: int, tls: _Tls | None = None) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.tls = tls
        self.decoder = FrameDecoder(max_frame)
        self.in_flight: dict[int, _Request] = {}
        # SENDs and PUBLISHes in flight per target: an event for a busy target waits
        # for the reader, which writes it with the others queued meanwhile, in one frame.
        self.targets: dict[_Target, int] = {}
        # Frames the reader wrote only in part; the writer role owns it.
        self.unsent = b""
        self.poller = select.poll()
        self.poller.register(self.fd, select.POLLIN)
        self.closed = False
        self.answered = False
        self.reading = False
        # True while a reader handles answers it has received: it writes what is queued
        # before it reads again, so callers that see it busy leave their events to it.
        self.reader_busy = False
        self.reader: threading.Thread | None = None
        # The thread in `_read`, while one is.
        self.reader_ident: int | None = None


def _encode(request_id: int, chunk: list[_Event]) -> bytes:
    """A SEND frame for a chunk of one topic, a PUBLISH frame for one of an exchange.

    The events give their bytes up to it: a written event is never written again (a
    broken connection fails it), and a future its caller keeps should not keep them.
    """
    first = chunk[0]
    payloads = [event._payload for event in chunk]
    if first._exchange is None:
        assert first._topic is not None
        frame = encode_send_payloads(request_id, first._topic, payloads)
    else:
        frame = encode_publish_payloads(request_id, first._exchange, payloads)
    for event in chunk:
        event._payload = b""
    return frame


class Client:
    def __init__(
        self,
        target: str | os.PathLike[str],
        *,
        timeout: float = 10.0,
        max_batch: int = 1000,
        max_queued: int = 10_000,
        reconnect_backoff_s: float = 0.05,
        max_frame_bytes: int = DEFAULT_MAX_FRAME,
        ssl_context: ssl.SSLContext | None = None,
        token: str | None = None,
    ) -> None:
        """`target`: the agent's unix socket path, or "tcp://host:port" for its TCP
        listener; there `ssl_context` turns TLS on (with a client certificate loaded into
        it where the agent asks for one) and `token` is presented to an agent that takes
        tokens."""
        if timeout <= 0:
            raise ValueError(f"timeout={timeout}: must be positive")
        if max_batch < 1:
            raise ValueError(f"max_batch={max_batch}: must be at least 1")
        if max_queued < 1:
            raise ValueError(f"max_queued={max_queued}: must be at least 1")
        self._target: Target = parse_target(target, ssl_context, token)
        self.target = self._target.text
        self.max_frame_bytes = max_frame_bytes
        self.timeout = timeout
        self.max_batch = max_batch
        self.max_queued = max_queued
        self._outstanding = _Outstanding()
        self.reconnect_backoff_s = reconnect_backoff_s
        self._lock = threading.Lock()
        # The reader thread waits here for answers that no caller is reading.
        self._reader_wanted = threading.Condition(self._lock)
        # Appended to by callers and emptied by the writer without a lock: deque operations
        # are atomic, and the writer role is a try-lock, so callers never queue on a lock.
        self._pending: deque[_Event | _Control] = deque()
        self._writer = threading.Lock()
        self._connection: _Connection | None = None
        self._backoff = 0.0
        self._request_id = 0
        self._closed = False

    def send(
        self,
        topic: str | None,
        value: bytes | None,
        key: bytes | str | None = None,
        headers: HeadersInput | None = None,
        *,
        exchange: str | None = None,
        routing_key: str = "",
        event_id: str | uuid.UUID | None = None,
    ) -> str:
        """Hand one event to the agent; returns its event_id once the agent spooled it.

        Raises what `Spool.send()` raises for the event itself, AgentError when the agent
        cannot be reached within `timeout` (the event may or may not have been spooled
        if the connection broke after it was written: send it again with the same
        `event_id` and consumers drop the copy). With `exchange` (and `topic=None`) the
        agent routes the event by `routing_key`, as `Spool.send()` does.
        """
        reply = _Reply(1)
        payload = _checked_payload(topic, value, key, headers, event_id, exchange, routing_key)
        self._submit([_Waiting(topic, exchange, payload, reply)])
        outcome = self._wait(reply)[0]
        if isinstance(outcome, str):
            return outcome
        raise outcome

    def send_async(
        self,
        topic: str | None,
        value: bytes | None,
        key: bytes | str | None = None,
        headers: HeadersInput | None = None,
        *,
        exchange: str | None = None,
        routing_key: str = "",
        event_id: str | uuid.UUID | None = None,
    ) -> Future[str]:
        """Queue one event and return at once; the future gives its event_id or error.

        Arguments are checked as in `send()`, and a bad one raises here. The future fails
        with AgentError when the agent cannot be reached; it does not time out by itself
        (`future.result(timeout)` does). While more than `max_queued` events of this
        client await their answer, the call waits for its own (at most `timeout`): callers
        that fire faster than the agent spools are slowed to its pace, not left to fill
        the memory, as librdkafka's `queue.buffering.max.messages` does.
        """
        if exchange is None:  # the usual case, without a call on the way
            payload = event_payload(topic, value, key, headers, event_id)
        else:
            payload = _checked_payload(topic, value, key, headers, event_id, exchange, routing_key)
        outstanding = self._outstanding
        future = _EventFuture(topic, exchange, payload, outstanding)
        self._submit([future])
        if (
            next(outstanding.queued) - outstanding.settled_total > self.max_queued
            and not self._reading_here()
        ):
            with contextlib.suppress(AgentError):  # queued all the same: the future tells
                self._wait(future)
        return future

    def send_many(self, topic: str, events: Iterable[BatchEvent]) -> list[Outcome]:
        """Hand a batch of events for one topic to the agent in one call.

        Each event is a value, or a (value, key), (value, key, headers) or (value, key,
        headers, event_id) tuple. Returns
        each event's outcome in order: its event_id, or the error that refused it (so one
        bad event does not hide the fate of the others). Raises AgentError when the agent
        cannot be reached; InvalidEventError, before anything is sent, for an argument
        the wire cannot carry.
        """
        items: list[_Waiting] = []
        batch = list(events)
        reply = _Reply(len(batch))
        for index, item in enumerate(batch):
            value, key, headers, event_id = split_batch_event(item)
            payload = event_payload(topic, value, key, headers, event_id)
            items.append(_Waiting(topic, None, payload, reply, index))
        if not items:
            return []
        self._submit(items)
        outcomes = self._wait(reply)
        for outcome in outcomes:
            if isinstance(outcome, AgentError):
                raise outcome
        return outcomes

    def ping(self) -> float:
        """Round-trip time to the agent in seconds."""
        started = time.perf_counter()
        self._control(FrameType.PING, FrameType.PONG)
        return time.perf_counter() - started

    def stats(self) -> dict[str, Any]:
        """The agent's STATS answer: queues, sender counters, connectivity."""
        body = self._control(FrameType.STATS, FrameType.STATS_RESULT)
        try:
            stats = json.loads(body)
        except ValueError as exc:
            raise AgentError(f"agent at {self.target}: STATS is not JSON: {exc}") from None
        if not isinstance(stats, dict):
            raise AgentError(f"agent at {self.target}: STATS is not a JSON object")
        return stats

    def close(self) -> None:
        """Disconnect; calls still waiting fail with AgentError, later calls too."""
        with self._lock:
            self._closed = True
            connection = self._connection
        pending = _take(self._pending, len(self._pending))
        self._fail(pending, AgentError(f"agent at {self.target}: the client was closed"))
        if connection is not None:
            self._drop(connection, "the client was closed")
            if connection.reader is not threading.current_thread():
                assert connection.reader is not None
                connection.reader.join(self.timeout)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ---- callers' side ------------------------------------------------------------------

    def _wait(self, reply: _Reply | _EventFuture) -> list[Outcome]:
        """Wait for a reply, reading the answers while nobody else does."""
        deadline = time.monotonic() + self.timeout
        while not reply.done():
            left = deadline - time.monotonic()
            if left <= 0:
                raise AgentError(
                    f"agent at {self.target}: no answer within {self.timeout} s; the "
                    "outcome is unknown: the request may or may not have been processed"
                )
            connection = self._take_reading()
            if connection is None:
                reply._wait_done(left)
            else:
                self._read(connection, reply, deadline)
        if isinstance(reply, _EventFuture):
            return []
        return [outcome for outcome in reply.outcomes if outcome is not None]

    def _control(self, frame_type: FrameType, answer: FrameType) -> bytes:
        control = _Control(frame_type, answer)
        self._submit([control])
        outcome = self._wait(control.reply)[0]
        if isinstance(outcome, EventspoolError):
            raise outcome
        return control.body

    def _submit(self, items: Sequence[_Event | _Control]) -> None:
        """Queue requests; write them unless another thread is writing (it takes them).

        An event for a target with a request in flight, or queued while the reader
        handles answers, is left to the reader: it writes after its next answers, so
        callers that fire faster than the round trip share frames instead of each paying
        a write and a wake-up. The agent answers one target's requests in order anyway.
        A full batch queued is written at once, unless the reader is busy.
        """
        if self._closed:
            raise AgentError(f"agent at {self.target}: the client is closed")
        pending = self._pending
        pending.extend(items)
        connection = self._connection
        if connection is not None:
            first = items[0]
            # A busy reader writes next in any case; the caller may be that very reader,
            # in a done callback, and must not wait for room while nobody reads.
            if connection.reader_busy or (
                len(pending) < self.max_batch
                and not isinstance(first, _Control)
                and (first._topic, first._exchange) in connection.targets
            ):
                return
        self._flush()

    def _flush(self) -> None:
        """Write what is queued, unless another thread is writing (it takes it along)."""
        # Whoever holds the writer role looks at the queue again after letting go of it,
        # so a request queued while it was letting go is never left behind.
        while self._pending and self._writer.acquire(blocking=False):
            try:
                self._write_pending()
            finally:
                self._writer.release()

    # ---- the writing caller ---------------------------------------------------------------

    def _write_pending(self) -> None:
        """Write what is queued, and what is queued meanwhile; the caller is the writer."""
        while True:
            batch = _take(self._pending, self.max_batch)
            if not batch:
                return
            if self._closed:  # queued just before close(); a closed client connects no more
                self._fail(batch, AgentError(f"agent at {self.target}: the client was closed"))
                continue
            try:
                connection = self._connect()
            except OSError as exc:
                reason = exc.strerror or str(exc) or type(exc).__name__
                self._fail(batch, AgentError(f"agent at {self.target}: {reason}"))
                continue
            except EventspoolError as exc:  # refused: TLS, the token
                self._fail(batch, exc)
                continue
            frames = self._frames(connection, batch)
            if connection.tls is not None:
                frames = connection.tls.seal(frames)
            data = connection.unsent + frames
            connection.unsent = b""
            self._write_waiting(connection, data)

    def _write_waiting(self, connection: _Connection, data: bytes) -> None:
        """Write all of `data`, waiting for room when the socket is full.

        Only a caller waits here, and only while someone reads the answers: an agent
        whose answers are not read stops reading requests.
        """
        deadline = time.monotonic() + self.timeout
        try:
            written = _write_now(connection, data)
            if written < len(data):
                with self._lock:
                    if not connection.reading:
                        self._reader_wanted.notify()
            rest = memoryview(data)[written:]
            while rest:  # each send() waits for room up to SO_SNDTIMEO
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no room to write within {self.timeout} s")
                rest = rest[connection.sock.send(rest) :]
        except BlockingIOError:
            self._drop(connection, f"writing failed: no room to write within {self.timeout} s")
        except OSError as exc:
            self._drop(connection, f"writing failed: {exc}")

    def _flush_from_reader(self, connection: _Connection) -> None:
        """The reader writes what callers left to it, never waiting for room: whatever
        the socket does not take now stays in `unsent` until it polls writable."""
        while (self._pending or connection.unsent) and self._writer.acquire(blocking=False):
            try:
                if connection.closed or self._connection is not connection:
                    return  # queued events go out on the next connection, by a caller
                batch = _take(self._pending, _READER_BATCHES * self.max_batch)
                frames = self._frames(connection, batch) if batch else b""
                if frames and connection.tls is not None:
                    frames = connection.tls.seal(frames)
                data = connection.unsent + frames
                written = _write_now(connection, data)
                connection.unsent = data[written:]
                if connection.unsent:
                    return
            finally:
                self._writer.release()

    def _frames(self, connection: _Connection, batch: list[_Event | _Control]) -> bytes:
        """Encode a batch and note it in flight; only the writer calls this, so ids need
        no lock."""
        frames = []
        requests: dict[int, _Request] = {}
        for request in self._requests(batch):
            request_id = self._next_id()
            try:
                if isinstance(request, _Control):
                    frame = encode_frame(request.type, request_id, b"")
                else:
                    frame = _encode(request_id, request)
            except ProtocolError as exc:  # only sizes no frame can carry get here
                assert not isinstance(request, _Control)
                self._fail(request, InvalidEventError(str(exc)))
                continue
            requests[request_id] = request
            frames.append(frame)
        targets = connection.targets
        with self._lock:
            # Dropped meanwhile (by the reader, or close()): nobody would settle these.
            closed = connection.closed
            if not closed:
                connection.in_flight.update(requests)
                for request in requests.values():
                    if type(request) is list:
                        target = (request[0]._topic, request[0]._exchange)
                        targets[target] = targets.get(target, 0) + 1
                if not connection.reading and any(type(item) is _EventFuture for item in batch):
                    self._reader_wanted.notify()
        if closed:
            unsent = AgentError(
                f"agent at {self.target}: the connection closed before the request was written"
            )
            for request in requests.values():
                self._fail([request] if isinstance(request, _Control) else request, unsent)
            return b""
        return b"".join(frames)

    def _requests(self, batch: list[_Event | _Control]) -> list[_Request]:
        """One SEND per topic (PUBLISH per exchange), split to stay under the agent's maximum."""
        requests: list[_Request] = []
        by_target: dict[tuple[str | None, str | None], list[_Event]] = {}
        for item in batch:
            if isinstance(item, _Control):
                requests.append(item)
            else:
                by_target.setdefault((item._topic, item._exchange), []).append(item)
        budget = self.max_frame_bytes - SEND_OVERHEAD
        for (topic, exchange), group in by_target.items():
            name = exchange if exchange is not None else topic
            name_size = len(name.encode()) if name is not None else 0
            chunk: list[_Event] = []
            size = name_size
            for item in group:
                item_size = len(item._payload)
                if chunk and (size + item_size > budget or len(chunk) >= MAX_EVENTS_PER_SEND):
                    requests.append(chunk)
                    chunk, size = [], name_size
                chunk.append(item)
                size += item_size
            requests.append(chunk)
        return requests

    def _next_id(self) -> int:
        """Request ids wrap around but skip 0, the id of connection-level errors."""
        self._request_id = self._request_id % 0xFFFFFFFF + 1
        return self._request_id

    def _connect(self) -> _Connection:
        """The open connection, or a new one (with backoff while the agent is away)."""
        connection = self._connection
        if connection is not None and not connection.closed:
            return connection
        deadline = time.monotonic() + self.timeout
        while True:
            if self._backoff > 0:
                time.sleep(self._backoff)
            try:
                sock = self._open_socket()
            except OSError as exc:
                self._backoff = min(
                    max(self._backoff * 2, self.reconnect_backoff_s), _MAX_BACKOFF_S
                )
                if time.monotonic() + self._backoff > deadline:
                    raise OSError(exc.errno, connect_failure(self._target, exc)) from exc
                continue
            break
        max_frame = max(self.max_frame_bytes, DEFAULT_MAX_FRAME)
        if self._target.path is not None:
            connection = _Connection(sock, max_frame)
        else:
            try:
                connection = self._greet(sock, max_frame)
            except EventspoolError:
                sock.close()
                self._backoff = min(
                    max(self._backoff * 2, self.reconnect_backoff_s), _MAX_BACKOFF_S
                )
                raise
        reader = threading.Thread(
            target=self._read_in_background,
            args=(connection,),
            name="eventspool-client-reader",
            daemon=True,
        )
        connection.reader = reader
        with self._lock:
            closed = self._closed
            if not closed:
                self._connection = connection
        if closed:  # close() came while connecting: it could not drop this one
            sock.close()
            raise AgentError(f"agent at {self.target}: the client was closed")
        reader.start()
        return connection

    def _open_socket(self) -> socket.socket:
        target = self._target
        if target.path is None:
            sock = socket.create_connection((target.host, target.port), timeout=self.timeout)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        else:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(self.timeout)
            try:
                sock.connect(target.path)
            except OSError:
                sock.close()
                raise
        _block_with_timeout(sock, self.timeout)
        return sock

    def _greet(self, sock: socket.socket, max_frame: int) -> _Connection:
        """The TLS handshake, then AUTH with the token (or else a PING), answered before
        anything is sent: raises ForbiddenError for a refused token, AgentError when TLS
        fails or the agent hangs up."""
        target = self._target
        where = f"agent at {self.target}"
        tls = None if target.ssl_context is None else _Tls(target.ssl_context, target.host)
        connection = _Connection(sock, max_frame, tls)
        greeting = Greeting.for_target(target, self._next_id())
        try:
            data = greeting.frame
            if tls is not None:
                tls.handshake(sock)
                data = tls.seal(data)
            sock.sendall(data)
            frames: list[Frame] = []
            while not frames:
                data = sock.recv(_READ_SIZE)
                if not data:
                    raise ConnectionResetError
                frames = connection.decoder.feed(data if tls is None else tls.open(data))
        except BlockingIOError:  # SO_RCVTIMEO or SO_SNDTIMEO ran out
            raise AgentError(f"{where}: no answer within {self.timeout} s") from None
        except (OSError, ProtocolError) as exc:  # ssl.SSLError and resets are OSErrors
            raise greeting_failure(exc, where, tls=tls is not None) from None
        greeting.check(frames[0], where)
        return connection

    # ---- reading: a waiting caller, or the reader thread ---------------------------------

    def _reading_here(self) -> bool:
        """Whether this thread reads the answers now (in a done callback): waiting for its
        own answer would wait for itself."""
        connection = self._connection
        return connection is not None and connection.reader_ident == threading.get_ident()

    def _take_reading(self) -> _Connection | None:
        """The connection, when the caller may read it: nobody else is reading."""
        with self._lock:
            connection = self._connection
            if connection is None or connection.closed or connection.reading:
                return None
            connection.reading = True
            return connection

    def _read_in_background(self, connection: _Connection) -> None:
        """Read the answers nobody waits for in person: those of `send_async()`, and the
        rest when the caller who was reading got its own."""
        while True:
            with self._lock:
                while not connection.closed and (connection.reading or not connection.in_flight):
                    self._reader_wanted.wait()
                if connection.closed:
                    return
                connection.reading = True
            self._read(connection, None, None)

    def _read(
        self, connection: _Connection, reply: _Reply | _EventFuture | None, deadline: float | None
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
                elif not connection.in_flight:
                    break
                if connection.unsent and not self._readable_or_writable(connection, deadline):
                    continue  # room to write the rest: do it before reading on
                try:
                    data = connection.sock.recv(_READ_SIZE)
                except (TimeoutError, BlockingIOError):  # SO_RCVTIMEO ran out
                    reason = f"no answer within {self.timeout} s"
                    break
                if not data:
                    reason = "the agent closed the connection"
                    break
                if connection.tls is not None:
                    data = connection.tls.open(data)
                connection.reader_busy = True
                for frame in connection.decoder.feed(data):
                    self._answer(connection, frame)
        except (OSError, ProtocolError) as exc:
            reason = str(exc) or type(exc).__name__
        connection.reader_busy = False
        connection.reader_ident = None
        with self._lock:
            connection.reading = False
            if connection.in_flight and not connection.closed:
                self._reader_wanted.notify()
        if reason:
            self._drop(connection, reason)
        self._flush()

    def _readable_or_writable(self, connection: _Connection, deadline: float | None) -> bool:
        """Wait until answers come (True) or the socket takes more (False)."""
        left = self.timeout if deadline is None else max(deadline - time.monotonic(), 0.0)
        connection.poller.modify(connection.fd, select.POLLIN | select.POLLOUT)
        try:
            ready = connection.poller.poll(left * 1000)
        finally:
            connection.poller.modify(connection.fd, select.POLLIN)
        return not ready or any(event & ~select.POLLOUT for _, event in ready)

    def _answer(self, connection: _Connection, frame: Frame) -> None:
        with self._lock:
            request = connection.in_flight.pop(frame.request_id, None)
            if type(request) is list:
                target = (request[0]._topic, request[0]._exchange)
                left = connection.targets[target] - 1
                if left:
                    connection.targets[target] = left
                else:
                    del connection.targets[target]
        if request is None:
            if frame.type is FrameType.ERROR:
                refusal = decode_error(frame.body).text
                raise ProtocolError(f"the agent refused the request: {refusal}")
            return
        connection.answered = True
        if isinstance(request, _Control):
            if frame.type is request.answer:
                request.body = frame.body
                request.reply.set(0, "")
            elif frame.type is FrameType.ERROR:
                text = decode_error(frame.body).text
                request.reply.set(0, AgentError(f"agent at {self.target}: {text}"))
            else:
                raise ProtocolError(f"a {frame.type.name} frame answered {request.type.name}")
            return
        if frame.type is FrameType.SEND_RESULT:
            try:
                results = decode_results(frame.body)
            except ValueError as exc:
                raise ProtocolError(str(exc)) from None
            if len(results) != len(request):
                raise ProtocolError(
                    f"SEND_RESULT has {len(results)} results for a SEND of {len(request)} events"
                )
            for item, result in zip(request, results, strict=True):
                item._settle(result if type(result) is str else _refusal(result))
        elif frame.type is FrameType.ERROR:
            error = _outcome(decode_error(frame.body))
            for item in request:
                item._settle(error)
        else:
            raise ProtocolError(f"a {frame.type.name} frame answered a SEND")

    def _drop(self, connection: _Connection, reason: str) -> None:
        """Close `connection`; what was written on it has an unknown outcome."""
        with self._lock:
            if connection.closed:
                return
            connection.closed = True
            self._reader_wanted.notify_all()
            if self._connection is connection:
                self._connection = None
            requests = list(connection.in_flight.values())
            connection.in_flight.clear()
            connection.targets.clear()
            if connection.answered:
                self._backoff = 0.0
            else:
                self._backoff = min(
                    max(self._backoff * 2, self.reconnect_backoff_s), _MAX_BACKOFF_S
                )
        with contextlib.suppress(OSError):  # already broken: closing is all that is left
            connection.sock.shutdown(socket.SHUT_RDWR)
        connection.sock.close()
        lost = AgentError(
            f"agent at {self.target}: the connection broke after the request was "
            f"written ({reason}); the outcome is unknown: it may or may not have been processed"
        )
        for request in requests:
            self._fail([request] if isinstance(request, _Control) else request, lost)

    @staticmethod
    def _fail(items: Iterable[_Event | _Control], error: EventspoolError) -> None:
        for item in items:
            if isinstance(item, _Control):
                item.reply.set(0, error)
            else:
                item._settle(error)


def _write_now(connection: _Connection, data: bytes) -> int:
    """Bytes of `data` the socket took without waiting."""
    try:
        return connection.sock.send(data, socket.MSG_DONTWAIT)
    except BlockingIOError:
        return 0


def _take(queue: deque[_Event | _Control], most: int) -> list[_Event | _Control]:
    """Up to `most` requests from the front of the queue; callers may append meanwhile."""
    taken: list[_Event | _Control] = []
    while len(taken) < most:
        try:
            taken.append(queue.popleft())
        except IndexError:
            break
    return taken


def _refusal(result: str | tuple[int, str]) -> EventspoolError:
    """The error of a refused event, from its (status, text) as the compiled decoder gives it."""
    assert not isinstance(result, str)
    status, text = result
    try:
        known = Status(status)
    except ValueError:
        raise ProtocolError(f"SEND_RESULT: unknown status {status}") from None
    return error_for(known, text)


def _outcome(result: EventResult) -> Outcome:
    return result.text if result.status is Status.OK else error_for(result.status, result.text)


def _checked_payload(  # noqa: PLR0917  # send()'s own parameters, in its order
    topic: str | None,
    value: bytes | None,
    key: bytes | str | None,
    headers: HeadersInput | None,
    event_id: str | uuid.UUID | None,
    exchange: str | None,
    routing_key: str,
) -> bytes:
    """Check the arguments, as `Spool.send()` does, before anything is queued."""
    if exchange is None:
        return event_payload(topic, value, key, headers, event_id)
    return routed_event_payload(
        topic, value, key, headers, event_id, exchange=exchange, routing_key=routing_key
    )


def _block_with_timeout(sock: socket.socket, timeout: float) -> None:
    """Blocking reads and writes that give up after `timeout` (SO_RCVTIMEO, SO_SNDTIMEO).

    Not Python's socket timeout: that polls before each recv, and a reader woken from
    poll() answers 40 us later than one woken from recv() (measured on a 2-core VM: 80
    against 40 us for a ping to a process that answers at once). A write that must
    not wait sends with MSG_DONTWAIT.
    """
    seconds = int(timeout)
    micros = max(int((timeout - seconds) * 1_000_000), 0 if seconds else 1)  # 0, 0: forever
    interval = struct.pack("@ll", seconds, micros)
    sock.settimeout(None)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, interval)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, interval)
