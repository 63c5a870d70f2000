"""The agent's socket server: frames in, durable enqueue, answers out by request id.

A connection carries many requests at once (pipelining); each is answered by its
request id as soon as its events are on disk, so answers may come out of order. Every
read parses all the whole frames it completed. A SEND to a topic whose queue never
waits (durability `process`, full policy not `block`) is written into the rings on the
event loop itself, through the compiled intake, and answered in the same turn: the
answers of one read go out in one write. A request that may wait (`fsync`, `block`)
runs in a small thread pool, queued behind the earlier requests for the same topic on
the same connection so their order holds; it never holds back other topics or other
connections.

Memory per connection stays bounded: reading pauses while the client does not read its
answers (the transport's write buffer is over its limit), while too many of its
requests wait for the pool, and while it is over its quota. A frame that takes longer
than `frame_timeout_s` to arrive (a slowloris) closes its connection, and so does a
connection that says nothing for as long.

With TLS, a TCP connection is served once its handshake succeeded (within
`frame_timeout_s`); a failed one is counted and logged once per client host and reason.
When `[[access]]` rules have tokens, a TCP connection's first frame must be an AUTH with
one of them (an HTTP request's `Authorization: Bearer` header): anything else is
refused, counted and the connection closed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import logging
import os
import socket
import ssl
import struct
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import cast

from eventspool._core.native import intake_send
from eventspool.agent.access import AllowList, Grant, Peer, PeerRules, token_digest
from eventspool.agent.http import HttpHandlers, looks_like_http, serve_http
from eventspool.agent.quotas import Quotas
from eventspool.agent.tls import common_name
from eventspool.config import Durability, FullPolicy
from eventspool.errors import (
    DiskFullError,
    UnknownExchangeError,
)
from eventspool.metrics import render
from eventspool.pipeline import Spool
from eventspool.routing.exchanges import Exchange
from eventspool.routing.table import ExchangeInfo
from eventspool.wire.protocol import (
    DEFAULT_MAX_FRAME,
    EventResult,
    Frame,
    FrameDecoder,
    FrameType,
    ProtocolError,
    PublishRequest,
    SendRequest,
    Status,
    WireEvent,
    decode_publish,
    decode_send,
    encode_error,
    encode_frame,
    encode_send_result,
    encode_text,
)
from eventspool.wire.status import status_for
from eventspool.wire.tls import openssl_text

log = logging.getLogger(__name__)

_READ_SIZE = 256 * 1024
_SEND_THREADS = 4
_INLINE_MAX_EVENTS = 64
# Requests of one connection waiting for the thread pool before its reading pauses.
_MAX_WAITING_REQUESTS = 256
_TOPIC_CACHE_MAX = 10_000
# Names one connection was found permitted to use; beyond it, each request is judged anew.
_PERMITTED_MAX = 1024
# Client hosts and reasons whose refused handshake or token was logged; beyond it, counted only.
_REFUSALS_LOGGED_MAX = 1000
# OpenSSL's reasons when what arrived is no TLS at all.
_NOT_TLS = frozenset({"WRONG_VERSION_NUMBER", "HTTP_REQUEST", "UNKNOWN_PROTOCOL"})

# What a request is answered with, and the key and value bytes it spooled (for quotas).
_Answer = tuple[bytes, int]


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
        tls: ssl.SSLContext | None = None,
        allow: AllowList | None = None,
        peer_rules: PeerRules | None = None,
    ) -> None:
        self.spool = spool
        self.socket_path = socket_path
        self.socket_mode = socket_mode
        self.max_frame = max_frame
        self.frame_timeout_s = frame_timeout_s
        self.executor = ThreadPoolExecutor(_SEND_THREADS, thread_name_prefix="eventspool-send")
        self.quotas = quotas or Quotas(None, {})
        self.allow = allow or AllowList(None, None)
        self.peer_rules = peer_rules or PeerRules(())
        self.tcp_listen = tcp_listen
        self.tls = tls
        self._servers: list[asyncio.AbstractServer] = []
        self._connections: set[_FrameConnection] = set()
        self._http_tasks: set[asyncio.Task[None]] = set()
        self._handshakes: set[asyncio.Task[None]] = set()
        self._refusals_logged: set[tuple[str, str]] = set()
        self._topic_waits: dict[str, bool] = {}
        self.accepting = True
        self.protocol_errors = 0
        self.requests = 0  # SEND and PUBLISH frames: events / requests is the batching
        self.tls_handshake_failures = 0
        self.auth_failures = 0  # TCP connections refused for a missing or unknown token

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
            "stalled": [asdict(queue) for queue in sender.stalled_queues()] if sender else [],
            "topic_warnings": dict(sender.topic_warnings) if sender else {},
            "protocol_errors": self.protocol_errors,
            "connections": len(self._connections),
            "budget": asdict(self.spool.budget()),
            "requests": self.requests,
            "throttle_seconds": self.quotas.counters.throttle_seconds,
            "forbidden": self.allow.refused + self.peer_rules.refusals.total(),
            "forbidden_by_rule": dict(self.peer_rules.refusals),
            "tls_handshake_failures": self.tls_handshake_failures,
            "auth_failures": self.auth_failures,
            "exchanges": {
                info.exchange.name: exchange_json(info) for info in self.spool.exchanges()
            },
        }

    async def start(self) -> None:
        """Listen on the socket path; a stale socket file of a dead agent is replaced."""
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        self.socket_path.unlink(missing_ok=True)
        loop = asyncio.get_running_loop()
        old_umask = os.umask(0o777 & ~self.socket_mode)
        try:
            unix = await loop.create_unix_server(
                lambda: _FrameConnection(self), path=str(self.socket_path)
            )
        finally:
            os.umask(old_umask)
        os.chmod(self.socket_path, self.socket_mode)
        self._servers.append(unix)
        if self.tcp_listen is not None:
            host, port = self.tcp_listen
            factory: type[_FrameConnection | _Handshake] = (
                _FrameConnection if self.tls is None else _Handshake
            )
            self._servers.append(await loop.create_server(lambda: factory(self), host, port))

    async def stop(self) -> None:
        """Stop accepting connections, answer what is being processed, close the rest."""
        self.accepting = False
        for server in self._servers:
            server.close()
        for handshake in list(self._handshakes):
            handshake.cancel()
        await asyncio.gather(*self._handshakes, return_exceptions=True)
        await asyncio.gather(*(connection.finish() for connection in list(self._connections)))
        for task in list(self._http_tasks):
            task.cancel()
        await asyncio.gather(*self._http_tasks, return_exceptions=True)
        for server in self._servers:
            await server.wait_closed()
        self.executor.shutdown(wait=True)
        self.socket_path.unlink(missing_ok=True)

    # ---- TLS and tokens ---------------------------------------------------------------

    def start_tls(self, transport: asyncio.Transport, handshake: _Handshake) -> None:
        task = asyncio.get_running_loop().create_task(self._handshake(transport, handshake))
        self._handshakes.add(task)
        task.add_done_callback(self._handshakes.discard)

    async def _handshake(self, transport: asyncio.Transport, handshake: _Handshake) -> None:
        """Serve the connection once its TLS handshake succeeded; count and log a failure."""
        assert self.tls is not None
        address = _address(transport)
        try:
            secure = await asyncio.get_running_loop().start_tls(
                transport,
                handshake,
                self.tls,
                server_side=True,
                ssl_handshake_timeout=self.frame_timeout_s,
            )
        except OSError as exc:  # ssl.SSLError, a reset, the handshake timeout
            self.tls_handshake_failures += 1
            reason = getattr(exc, "reason", None) or type(exc).__name__
            hint = " (a client without TLS?)" if reason in _NOT_TLS else ""
            self.log_refusal(address, f"TLS handshake failed: {openssl_text(exc)}{hint}", reason)
            transport.close()
            return
        if secure is None:  # closed before the handshake ended: a probe, not a client
            return
        handshake.hand_over(secure, _FrameConnection(self))

    def log_refusal(self, address: str, message: str, reason: str) -> None:
        """One warning per client host and reason, not one per connection of a client
        that keeps trying."""
        host = address.rpartition(":")[0] or address
        if (host, reason) in self._refusals_logged:
            return
        if len(self._refusals_logged) < _REFUSALS_LOGGED_MAX:
            self._refusals_logged.add((host, reason))
            log.warning("TCP client %s refused: %s", address, message)

    def authenticate(self, peer: Peer, token: bytes | None) -> Peer | None:
        """The peer with its token's digest when one of the rules knows the token; None,
        counted and logged, when there is none or no rule knows it."""
        if token is not None:
            digest = token_digest(token)
            if self.peer_rules.knows(digest):
                return dataclasses.replace(peer, token_digest=digest)
        self.auth_failures += 1
        reason = "no token" if token is None else "unknown token"
        self.log_refusal(peer.address or "?", f"{reason}; this agent takes a token first", reason)
        return None

    def serve_http(
        self,
        first: bytes,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        client: str,
        peer: _HttpPeer,
    ) -> None:
        """Serve a connection whose first bytes were an HTTP request, in a task of its own."""
        handlers = HttpHandlers(
            send=peer.send,
            metrics=self.metrics,
            health=self.health,
            exchanges=self.list_exchanges,
            exchange=self.get_exchange,
            declare=self.declare_exchange,
            delete=self.delete_exchange,
            authenticate=peer.authenticate if peer.needs_token else None,
        )
        task = asyncio.get_running_loop().create_task(
            self._serve_http(first, reader, writer, handlers, client)
        )
        self._http_tasks.add(task)
        task.add_done_callback(self._http_tasks.discard)

    async def _serve_http(
        self,
        first: bytes,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        handlers: HttpHandlers,
        client: str,
    ) -> None:
        try:
            await serve_http(
                first,
                reader,
                writer,
                handlers,
                max_body=self.max_frame,
                request_timeout_s=self.frame_timeout_s,
            )
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        except Exception:
            log.exception("connection failed; closing it")
        finally:
            self.quotas.forget(client)
            writer.close()

    # ---- requests of the binary protocol ------------------------------------------------

    def answer_now(self, frame: Frame) -> bytes | None:
        """The answer of a request that never waits; None when it must go to the pool."""
        frame_type = frame.type
        if frame_type is FrameType.PING:
            return encode_frame(FrameType.PONG, frame.request_id, frame.body)
        if frame_type is FrameType.STATS:
            body = json.dumps(self.stats()).encode()
            return encode_frame(FrameType.STATS_RESULT, frame.request_id, body)
        self.protocol_errors += 1
        if frame_type is FrameType.AUTH:
            return encode_error(
                frame.request_id,
                Status.MALFORMED,
                "AUTH is taken only as the first frame of a TCP connection, when the "
                "agent's [[access]] rules have tokens",
            )
        return encode_error(
            frame.request_id, Status.MALFORMED, f"{frame_type.name} is not a request"
        )

    def queue_of(self, frame: Frame) -> str | None:
        """Which pool queue a SEND or PUBLISH waits in; None when it is answered at once.

        Requests that may wait (for an `fsync` or a `block` topic, or an exchange that
        reaches one) are queued per topic or exchange.
        """
        name = _target_name(frame.body)
        if name is None:
            return None  # undecodable: refused at once
        if frame.type is FrameType.SEND:
            waits = self._topic_waits.get(name)
            if waits is None:
                waits = self._topic_may_wait(name)
                if len(self._topic_waits) < _TOPIC_CACHE_MAX:
                    self._topic_waits[name] = waits
            return f"topic {name}" if waits else None
        try:
            topics = self.spool.exchange(name).exchange.topics()
        except UnknownExchangeError:
            return None  # refused at once
        if any(self._topic_may_wait(topic) for topic in topics):
            return f"exchange {name}"
        return None

    def _topic_may_wait(self, topic: str) -> bool:
        queue = self.spool.settings.for_topic(topic)
        return queue.durability is not Durability.PROCESS or queue.full_policy is FullPolicy.BLOCK

    def spool_request(self, frame: Frame) -> _Answer:
        """Spool a SEND or PUBLISH; its answer, whatever happens to its events."""
        if frame.type is FrameType.SEND and self.accepting:
            compiled = intake_send(self.spool, frame.request_id, frame.body, self._send_one)
            if compiled is not None:
                return compiled
        try:
            request = (
                decode_send(frame.body)
                if frame.type is FrameType.SEND
                else decode_publish(frame.body)
            )
        except ProtocolError as exc:
            self.protocol_errors += 1
            return encode_error(frame.request_id, Status.MALFORMED, str(exc)), 0
        results = self.results(request)
        return encode_send_result(frame.request_id, results), _accepted_bytes(request, results)

    def _send_one(self, topic: str, value: bytes | None, key: bytes | None) -> tuple[int, bytes]:
        """The compiled intake's fallback: the Python policy for one event."""
        try:
            event_id = self.spool.send(topic, value, key)
        except Exception as exc:
            result = _failure(exc, f"topic {topic!r}")
            return result.status, encode_text(result.text)
        return Status.OK, event_id.encode()

    def results(self, request: SendRequest | PublishRequest) -> list[EventResult]:
        """Each event's outcome: spooled, or refused because the agent is stopping."""
        if not self.accepting:
            return [EventResult(Status.SHUTTING_DOWN, "agent is shutting down")] * len(
                request.events
            )
        return self._send_all(request)

    async def send(
        self, request: SendRequest | PublishRequest, client: str, grant: Grant | None = None
    ) -> list[EventResult]:
        """Spool an HTTP request's events, off the event loop when they may wait.

        A client or topic over its quota gets its answer late, never a refusal. Topic
        quotas apply to SEND; a PUBLISH counts against the client's quota only.
        """
        exchange = isinstance(request, PublishRequest)
        name = request.exchange if isinstance(request, PublishRequest) else request.topic
        refusal = self.refusal(name, exchange=exchange, grant=grant)
        if refusal is not None:
            results = [EventResult(Status.FORBIDDEN, refusal)] * len(request.events)
        elif self._may_send_inline(request):
            results = self.results(request)
        else:
            loop = asyncio.get_running_loop()
            results = await loop.run_in_executor(self.executor, self.results, request)
        if self.quotas.enabled:
            topic = request.topic if isinstance(request, SendRequest) else None
            delay = self.quotas.record(client, topic, _accepted_bytes(request, results))
            if delay > 0:
                await asyncio.sleep(delay)
        return results

    def refusal(self, name: str, *, exchange: bool, grant: Grant | None) -> str | None:
        """Why a send to `name` is forbidden: not allowed on the agent, or not to this peer."""
        if self.allow.active:
            refusal = self.allow.refusal(name, exchange=exchange)
            if refusal is not None:
                return refusal
        if grant is None:
            return None
        refusal = grant.refusal(name, exchange=exchange)
        if refusal is not None:
            self.peer_rules.refused(grant)
            if grant.logged(name):
                log.info("access refused: %s", refusal)
        return refusal

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
                "forbidden_requests": self.allow.refused,
                "tls_handshake_failures": self.tls_handshake_failures,
                "auth_failures": self.auth_failures,
            },
            lambda: {
                "access_refusals": (
                    "Requests an [[access]] rule refused, by the rules that matched the peer "
                    "((none): no rule did).",
                    "rule",
                    dict(self.peer_rules.refusals),
                )
            },
        )

    def health(self) -> dict[str, object]:
        """`ok`, or why not: stopping, or queues that hold events and do not advance (a
        wedge is never "ok", whatever the broker connection says)."""
        sender = self.spool.sender
        stalled = sender.stalled_queues() if sender else []
        status = "stopping" if not self.accepting else "stalled" if stalled else "ok"
        if sender is None and self.accepting:
            status = "spool_only"
        health: dict[str, object] = {
            "status": status,
            "broker_connected": bool(sender and sender.connected),
        }
        if sender is None:
            health["reason"] = (
                "no [kafka] bootstrap_servers: events are spooled and never sent to Kafka"
            )
        if stalled:
            health["reason"] = (
                f"{len(stalled)} queue(s) hold events and have not advanced for "
                f"{min(q.stalled_s for q in stalled):.0f} s or more; last error: "
                f"{sender.counters.last_error if sender else None}"
            )
            health["stalled"] = [asdict(queue) for queue in stalled]
        return health

    def _send_all(self, request: SendRequest | PublishRequest) -> list[EventResult]:
        """Spool every event of one request, each with its own status."""
        send = self.spool.send
        results = []
        if isinstance(request, SendRequest):
            topic = request.topic
            for event in request.events:
                try:
                    event_id = send(
                        topic, event.value, event.key, event.headers, event_id=event.event_id
                    )
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
                    event_id=event.event_id,
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
        return await loop.run_in_executor(self.executor, self.spool.declare_exchange, exchange)

    async def delete_exchange(self, name: str) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self.executor, self.spool.delete_exchange, name)


