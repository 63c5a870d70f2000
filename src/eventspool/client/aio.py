"""The asyncio client: `await AsyncClient(socket).send(topic, value, key, headers) -> event_id`.

The same contract as the blocking `Client`, for code that lives on an event loop. A send
only queues its event; one writer task turns everything queued (up to `max_batch`
events) into pipelined SEND frames, one per topic, and one reader task hands each
answer to the sends waiting for it. Sends issued while the writer is busy (or within
`linger_s` of the first one) travel together in the next batch, and the writer does not
wait for answers before writing again, so several batches may be in flight at once.

A broken connection fails the sends already written with AgentError (their outcome is
unknown: the agent may have spooled them before it died); the sends not yet written
stay queued and go out on the next connection, reconnecting with backoff. Every call
gives up after `timeout` seconds with AgentError.

"tcp://host:port" reaches the agent's TCP listener, as for `Client`: TLS with
`ssl_context`, AUTH with `token`, and a connection used only once the agent answered its
AUTH (or a PING). A refusal fails the calls queued then: ForbiddenError for the token,
AgentError for TLS or a hang-up.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import ssl
import time
import uuid
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TypeVar

from eventspool.client.common import (
    Greeting,
    Target,
    connect_failure,
    greeting_failure,
    next_backoff,
    parse_target,
    routed_event_payload,
)
from eventspool.envelope import HeadersInput
from eventspool.errors import AgentError, EventspoolError, InvalidEventError
from eventspool.wire.batching import frame_slices
from eventspool.wire.checks import BatchEvent, Outcome, event_payload, split_batch_event
from eventspool.wire.protocol import (
    DEFAULT_MAX_FRAME,
    Frame,
    FrameDecoder,
    FrameType,
    ProtocolError,
    decode_error,
    decode_send_result,
    encode_frame,
    encode_publish_payloads,
    encode_send_payloads,
)
from eventspool.wire.status import raise_for

__all__ = ["AgentError", "AsyncClient"]

_T = TypeVar("_T")

_READ_SIZE = 256 * 1024
_MAX_REQUEST_ID = 0xFFFF_FFFF


@dataclass(slots=True, eq=False)
class _Send:
    """One event waiting to be written, then waiting for its answer.

    `topic` names the topic of a SEND; a PUBLISH has `exchange` instead, and the routing
    key heads the payload.
    """

    topic: str | None
    payload: bytes  # the event encoded for its SEND or PUBLISH body
    future: asyncio.Future[str]
    written: bool = False
    exchange: str | None = None


@dataclass(slots=True, eq=False)
class _Control:
    """A PING or STATS: its own frame, queued behind the sends like any request."""

    type: FrameType
    answer: FrameType
    future: asyncio.Future[bytes]
    written: bool = False


_Item = _Send | _Control
_Request = list[_Send] | _Control


class _Connection:
    """One stream to the agent and the requests written on it that await an answer."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, decoder: FrameDecoder
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.decoder = decoder
        self.in_flight: dict[int, _Request] = {}
        self.closed = False
        self.answered = False
        self.read_task: asyncio.Task[None] | None = None


def _resolve(future: asyncio.Future[_T], result: _T) -> None:
    """Complete a future unless its caller already gave up on it (timeout, cancellation)."""
    if not future.done():
        future.set_result(result)


def _fail(future: asyncio.Future[Any], error: BaseException) -> None:
    """Fail a future unless its caller already gave up on it (timeout, cancellation)."""
    if not future.done():
        future.set_exception(error)


