"""The agent's unix-socket server: frames in, durable enqueue, per-event statuses out.

Each connection is served by one task that reads, answers and only then reads on
(`drain()` between rounds): a client that never reads its responses stalls itself, not
the agent, and its memory is bounded by the socket buffers plus one frame. A frame
that takes longer than `frame_timeout_s` to arrive (a slowloris) closes its connection.
Sends run in a small thread pool, so an fsync or a blocking queue never stops the
event loop, and are answered only after `Spool.send()` returned for every event.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import socket
import struct
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path

from eventspool.agent.http import HttpHandlers, looks_like_http, serve_http
from eventspool.agent.protocol import (
    DEFAULT_MAX_FRAME,
    EventResult,
    Frame,
    FrameDecoder,
    FrameType,
    ProtocolError,
    PublishRequest,
    SendRequest,
    Status,
    decode_publish,
    decode_send,
    encode_error,
    encode_frame,
    encode_send_result,
)
from eventspool.agent.quotas import Quotas
from eventspool.config import Durability, FullPolicy
from eventspool.errors import (
    DiskFullError,
    EventTooLargeError,
    InvalidEventError,
    InvalidTopicError,
    SpoolClosedError,
    SpoolFullError,
    UnknownExchangeError,
    UnroutableError,
)
from eventspool.metrics import render
from eventspool.routing.exchanges import Exchange
from eventspool.routing.table import ExchangeInfo
from eventspool.spool.api import Spool

log = logging.getLogger(__name__)

_READ_SIZE = 256 * 1024
_SEND_THREADS = 4
_INLINE_MAX_EVENTS = 64


class AgentServer:
    def __init__(
        self,
        spool: Spool,
        socket_path: Path,
        *,
        socket_mode: int = 0o660,
        max_frame: int = DEFAULT_MAX_FRAME,
        frame_timeout_s: float = 30.0,
        quotas: Quotas | None = None,
        tcp_listen: tuple[str, int] | None = None,
    ) -> None:
        self.spool = spool
        self.socket_path = socket_path
        self.socket_mode = socket_mode
        self.max_frame = max_frame
        self.frame_timeout_s = frame_timeout_s
        self._executor = ThreadPoolExecutor(_SEND_THREADS, thread_name_prefix="eventspool-send")
        self.quotas = quotas or Quotas(None, {})
        self.tcp_listen = tcp_listen
        self._servers: list[asyncio.AbstractServer] = []
        self._connections: set[asyncio.Task[None]] = set()
        self.accepting = True
        self.protocol_errors = 0

    def stats(self) -> dict[str, object]:
        """What STATS answers: every queue, the sender's counters, connectivity."""
        sender = self.spool.sender
        return {
            "queues": [
                {"topic": ref.topic, "partition": ref.partition, **asdict(ref.ring.stats())}
                for ref in self.spool.queues()
            ],
            "sender": asdict(sender.counters) if sender else None,
            "dead_letters": sender.dead_letters.count if sender else 0,
            "broker_connected": sender.connected if sender else False,
            "protocol_errors": self.protocol_errors,
            "throttle_seconds": self.quotas.counters.throttle_seconds,
            "exchanges": {
                info.exchange.name: exchange_json(info) for info in self.spool.exchanges()
            },
        }

    async def start(self) -> None:
        """Listen on the socket path; a stale socket file of a dead agent is replaced."""
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        self.socket_path.unlink(missing_ok=True)
        old_umask = os.umask(0o777 & ~self.socket_mode)
        try:
            unix = await asyncio.start_unix_server(
                self._serve, path=str(self.socket_path), limit=_READ_SIZE
            )
        finally:
            os.umask(old_umask)
        os.chmod(self.socket_path, self.socket_mode)
        self._servers.append(unix)
        if self.tcp_listen is not None:
            host, port = self.tcp_listen
            self._servers.append(
                await asyncio.start_server(self._serve, host, port, limit=_READ_SIZE)
            )

    async def stop(self) -> None:
        """Stop accepting connections, answer what is being processed, close the rest."""
        self.accepting = False
        for server in self._servers:
            server.close()
            await server.wait_closed()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        self._executor.shutdown(wait=True)
        self.socket_path.unlink(missing_ok=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        client = _client_name(writer)
        try:
            await self._serve_connection(reader, writer, client)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:
            pass
        except Exception:
            log.exception("connection failed; closing it")
        finally:
            self._connections.discard(task)
            self.quotas.forget(client)
            writer.close()

    async def _serve_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, client: str
    ) -> None:
        try:
            first = await asyncio.wait_for(reader.read(_READ_SIZE), self.frame_timeout_s)
        except TimeoutError:
            return  # a connection that never says anything only holds a descriptor
        if not first:
            return
        if looks_like_http(first):
            handlers = HttpHandlers(
                send=functools.partial(self.send, client=client),
                metrics=self.metrics,
                health=self.health,
                exchanges=self.list_exchanges,
                exchange=self.get_exchange,
                declare=self.declare_exchange,
                delete=self.delete_exchange,
            )
            await serve_http(
                first,
                reader,
                writer,
                handlers,
                max_body=self.max_frame,
                request_timeout_s=self.frame_timeout_s,
            )
        else:
            await self._serve_frames(first, reader, writer, client)

    async def _serve_frames(
        self,
        first: bytes,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        client: str,
    ) -> None:
        decoder = FrameDecoder(self.max_frame)
        frame_started: float | None = None
        data = first
        while True:
            try:
                frames = decoder.feed(data)
            except ProtocolError as exc:
                self.protocol_errors += 1
                writer.write(encode_error(0, Status.MALFORMED, str(exc)))
                await writer.drain()
                return
            for frame in frames:
                writer.write(await self._answer(frame, client))
            if decoder.buffered:
                if frame_started is None or frames:
                    frame_started = time.monotonic()
            else:
                frame_started = None
            await writer.drain()
            timeout = None
            if frame_started is not None:
                timeout = frame_started + self.frame_timeout_s - time.monotonic()
                if timeout <= 0:
                    self.protocol_errors += 1
                    return
            try:
                data = await asyncio.wait_for(reader.read(_READ_SIZE), timeout)
            except TimeoutError:
                self.protocol_errors += 1
                return
            if not data:
                return

    async def _answer(self, frame: Frame, client: str) -> bytes:
        if frame.type is FrameType.PING:
            return encode_frame(FrameType.PONG, frame.request_id, frame.body)
        if frame.type is FrameType.STATS:
            body = json.dumps(self.stats()).encode()
            return encode_frame(FrameType.STATS_RESULT, frame.request_id, body)
        if frame.type is not FrameType.SEND and frame.type is not FrameType.PUBLISH:
            self.protocol_errors += 1
            return encode_error(
                frame.request_id, Status.MALFORMED, f"{frame.type.name} is not a request"
            )
        try:
            request = (
                decode_send(frame.body)
                if frame.type is FrameType.SEND
                else decode_publish(frame.body)
            )
        except ProtocolError as exc:
            self.protocol_errors += 1
            return encode_error(frame.request_id, Status.MALFORMED, str(exc))
        return encode_send_result(frame.request_id, await self.send(request, client))

    async def send(self, request: SendRequest | PublishRequest, client: str) -> list[EventResult]:
        """Spool a request's events off the event loop; shared by both interfaces.

        A client or topic over its quota gets its answer late, never a refusal. Topic
        quotas apply to SEND; a PUBLISH counts against the client's quota only.
        """
        if not self.accepting:
            return [EventResult(Status.SHUTTING_DOWN, "agent is shutting down")] * len(
                request.events
            )
        if self._may_send_inline(request):
            results = self._send_all(request)
        else:
            loop = asyncio.get_running_loop()
            results = await loop.run_in_executor(self._executor, self._send_all, request)
        if self.quotas.enabled:
            events = (
                request.events
                if isinstance(request, SendRequest)
                else [routed.event for routed in request.events]
            )
            size = sum(
                len(event.value or b"") + len(event.key or b"")
                for event, result in zip(events, results, strict=True)
                if result.ok
            )
            topic = request.topic if isinstance(request, SendRequest) else None
            delay = self.quotas.record(client, topic, size)
            if delay > 0:
                await asyncio.sleep(delay)
        return results

    def _may_send_inline(self, request: SendRequest | PublishRequest) -> bool:
        """Small requests to queues that never wait are spooled on the event loop itself.

        Handing them to a thread costs far more than the few microseconds `send()` takes;
        fsync durability and the block policy wait, so they keep the thread pool. A
        PUBLISH is judged by every topic its exchange can write to.
        """
        if len(request.events) > _INLINE_MAX_EVENTS:
            return False
        if isinstance(request, SendRequest):
            topics: frozenset[str] | tuple[str] = (request.topic,)
        else:
            try:
                topics = self.spool.exchange(request.exchange).exchange.topics()
            except UnknownExchangeError:
                return True  # refused at once, whatever the size
        settings = self.spool.settings
        return all(
            (queue := settings.for_topic(topic)).durability is Durability.PROCESS
            and queue.full_policy is not FullPolicy.BLOCK
            for topic in topics
        )

    def metrics(self) -> bytes:
        counters = self.quotas.counters
        return render(
            self.spool,
            lambda: {
                "protocol_errors": self.protocol_errors,
                "throttled_responses": counters.throttled_responses,
                "throttle_seconds": counters.throttle_seconds,
            },
        )

    def health(self) -> dict[str, object]:
        sender = self.spool.sender
        return {
            "status": "ok" if self.accepting else "stopping",
            "broker_connected": bool(sender and sender.connected),
        }

    def _send_all(self, request: SendRequest | PublishRequest) -> list[EventResult]:
        """Spool every event of one request, each with its own status."""
        send = self.spool.send
        results = []
        if isinstance(request, SendRequest):
            topic = request.topic
            for event in request.events:
                try:
                    event_id = send(topic, event.value, event.key, event.headers)
                except Exception as exc:
                    results.append(_failure(exc, f"topic {topic!r}"))
                else:
                    results.append(EventResult(Status.OK, event_id))
            return results
        exchange = request.exchange
        for routed in request.events:
            event = routed.event
            try:
                event_id = send(
                    None,
                    event.value,
                    event.key,
                    event.headers,
                    exchange=exchange,
                    routing_key=routed.routing_key,
                )
            except Exception as exc:
                results.append(_failure(exc, f"exchange {exchange!r}"))
            else:
                results.append(EventResult(Status.OK, event_id))
        return results

    # ---- exchanges, for the HTTP interface ----------------------------------------------

    def list_exchanges(self) -> list[dict[str, object]]:
        return [exchange_json(info) for info in self.spool.exchanges()]

    def get_exchange(self, name: str) -> dict[str, object]:
        """Raises UnknownExchangeError."""
        return exchange_json(self.spool.exchange(name))

    async def declare_exchange(self, exchange: Exchange) -> bool:
        """Off the event loop: the declaration is fsynced before it takes effect."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self.spool.declare_exchange, exchange)

    async def delete_exchange(self, name: str) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, self.spool.delete_exchange, name)


def exchange_json(info: ExchangeInfo) -> dict[str, object]:
    """An exchange as STATS and the HTTP interface show it: declaration, source, counters."""
    return {
        **info.exchange.to_json(),
        "source": info.source.value,
        "routed": info.counts.routed,
        "unroutable_alternate": info.counts.alternate,
        "unroutable_refused": info.counts.refused,
    }


_STATUS_OF_ERROR: tuple[tuple[type[Exception], Status], ...] = (
    (DiskFullError, Status.NO_SPACE),
    (InvalidTopicError, Status.INVALID_TOPIC),
    (EventTooLargeError, Status.TOO_LARGE),
    (UnknownExchangeError, Status.UNKNOWN_EXCHANGE),
    (InvalidEventError, Status.MALFORMED),
    (UnroutableError, Status.UNROUTABLE),
    (SpoolFullError, Status.SPOOL_FULL),
    (SpoolClosedError, Status.SHUTTING_DOWN),
)


_DISK_FULL_LOG_EVERY_S = 60.0


class _DiskFullLog:
    """One warning a minute at most while the disk is full, not one per refused event."""

    def __init__(self) -> None:
        self._next = 0.0
        self._refused = 0

    def refused(self, exc: DiskFullError) -> None:
        self._refused += 1
        now = time.monotonic()
        if now >= self._next:
            log.warning(
                "disk full: %s (%d events refused since the last warning)", exc, self._refused
            )
            self._refused = 0
            self._next = now + _DISK_FULL_LOG_EVERY_S


_DISK_FULL_LOG = _DiskFullLog()


def _failure(exc: Exception, where: str) -> EventResult:
    """The status of a failed send: the first matching class, most specific first."""
    if isinstance(exc, DiskFullError):
        _DISK_FULL_LOG.refused(exc)
    for kind, status in _STATUS_OF_ERROR:
        if isinstance(exc, kind):
            return EventResult(status, str(exc))
    log.exception("send to %s failed", where)
    return EventResult(Status.INTERNAL, f"internal error: {exc}")


_PEER_CREDENTIALS = struct.Struct("3i")


def _client_name(writer: asyncio.StreamWriter) -> str:
    """Who is on the other end, for quotas: the peer's pid on a unix socket, else its address."""
    sock = writer.get_extra_info("socket")
    if sock is not None and sock.family == socket.AF_UNIX:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEER_CREDENTIALS.size)
        pid, uid, _ = _PEER_CREDENTIALS.unpack(raw)
        return f"pid {pid} (uid {uid})"
    return str(writer.get_extra_info("peername"))