def exchange_json(info: ExchangeInfo) -> dict[str, object]:
    """An exchange as STATS and the HTTP interface show it: declaration, source, counters."""
    return {
        **info.exchange.to_json(),
        "source": info.source.value,
        "routed": info.counts.routed,
        "unroutable_alternate": info.counts.alternate,
        "unroutable_refused": info.counts.refused,
    }


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
    status = status_for(exc)
    if status is not None:
        return EventResult(status, str(exc))
    log.exception("send to %s failed", where)
    return EventResult(Status.INTERNAL, f"internal error: {exc}")


_PEER_CREDENTIALS = struct.Struct("3i")


def _client_name(transport: asyncio.BaseTransport, peer: Peer) -> str:
    """Who is on the other end, for quotas: the peer's pid on a unix socket, else its address."""
    return str(peer) if peer.uid is not None else str(transport.get_extra_info("peername"))


def _peer(transport: asyncio.BaseTransport) -> Peer:
    """The kernel's word on who connected (SO_PEERCRED); for a TCP client, its address
    and the common name of its verified certificate."""
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family == socket.AF_UNIX:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEER_CREDENTIALS.size)
        pid, uid, gid = _PEER_CREDENTIALS.unpack(raw)
        return Peer(pid, uid, gid)
    return Peer(
        None, None, None, _address(transport), common_name(transport.get_extra_info("peercert"))
    )


