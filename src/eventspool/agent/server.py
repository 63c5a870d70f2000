"""The agent's socket server: its listeners, its lifecycle, and what it reports.

It listens on the unix socket and, when configured, on TCP (with TLS when the address is
not loopback); each accepted connection is a `FrameConnection` (agent/connection.py),
and a request's events are spooled by the `RequestSpooler` (agent/spooling.py). Here
live what a connection asks of the agent as a whole: the answers of PING and STATS,
`/metrics` and `/healthz`, the TLS handshake (within `frame_timeout_s`; a failed one is
counted and logged once per client host and reason), tokens, and the exchanges of the
HTTP interface. Stopping answers what is being processed, then closes the rest.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import socket
import ssl
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path

from eventspool.agent.access import AllowList, Peer, PeerRules, token_digest
from eventspool.agent.connection import FrameConnection, Handshake, HttpPeer, peer_address
from eventspool.agent.counters import AgentCounters
from eventspool.agent.http import HttpHandlers, serve_http
from eventspool.agent.quotas import Quotas
from eventspool.agent.spooling import RequestSpooler
from eventspool.agent.unix_listener import UnixListener
from eventspool.config import DEFAULT_BUSY_POLL_US
from eventspool.metrics import render
from eventspool.pipeline import Spool
from eventspool.routing.exchanges import Exchange
from eventspool.routing.table import ExchangeInfo
from eventspool.wire.protocol import (
    DEFAULT_MAX_FRAME,
    Frame,
    FrameType,
    Status,
    encode_error,
    encode_frame,
)
from eventspool.wire.tls import openssl_text

log = logging.getLogger(__name__)

_SEND_THREADS = 4
# Client hosts and reasons whose refused handshake or token was logged; beyond it, counted only.
_REFUSALS_LOGGED_MAX = 1000
# OpenSSL's reasons when what arrived is no TLS at all.
_NOT_TLS = frozenset({"WRONG_VERSION_NUMBER", "HTTP_REQUEST", "UNKNOWN_PROTOCOL"})


class AgentServer:
    """The agent's listeners, and what all its connections share: the send path, the
    counters, the access rules and quotas."""

    def __init__(
        self,
        spool: Spool,
        socket_path: Path,
        *,
        socket_mode: int = 0o660,
        max_frame: int = DEFAULT_MAX_FRAME,
        frame_timeout_s: float = 30.0,
        busy_poll_us: float = DEFAULT_BUSY_POLL_US,
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
        self.busy_poll_us = busy_poll_us
        self.executor = ThreadPoolExecutor(_SEND_THREADS, thread_name_prefix="eventspool-send")
        self.quotas = quotas or Quotas(None, {})
        self.allow = allow or AllowList(None, None)
        self.peer_rules = peer_rules or PeerRules(())
        self.tcp_listen = tcp_listen
        self.tls = tls
        self.counters = AgentCounters()
        self.spooler = RequestSpooler(
            spool,
            self.executor,
            self.counters,
            quotas=self.quotas,
            allow=self.allow,
            peer_rules=self.peer_rules,
        )
        self.connections: set[FrameConnection] = set()
        self._unix: UnixListener | None = None
        self._servers: list[asyncio.AbstractServer] = []
        self._http_tasks: set[asyncio.Task[None]] = set()
        self._handshakes: set[asyncio.Task[None]] = set()
        self._refusals_logged: set[tuple[str, str]] = set()

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
            "protocol_errors": self.counters.protocol_errors,
            "connections": len(self.connections) + (self._unix.connections if self._unix else 0),
            "budget": asdict(self.spool.budget()),
            "requests": self.counters.requests,
            "throttle_seconds": self.quotas.counters.throttle_seconds,
            "forbidden": self.allow.refused + self.peer_rules.refusals.total(),
            "forbidden_by_rule": dict(self.peer_rules.refusals),
            "tls_handshake_failures": self.counters.tls_handshake_failures,
            "auth_failures": self.counters.auth_failures,
            "exchanges": {
                info.exchange.name: exchange_json(info) for info in self.spool.exchanges()
            },
        }

    async def start(self) -> None:
        """Listen on TCP if configured, then on the socket path (a stale socket file of a
        dead agent is replaced): once the socket file is there, every listener is up."""
        loop = asyncio.get_running_loop()
        if self.tcp_listen is not None:
            host, port = self.tcp_listen
            factory: type[FrameConnection | Handshake] = (
                FrameConnection if self.tls is None else Handshake
            )
            self._servers.append(await loop.create_server(lambda: factory(self), host, port))
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        self.socket_path.unlink(missing_ok=True)
        old_umask = os.umask(0o777 & ~self.socket_mode)
        try:
            if self.judges_nothing():
                self._unix = UnixListener(self, _bound_unix_socket(self.socket_path))
            else:
                unix = await loop.create_unix_server(
                    lambda: FrameConnection(self), path=str(self.socket_path)
                )
                self._servers.append(unix)
        finally:
            os.umask(old_umask)
        os.chmod(self.socket_path, self.socket_mode)
        if self._unix is not None:
            self._unix.start()

    async def serve_unix_on_loop(self, sock: socket.socket) -> None:
        """Serve the bound unix socket on the event loop: the compiled listener's stand-in
        should it fail."""
        unix = await asyncio.get_running_loop().create_unix_server(
            lambda: FrameConnection(self), sock=sock
        )
        self._servers.append(unix)

    def judges_requests(self) -> bool:
        """Whether every request is judged, whoever sends it: an allow-list, or quotas."""
        return self.allow.active or self.quotas.enabled

    def judges_nothing(self) -> bool:
        """No access rules either: no request of a unix client is judged, so the
        compiled listener may serve the socket."""
        return not self.peer_rules.rules and not self.judges_requests()

    async def stop(self) -> None:
        """Stop accepting connections, answer what is being processed, close the rest."""
        self.spooler.accepting = False
        if self._unix is not None:
            await self._unix.stop()
        for server in self._servers:
            server.close()
        for handshake in list(self._handshakes):
            handshake.cancel()
        await asyncio.gather(*self._handshakes, return_exceptions=True)
        await asyncio.gather(*(connection.finish() for connection in list(self.connections)))
        for task in list(self._http_tasks):
            task.cancel()
        await asyncio.gather(*self._http_tasks, return_exceptions=True)
        for server in self._servers:
            await server.wait_closed()
        self.executor.shutdown(wait=True)
        self.socket_path.unlink(missing_ok=True)

    # ---- TLS and tokens ---------------------------------------------------------------

    def start_tls(self, transport: asyncio.Transport, handshake: Handshake) -> None:
        task = asyncio.get_running_loop().create_task(self._handshake(transport, handshake))
        self._handshakes.add(task)
        task.add_done_callback(self._handshakes.discard)

    async def _handshake(self, transport: asyncio.Transport, handshake: Handshake) -> None:
        """Serve the connection once its TLS handshake succeeded; count and log a failure."""
        assert self.tls is not None
        address = peer_address(transport)
        try:
            secure = await asyncio.get_running_loop().start_tls(
                transport,
                handshake,
                self.tls,
                server_side=True,
                ssl_handshake_timeout=self.frame_timeout_s,
            )
        except OSError as exc:  # ssl.SSLError, a reset, the handshake timeout
            self.counters.tls_handshake_failures += 1
            reason = getattr(exc, "reason", None) or type(exc).__name__
            hint = " (a client without TLS?)" if reason in _NOT_TLS else ""
            self.log_refusal(address, f"TLS handshake failed: {openssl_text(exc)}{hint}", reason)
            transport.close()
            return
        if secure is None:  # closed before the handshake ended: a probe, not a client
            return
        handshake.hand_over(secure, FrameConnection(self))

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
        self.counters.auth_failures += 1
        reason = "no token" if token is None else "unknown token"
        self.log_refusal(peer.address or "?", f"{reason}; this agent takes a token first", reason)
        return None

    def serve_http(
        self,
        first: bytes,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        client: str,
        peer: HttpPeer,
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
        self.counters.protocol_errors += 1
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

    def metrics(self) -> bytes:
        counters = self.quotas.counters
        return render(
            self.spool,
            lambda: {
                "protocol_errors": self.counters.protocol_errors,
                "throttled_responses": counters.throttled_responses,
                "throttle_seconds": counters.throttle_seconds,
                "forbidden_requests": self.allow.refused,
                "tls_handshake_failures": self.counters.tls_handshake_failures,
                "auth_failures": self.counters.auth_failures,
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
        status = "stopping" if not self.spooler.accepting else "stalled" if stalled else "ok"
        if sender is None and self.spooler.accepting:
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


def _bound_unix_socket(path: Path) -> socket.socket:
    """A listening unix socket at `path`, for the compiled listener to accept on."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(path))
        sock.listen(socket.SOMAXCONN)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


def exchange_json(info: ExchangeInfo) -> dict[str, object]:
    """An exchange as STATS and the HTTP interface show it: declaration, source, counters."""
    return {
        **info.exchange.to_json(),
        "source": info.source.value,
        "routed": info.counts.routed,
        "unroutable_alternate": info.counts.alternate,
        "unroutable_refused": info.counts.refused,
    }