class AsyncClient:
    """A connection to the local agent shared by every coroutine of one event loop.

    `frames_sent` counts the SEND frames written and `batches_sent` the writes that
    carried them, so a caller can see how well concurrent sends were combined.
    """

    #: The largest frame written; the agent's `max_frame_bytes` must be at least this.
    #: A batch is split into several SEND frames to stay below it.
    max_frame_bytes: int = DEFAULT_MAX_FRAME

    def __init__(
        self,
        target: str | os.PathLike[str],
        *,
        timeout: float = 10.0,
        max_batch: int = 1000,
        linger_s: float = 0.0,
        reconnect_backoff_s: float = 0.05,
        ssl_context: ssl.SSLContext | None = None,
        token: str | None = None,
    ) -> None:
        """`target`: the agent's unix socket path, or "tcp://host:port" for its TCP
        listener, with `ssl_context` and `token` as for `Client`."""
        if timeout <= 0:
            raise ValueError(f"timeout={timeout}: must be positive")
        if max_batch < 1:
            raise ValueError(f"max_batch={max_batch}: must be at least 1")
        if linger_s < 0:
            raise ValueError(f"linger_s={linger_s}: must not be negative")
        if reconnect_backoff_s <= 0:
            raise ValueError(f"reconnect_backoff_s={reconnect_backoff_s}: must be positive")
        self._target: Target = parse_target(target, ssl_context, token)
        self.target = self._target.text
        self.timeout = timeout
        self.max_batch = max_batch
        self.linger_s = linger_s
        self.reconnect_backoff_s = reconnect_backoff_s
        self.frames_sent = 0
        self.batches_sent = 0
        self._pending: deque[_Item] = deque()
        self._wake = asyncio.Event()
        self._connection: _Connection | None = None
        self._writer_task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._request_id = 0
        self._connect_error: str | None = None
        # Seconds to wait before the next connect: 0 until a connection fails to work.
        self._backoff = 0.0
        self._closed = False

    async def send(
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
        if exchange is None:
            payload = event_payload(topic, value, key, headers, event_id)
            send = _Send(topic, payload, self._running_loop().create_future())
        else:
            payload = routed_event_payload(
                topic, value, key, headers, event_id, exchange=exchange, routing_key=routing_key
            )
            send = _Send(None, payload, self._running_loop().create_future(), exchange=exchange)
        return await self._submit(send, send.future)

    async def send_many(self, topic: str, events: Iterable[BatchEvent]) -> list[Outcome]:
        """Hand a batch of events for one topic to the agent, as `Client.send_many()` does.

        Each event is a value, or a (value, key), (value, key, headers) or (value, key,
        headers, event_id) tuple. Returns each event's outcome in order: its event_id, or
        the error that refused it. Raises AgentError when the agent cannot be reached;
        InvalidEventError, before anything is queued, for an argument the wire cannot
        carry.
        """
        loop = self._running_loop()
        sends = []
        for item in events:
            value, key, headers, event_id = split_batch_event(item)
            payload = event_payload(topic, value, key, headers, event_id)
            sends.append(_Send(topic, payload, loop.create_future()))
        if not sends:
            return []
        self._pending.extend(sends)
        self._wake.set()
        outcomes: list[Outcome] = []
        try:
            async with asyncio.timeout(self.timeout):
                for send in sends:
                    try:
                        outcomes.append(await send.future)
                    except AgentError:
                        raise
                    except EventspoolError as exc:
                        outcomes.append(exc)
        except TimeoutError:
            for send in sends:
                send.future.cancel()
            raise AgentError(self._timeout_message(sends[0])) from None
        return outcomes

    async def ping(self) -> float:
        """Round-trip time to the agent in seconds, queued behind the sends already issued."""
        started = time.perf_counter()
        await self._control(FrameType.PING, FrameType.PONG)
        return time.perf_counter() - started

    async def stats(self) -> dict[str, Any]:
        """The agent's STATS answer: its queues, the sender's counters, connectivity."""
        body = await self._control(FrameType.STATS, FrameType.STATS_RESULT)
        try:
            stats = json.loads(body)
        except ValueError as exc:
            raise AgentError(f"agent at {self.target}: STATS is not JSON: {exc}") from None
        if not isinstance(stats, dict):
            raise AgentError(f"agent at {self.target}: STATS is not a JSON object")
        return stats

    async def close(self) -> None:
        """Let the calls already issued finish (within their timeout), then disconnect.

        Calls issued after close() raise AgentError.
        """
        if self._closed:
            return
        self._closed = True
        if self._loop is None:
            return
        waiting: set[asyncio.Future[Any]] = {item.future for item in self._pending}
        if self._connection is not None:
            for request in self._connection.in_flight.values():
                items = [request] if isinstance(request, _Control) else request
                waiting.update(item.future for item in items)
        waiting = {future for future in waiting if not future.done()}
        if waiting:
            await asyncio.wait(waiting, timeout=self.timeout)
        if self._writer_task is not None:
            self._writer_task.cancel()
            await asyncio.gather(self._writer_task, return_exceptions=True)
        for item in self._pending:
            _fail(item.future, AgentError(f"agent at {self.target}: the client was closed"))
        self._pending.clear()
        connection = self._connection
        if connection is not None:
            self._drop(connection, "the client was closed")
            if connection.read_task is not None:
                await asyncio.gather(connection.read_task, return_exceptions=True)
            with contextlib.suppress(OSError):  # already broken: closed is all that was asked
                await connection.writer.wait_closed()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

    # ---- callers' side -------------------------------------------------------------

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        """The loop this client is bound to; its writer task starts with the first call."""
        if self._closed:
            raise AgentError(f"agent at {self.target}: the client is closed")
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
        elif self._loop is not loop:
            raise RuntimeError("an AsyncClient is bound to the event loop it was first used in")
        if self._writer_task is None or self._writer_task.done():
            self._writer_task = loop.create_task(self._write_forever(), name="eventspool-writer")
        return loop

    async def _control(self, frame_type: FrameType, answer: FrameType) -> bytes:
        future: asyncio.Future[bytes] = self._running_loop().create_future()
        return await self._submit(_Control(frame_type, answer, future), future)

    async def _submit(self, item: _Item, future: asyncio.Future[_T]) -> _T:
        """Queue a request and wait for its answer; a timeout cancels `future`.

        A cancelled future is skipped by the writer and by the reader, so a request that
        timed out before it was written is never written.
        """
        self._pending.append(item)
        self._wake.set()
        try:
            async with asyncio.timeout(self.timeout):
                return await future
        except TimeoutError:
            raise AgentError(self._timeout_message(item)) from None

    def _timeout_message(self, item: _Item) -> str:
        where = f"agent at {self.target}"
        if item.written:
            return (
                f"{where}: no answer within {self.timeout} s; the outcome is unknown: "
                f"the request may or may not have been processed"
            )
        if self._connect_error is not None:
            return f"{where}: {self._connect_error} (gave up after {self.timeout} s)"
        return f"{where}: the request could not be written within {self.timeout} s"

    # ---- the writer task -------------------------------------------------------------

    async def _write_forever(self) -> None:
        """Write whatever is queued; connect when needed, with backoff while it fails."""
        idle = True
        while True:
            while self._pending and self._pending[0].future.done():
                self._pending.popleft()
            if not self._pending:
                self._wake.clear()
                await self._wake.wait()
                idle = True
                continue
            if idle and self.linger_s > 0:
                await asyncio.sleep(self.linger_s)  # the first send waits for company
            idle = False
            connection = self._connection
            if connection is None:
                if self._backoff > 0:
                    await asyncio.sleep(self._backoff)
                try:
                    connection = await self._connect()
                except OSError as exc:
                    self._connect_error = connect_failure(self._target, exc)
                    self._back_off()
                    continue
                except EventspoolError as exc:  # refused: TLS, the token
                    for item in self._pending:
                        _fail(item.future, exc)
                    self._pending.clear()
                    self._back_off()
                    continue
                self._connect_error = None
            await self._write_batch(connection)

    async def _greet(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, decoder: FrameDecoder
    ) -> None:
        """AUTH with the token (or else a PING), answered before anything else is sent."""
        target = self._target
        where = f"agent at {self.target}"
        greeting = Greeting.for_target(target, self._next_id())
        try:
            writer.write(greeting.frame)
            frames: list[Frame] = []
            while not frames:
                data = await reader.read(_READ_SIZE)
                if not data:
                    raise ConnectionResetError
                frames = decoder.feed(data)
        except (OSError, ProtocolError) as exc:  # ssl.SSLError and resets are OSErrors
            raise greeting_failure(exc, where, tls=target.ssl_context is not None) from None
        greeting.check(frames[0], where)

    def _back_off(self) -> None:
        """Wait longer before each new attempt, up to a second, while the agent stays away."""
        self._backoff = next_backoff(self._backoff, self.reconnect_backoff_s)

    async def _connect(self) -> _Connection:
        """A new connection; raises OSError while the agent cannot be reached (the writer
        tries again), AgentError or ForbiddenError when it refuses this client."""
        target = self._target
        decoder = FrameDecoder(max(self.max_frame_bytes, DEFAULT_MAX_FRAME))
        async with asyncio.timeout(self.timeout):
            if target.path is not None:
                reader, writer = await asyncio.open_unix_connection(target.path, limit=_READ_SIZE)
            else:
                try:
                    reader, writer = await asyncio.open_connection(
                        target.host, target.port, ssl=target.ssl_context, limit=_READ_SIZE
                    )
                except ssl.SSLError as exc:
                    raise greeting_failure(exc, f"agent at {self.target}", tls=True) from None
                try:
                    await self._greet(reader, writer, decoder)
                except BaseException:
                    writer.transport.abort()
                    raise
        connection = _Connection(reader, writer, decoder)
        connection.read_task = asyncio.get_running_loop().create_task(
            self._read_forever(connection), name="eventspool-reader"
        )
        self._connection = connection
        return connection

    async def _write_batch(self, connection: _Connection) -> None:
        """Write up to `max_batch` queued requests as one pipelined write."""
        if connection.closed:
            return
        batch: list[_Item] = []
        while self._pending and len(batch) < self.max_batch:
            item = self._pending.popleft()
            if not item.future.done():
                batch.append(item)
        frames = self._encode(batch, connection)
        if not frames:
            return
        self.batches_sent += 1
        try:
            connection.writer.write(b"".join(frames))
            await connection.writer.drain()
        except OSError as exc:
            self._drop(connection, f"writing failed: {exc}")

    def _encode(self, batch: list[_Item], connection: _Connection) -> list[bytes]:
        """Frames for a batch, each registered as in flight on `connection`."""
        frames: list[bytes] = []
        by_target: dict[tuple[str | None, str | None], list[_Send]] = {}
        for item in batch:
            if isinstance(item, _Send):
                by_target.setdefault((item.topic, item.exchange), []).append(item)
                continue
            request_id = self._next_id()
            frames.append(encode_frame(item.type, request_id, b""))
            connection.in_flight[request_id] = item
            item.written = True
        for (topic, exchange), group in by_target.items():
            name = exchange if exchange is not None else topic
            assert name is not None
            sizes = [len(send.payload) for send in group]
            for cut in frame_slices(name, sizes, self.max_frame_bytes):
                chunk = group[cut]
                request_id = self._next_id()
                payloads = [send.payload for send in chunk]
                encode = encode_send_payloads if exchange is None else encode_publish_payloads
                try:
                    frame = encode(request_id, name, payloads)
                except ProtocolError as exc:  # only sizes no frame can carry get here
                    for send in chunk:
                        _fail(send.future, InvalidEventError(str(exc)))
                    continue
                frames.append(frame)
                connection.in_flight[request_id] = chunk
                for send in chunk:
                    send.written = True
                self.frames_sent += 1
        return frames

    def _next_id(self) -> int:
        """1 .. 2**32-1: id 0 is how the agent reports an error with no request to name."""
        self._request_id = self._request_id % _MAX_REQUEST_ID + 1
        return self._request_id

    # ---- the reader task -------------------------------------------------------------

    async def _read_forever(self, connection: _Connection) -> None:
        """Hand each answer to its request until the connection ends, then fail the rest."""
        reason = "the agent closed the connection"
        try:
            while True:
                data = await connection.reader.read(_READ_SIZE)
                if not data:
                    break
                for frame in connection.decoder.feed(data):
                    self._answer(connection, frame)
        except (OSError, ProtocolError) as exc:
            reason = str(exc) or type(exc).__name__
        self._drop(connection, reason)

    def _answer(self, connection: _Connection, frame: Frame) -> None:
        """Settle the request `frame` answers; ProtocolError means the stream is lost.

        The request leaves `in_flight` only once its answer was understood, so a garbled
        answer fails it with the rest of the connection instead of losing it.
        """
        request = connection.in_flight.get(frame.request_id)
        if request is None:
            if frame.type is FrameType.ERROR:
                refusal = decode_error(frame.body).text
                raise ProtocolError(f"the agent refused the request: {refusal}")
            return  # an answer to nothing asked on this connection: nobody waits for it
        if isinstance(request, _Control):
            self._answer_control(request, frame)
        else:
            self._answer_send(request, frame)
        del connection.in_flight[frame.request_id]
        connection.answered = True

    def _answer_control(self, control: _Control, frame: Frame) -> None:
        if frame.type is control.answer:
            _resolve(control.future, frame.body)
        elif frame.type is FrameType.ERROR:
            text = decode_error(frame.body).text
            _fail(control.future, AgentError(f"agent at {self.target}: {text}"))
        else:
            raise ProtocolError(f"a {frame.type.name} frame answered {control.type.name}")

    def _answer_send(self, chunk: list[_Send], frame: Frame) -> None:
        if frame.type is FrameType.SEND_RESULT:
            results = decode_send_result(frame.body)
            if len(results) != len(chunk):
                raise ProtocolError(
                    f"SEND_RESULT has {len(results)} results for a SEND of {len(chunk)} events"
                )
        elif frame.type is FrameType.ERROR:
            results = [decode_error(frame.body)] * len(chunk)
        else:
            raise ProtocolError(f"a {frame.type.name} frame answered a SEND")
        for send, result in zip(chunk, results, strict=True):
            if send.future.done():
                continue
            try:
                send.future.set_result(raise_for(result))
            except EventspoolError as exc:
                send.future.set_exception(exc)

    def _drop(self, connection: _Connection, reason: str) -> None:
        """Close `connection`; what was written on it has an unknown outcome."""
        if connection.closed:
            return
        connection.closed = True
        if self._connection is connection:
            self._connection = None
        if connection.answered:
            self._backoff = 0.0  # it worked: the next connection is tried at once
        else:
            self._back_off()  # an agent that accepts and hangs up must not be hammered
        # abort, not close: close would wait to flush what a frozen agent never reads.
        connection.writer.transport.abort()
        requests = list(connection.in_flight.values())
        connection.in_flight.clear()
        lost = (
            f"agent at {self.target}: the connection broke after the request was "
            f"written ({reason}); the outcome is unknown: it may or may not have been processed"
        )
        for request in requests:
            for item in [request] if isinstance(request, _Control) else request:
                _fail(item.future, AgentError(lost))