def _address(transport: asyncio.BaseTransport) -> str:
    """host:port of a TCP peer."""
    peername = transport.get_extra_info("peername")
    if isinstance(peername, tuple) and len(peername) >= 2:
        host = str(peername[0])
        return f"[{host}]:{peername[1]}" if ":" in host else f"{host}:{peername[1]}"
    return str(peername)


def _target_name(body: bytes) -> str | None:
    """The topic of a SEND body, or the exchange of a PUBLISH; None if it does not decode."""
    end = 2 + int.from_bytes(body[:2], "big")
    if len(body) < end:
        return None
    try:
        return body[2:end].decode()
    except UnicodeDecodeError:
        return None


def _accepted_bytes(request: SendRequest | PublishRequest, results: list[EventResult]) -> int:
    """The key and value bytes a request spooled: what quotas count."""
    events: list[WireEvent] = (
        request.events
        if isinstance(request, SendRequest)
        else [routed.event for routed in request.events]
    )
    return sum(
        len(event.value or b"") + len(event.key or b"")
        for event, result in zip(events, results, strict=True)
        if result.ok
    )


class _FrameConnection(asyncio.Protocol):
    """One client connection: HTTP (handed to a stream task) or pipelined binary frames."""

    def __init__(self, server: AgentServer) -> None:
        self.server = server
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.client = ""
        self.peer = Peer(None, None, None)
        self.grant: Grant | None = None
        # (frame type, raw name) of SENDs and PUBLISHes this client may make: the allow-list
        # and its grant are fixed for the connection, so each name is judged once.
        self._permitted: set[tuple[FrameType, bytes]] = set()
        # A TCP client of an agent with tokens, until its AUTH is accepted: nothing else is.
        self.unauthenticated = False
        self.decoder = FrameDecoder(server.max_frame)
        self.started = False
        self.closing = False
        self.eof = False
        self.timer: asyncio.TimerHandle | None = None
        self.partial_since = 0.0
        # Requests waiting for the pool, per topic or exchange, the running one first.
        self.queues: dict[str, deque[Frame]] = {}
        self.waiting = 0
        self.paused: set[str] = set()
        self.quota_until = 0.0
        self.drained: asyncio.Future[None] | None = None

    # ---- transport callbacks ----------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport; uvloop's do not derive from asyncio.Transport.
        self.transport = cast(asyncio.Transport, transport)
        self.peer = peer = _peer(self.transport)
        self.client = _client_name(self.transport, peer)
        rules = self.server.peer_rules
        self.unauthenticated = rules.tokens and peer.uid is None
        if not self.unauthenticated:
            self.grant = rules.grant(peer)
        self.server._connections.add(self)
        self.timer = self.loop.call_later(self.server.frame_timeout_s, self._silent)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.server._connections.discard(self)
        self.server.quotas.forget(self.client)
        self._settle_drained()

    def eof_received(self) -> bool:
        """Answer what was asked before the client's EOF, then close."""
        self.eof = True
        return bool(self.waiting)

    def pause_writing(self) -> None:
        self._pause("writing")

    def resume_writing(self) -> None:
        self._resume("writing")

    def data_received(self, data: bytes) -> None:
        transport = self.transport
        assert transport is not None
        if not self.started:
            self.started = True
            if self.timer is not None:
                self.timer.cancel()
                self.timer = None
            if looks_like_http(data):
                self._hand_to_http(transport, data)
                return
        if self.closing:
            return
        try:
            frames = self.decoder.feed(data)
        except ProtocolError as exc:
            self.server.protocol_errors += 1
            self._close_after(encode_error(0, Status.MALFORMED, str(exc)))
            return
        answers = []
        if self.unauthenticated and frames:
            accepted = self._authenticate(frames.pop(0))
            if accepted is None:
                return
            answers.append(accepted)
        for frame in frames:
            answer = self._answer(frame)
            if answer is not None:
                answers.append(answer)
        if answers:
            transport.write(b"".join(answers))
        if self.decoder.buffered:
            if frames or self.timer is None:
                self.partial_since = self.loop.time()
            if self.timer is None:
                self.timer = self.loop.call_later(self.server.frame_timeout_s, self._slow_frame)
        elif self.timer is not None:
            self.timer.cancel()
            self.timer = None

    # ---- requests ---------------------------------------------------------------------

    def _authenticate(self, frame: Frame) -> bytes | None:
        """AUTH_RESULT for an AUTH with a token a rule knows; anything else is refused
        and the connection closed (None)."""
        token = frame.body if frame.type is FrameType.AUTH else None
        peer = self.server.authenticate(self.peer, token)
        if peer is None:
            refusal = (
                f"this agent takes a token first (AUTH), not {frame.type.name}"
                if token is None
                else "the agent knows no such token"
            )
            self._close_after(encode_error(frame.request_id, Status.FORBIDDEN, refusal))
            return None
        self.peer = peer
        self.grant = self.server.peer_rules.grant(peer)
        self.unauthenticated = False
        return encode_frame(FrameType.AUTH_RESULT, frame.request_id, b"")

    def _answer(self, frame: Frame) -> bytes | None:
        """The answer to write now, or None when it comes later (pool, quota delay)."""
        server = self.server
        if frame.type is not FrameType.SEND and frame.type is not FrameType.PUBLISH:
            return server.answer_now(frame)
        server.requests += 1
        if server.allow.active or self.grant is not None:
            body = frame.body
            target = (frame.type, body[2 : 2 + int.from_bytes(body[:2], "big")])
            if target not in self._permitted:
                refusal = self._refusal(frame)
                if refusal is not None:
                    return encode_error(frame.request_id, Status.FORBIDDEN, refusal)
                if len(self._permitted) < _PERMITTED_MAX:
                    self._permitted.add(target)
        queue = server.queue_of(frame)
        if queue is not None:
            self._enqueue(queue, frame)
            return None
        answer, accepted = server.spool_request(frame)
        return self._after_quota(frame, answer, accepted)

    def _refusal(self, frame: Frame) -> str | None:
        """Why this client may not send `frame`; None when it may, or when the body does
        not decode (the decoder's own error follows)."""
        name = _target_name(frame.body)
        if name is None:
            return None
        exchange = frame.type is FrameType.PUBLISH
        return self.server.refusal(name, exchange=exchange, grant=self.grant)

    def _after_quota(self, frame: Frame, answer: bytes, accepted: int) -> bytes | None:
        """A client or topic over its quota gets its answer late and is read no further."""
        quotas = self.server.quotas
        if not quotas.enabled or not accepted:
            return answer
        topic = _target_name(frame.body) if frame.type is FrameType.SEND else None
        delay = quotas.record(self.client, topic, accepted)
        if delay <= 0:
            return answer
        self.loop.call_later(delay, self._write, answer)
        until = self.loop.time() + delay
        if until > self.quota_until:
            self.quota_until = until
            self._pause("quota")
            self.loop.call_at(until, self._quota_over, until)
        return None

    def _quota_over(self, until: float) -> None:
        if until == self.quota_until:
            self._resume("quota")

    def _enqueue(self, queue: str, frame: Frame) -> None:
        self.waiting += 1
        if self.waiting >= _MAX_WAITING_REQUESTS:
            self._pause("backlog")
        waiting = self.queues.get(queue)
        if waiting is not None:
            waiting.append(frame)
            return
        self.queues[queue] = deque((frame,))
        self._run(queue, frame)

    def _run(self, queue: str, frame: Frame) -> None:
        future = self.loop.run_in_executor(self.server.executor, self.server.spool_request, frame)
        future.add_done_callback(functools.partial(self._ran, queue))

    def _ran(self, queue: str, future: asyncio.Future[_Answer]) -> None:
        waiting = self.queues[queue]
        frame = waiting.popleft()
        self.waiting -= 1
        if self.waiting < _MAX_WAITING_REQUESTS // 2:
            self._resume("backlog")
        try:
            answer, accepted = future.result()
        except Exception as exc:
            log.exception("request %d failed", frame.request_id)
            answer, accepted = encode_error(frame.request_id, Status.INTERNAL, str(exc)), 0
        late = self._after_quota(frame, answer, accepted)
        if late is not None:
            self._write(late)
        if waiting and not self.closing:
            self._run(queue, waiting[0])
            return
        del self.queues[queue]
        if not self.queues:
            if self.eof and self.transport is not None:
                self.transport.close()
            self._settle_drained()

    # ---- the connection's state -------------------------------------------------------

    def _write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def _pause(self, reason: str) -> None:
        if not self.paused and self.transport is not None and not self.transport.is_closing():
            self.transport.pause_reading()
        self.paused.add(reason)

    def _resume(self, reason: str) -> None:
        if reason not in self.paused:
            return
        self.paused.discard(reason)
        if not self.paused and self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    def _close_after(self, last: bytes) -> None:
        """Write a last answer and close: the stream can no longer be trusted."""
        self.closing = True
        if self.transport is not None:
            self.transport.write(last)
            self.transport.close()

    def _silent(self) -> None:
        """A connection that never says anything only holds a descriptor."""
        self.timer = None
        if not self.started and self.transport is not None:
            self.closing = True
            self.transport.close()

    def _slow_frame(self) -> None:
        """Close a connection whose frame has been arriving for longer than the timeout."""
        self.timer = None
        if not self.decoder.buffered or self.closing:
            return
        left = self.partial_since + self.server.frame_timeout_s - self.loop.time()
        if left > 0:
            self.timer = self.loop.call_later(left, self._slow_frame)
            return
        self.server.protocol_errors += 1
        self.closing = True
        if self.transport is not None:
            self.transport.close()

    def _hand_to_http(self, transport: asyncio.Transport, first: bytes) -> None:
        self.server._connections.discard(self)
        reader = asyncio.StreamReader(limit=_READ_SIZE, loop=self.loop)
        protocol = asyncio.StreamReaderProtocol(reader, loop=self.loop)
        transport.set_protocol(protocol)
        protocol.connection_made(transport)
        writer = asyncio.StreamWriter(transport, protocol, reader, self.loop)
        peer = _HttpPeer(self.server, self.peer, self.grant, self.client, self.unauthenticated)
        self.server.serve_http(first, reader, writer, self.client, peer)

    async def finish(self) -> None:
        """For the agent's stop: let the requests in the pool be answered, then close."""
        if self.queues and not self.closing:
            self.drained = self.loop.create_future()
            await self.drained
        self.closing = True
        if self.transport is not None:
            self.transport.close()

    def _settle_drained(self) -> None:
        if self.drained is not None and not self.drained.done():
            self.drained.set_result(None)


