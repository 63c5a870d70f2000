"""One client connection of the agent: pipelined binary frames, or HTTP handed to a task.

Every read parses all the whole frames it completed; a request that never waits is
answered in the same turn (the answers of one read go out in one write), one that may
wait runs in the thread pool, queued behind the earlier requests for the same topic on
the same connection so their order holds. Reading pauses while the client does not read
its answers, while too many of its requests wait for the pool, and while it is over its
quota. A frame slower than `frame_timeout_s` (a slowloris) closes the connection, and so
does a connection that says nothing for as long. A TCP connection of an agent whose
`[[access]]` rules have tokens must open with an AUTH carrying one of them.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import socket
import struct
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from eventspool.agent.access import Grant, Peer
from eventspool.agent.http import looks_like_http
from eventspool.agent.spooling import Answer, target_name
from eventspool.agent.tls import common_name
from eventspool.wire.protocol import (
    EventResult,
    Frame,
    FrameDecoder,
    FrameType,
    ProtocolError,
    PublishRequest,
    SendRequest,
    Status,
    encode_error,
    encode_frame,
)

if TYPE_CHECKING:
    from eventspool.agent.server import AgentServer

log = logging.getLogger(__name__)

_READ_SIZE = 256 * 1024
# Requests of one connection waiting for the thread pool before its reading pauses.
_MAX_WAITING_REQUESTS = 256
# Names one connection was found permitted to use; beyond it, each request is judged anew.
_PERMITTED_MAX = 1024


@dataclass(frozen=True, slots=True)
class HandedOver:
    """What the unix socket's compiled listener passes on with a connection: the bytes
    from the first frame it left to Python on, its answers not written yet, and whether
    it answered frames before (the bytes are then past where HTTP is told apart)."""

    first: bytes
    unsent: bytes
    answered: bool


class FrameConnection(asyncio.Protocol):
    """One client connection: HTTP (handed to a stream task) or pipelined binary frames."""

    def __init__(self, server: AgentServer, handed: HandedOver | None = None) -> None:
        self.server = server
        self.handed = handed
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
        # Nothing is judged on this client's requests (no access rules, no quotas): its
        # SENDs to topics that never wait are spooled straight from the read.
        self.inline = False
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
        self.inline = self._judged_on_nothing()
        self.server.connections.add(self)
        handed = self.handed
        if handed is None:
            self.timer = self.loop.call_later(self.server.frame_timeout_s, self._silent)
            return
        self.handed = None
        if handed.answered:
            self.started = True
        else:
            self.timer = self.loop.call_later(self.server.frame_timeout_s, self._silent)
        if handed.unsent:
            self.transport.write(handed.unsent)
        self.data_received(handed.first)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.server.connections.discard(self)
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
        answers = []
        if self.inline and not self.decoder.buffered:
            spooled, consumed = self.server.spooler.spool_inline(data, self.server.max_frame)
            if consumed:
                answers.append(spooled)
                data = data[consumed:]
        try:
            frames = self.decoder.feed(data) if data else []
        except ProtocolError as exc:
            self.server.counters.protocol_errors += 1
            self._close_after(encode_error(0, Status.MALFORMED, str(exc)))
            return
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
            transport.write(answers[0] if len(answers) == 1 else b"".join(answers))
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
        self.inline = self._judged_on_nothing()
        return encode_frame(FrameType.AUTH_RESULT, frame.request_id, b"")

    def _judged_on_nothing(self) -> bool:
        return not self.unauthenticated and self.grant is None and not self.server.judges_requests()

    def _answer(self, frame: Frame) -> bytes | None:
        """The answer to write now, or None when it comes later (pool, quota delay)."""
        server = self.server
        if frame.type is not FrameType.SEND and frame.type is not FrameType.PUBLISH:
            return server.answer_now(frame)
        server.counters.requests += 1
        if server.allow.active or self.grant is not None:
            body = frame.body
            target = (frame.type, body[2 : 2 + int.from_bytes(body[:2], "big")])
            if target not in self._permitted:
                refusal = self._refusal(frame)
                if refusal is not None:
                    return encode_error(frame.request_id, Status.FORBIDDEN, refusal)
                if len(self._permitted) < _PERMITTED_MAX:
                    self._permitted.add(target)
        queue = server.spooler.queue_of(frame)
        if queue is not None:
            self._enqueue(queue, frame)
            return None
        answer, accepted = server.spooler.spool_request(frame)
        return self._after_quota(frame, answer, accepted)

    def _refusal(self, frame: Frame) -> str | None:
        """Why this client may not send `frame`; None when it may, or when the body does
        not decode (the decoder's own error follows)."""
        name = target_name(frame.body)
        if name is None:
            return None
        exchange = frame.type is FrameType.PUBLISH
        return self.server.spooler.refusal(name, exchange=exchange, grant=self.grant)

    def _after_quota(self, frame: Frame, answer: bytes, accepted: int) -> bytes | None:
        """A client or topic over its quota gets its answer late and is read no further."""
        quotas = self.server.quotas
        if not quotas.enabled or not accepted:
            return answer
        topic = target_name(frame.body) if frame.type is FrameType.SEND else None
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
        spool_request = self.server.spooler.spool_request
        future = self.loop.run_in_executor(self.server.executor, spool_request, frame)
        future.add_done_callback(functools.partial(self._ran, queue))

    def _ran(self, queue: str, future: asyncio.Future[Answer]) -> None:
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
        self.server.counters.protocol_errors += 1
        self.closing = True
        if self.transport is not None:
            self.transport.close()

    def _hand_to_http(self, transport: asyncio.Transport, first: bytes) -> None:
        self.server.connections.discard(self)
        reader = asyncio.StreamReader(limit=_READ_SIZE, loop=self.loop)
        protocol = asyncio.StreamReaderProtocol(reader, loop=self.loop)
        transport.set_protocol(protocol)
        protocol.connection_made(transport)
        writer = asyncio.StreamWriter(transport, protocol, reader, self.loop)
        peer = HttpPeer(self.server, self.peer, self.grant, self.client, self.unauthenticated)
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


class HttpPeer:
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
        return await self.server.spooler.send(request, self.client, self.grant)

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


class Handshake(asyncio.Protocol):
    """A connection of the TLS listener until its handshake is over, then handed to its
    FrameConnection with whatever arrived in between (the client may send its first
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

    def hand_over(self, transport: asyncio.Transport, connection: FrameConnection) -> None:
        transport.set_protocol(connection)
        connection.connection_made(transport)
        if self.early:
            connection.data_received(bytes(self.early))
        if self.lost:
            connection.connection_lost(None)
        elif self.eof and not connection.eof_received():
            transport.close()


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
        None, None, None, peer_address(transport), common_name(transport.get_extra_info("peercert"))
    )


def peer_address(transport: asyncio.BaseTransport) -> str:
    """host:port of a TCP peer."""
    peername = transport.get_extra_info("peername")
    if isinstance(peername, tuple) and len(peername) >= 2:
        host = str(peername[0])
        return f"[{host}]:{peername[1]}" if ":" in host else f"{host}:{peername[1]}"
    return str(peername)