class _HttpPeer:
    """The client of an HTTP connection: its grant, decided (when the agent takes tokens
    on TCP) by each request's `Authorization: Bearer` token."""

    def __init__(
        self,
        server: AgentServer,
        peer: Peer,
        grant: Grant | None,
        client: str,
        needs_token: bool,
    ) -> None:
        self.server = server
        self.peer = peer
        self.grant = grant
        self.client = client
        self.needs_token = needs_token

    async def send(self, request: SendRequest | PublishRequest) -> list[EventResult]:
        return await self.server.send(request, self.client, self.grant)

    def authenticate(self, authorization: bytes | None) -> bool:
        """Whether the request's Authorization header holds a token a rule knows; the
        grant is that token's from here on."""
        scheme, _, token = (authorization or b"").partition(b" ")
        token = token.strip()
        peer = self.server.authenticate(
            self.peer, token if scheme.lower() == b"bearer" and token else None
        )
        if peer is None:
            return False
        if self.grant is None or peer.token_digest != self.peer.token_digest:
            self.grant = self.server.peer_rules.grant(peer)
        self.peer = peer
        return True


class _Handshake(asyncio.Protocol):
    """A connection of the TLS listener until its handshake is over, then handed to its
    _FrameConnection with whatever arrived in between (the client may send its first
    frame in the same flight as the end of its handshake)."""

    def __init__(self, server: AgentServer) -> None:
        self.server = server
        self.early = bytearray()
        self.eof = False
        self.lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        stream = cast(asyncio.Transport, transport)
        stream.pause_reading()  # the handshake reads from here on
        self.server.start_tls(stream, self)

    def data_received(self, data: bytes) -> None:
        self.early += data

    def eof_received(self) -> bool:
        self.eof = True
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True

    def hand_over(self, transport: asyncio.Transport, connection: _FrameConnection) -> None:
        transport.set_protocol(connection)
        connection.connection_made(transport)
        if self.early:
            connection.data_received(bytes(self.early))
        if self.lost:
            connection.connection_lost(None)
        elif self.eof and not connection.eof_received():
            transport.close()
