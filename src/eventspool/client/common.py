"""What both clients share: where the agent is, the greeting, why a connection failed,
and the checks of a routed `send()` (the rest of the checks are `wire.checks`)."""

from __future__ import annotations

import functools
import os
import ssl
import uuid
from dataclasses import dataclass

from eventspool.envelope import HeadersInput
from eventspool.errors import (
    AgentError,
    ForbiddenError,
    InvalidEventError,
)
from eventspool.routing.exchanges import validate_routing_key
from eventspool.wire.checks import one_target, wire_event
from eventspool.wire.protocol import (
    Frame,
    FrameType,
    Status,
    decode_error,
    encode_frame,
    encode_routed,
)
from eventspool.wire.tls import openssl_text


def routed_event_payload(
    topic: str | None,
    value: bytes | None,
    key: bytes | str | None,
    headers: HeadersInput | None,
    event_id: str | uuid.UUID | None = None,
    *,
    exchange: object,
    routing_key: object,
) -> bytes:
    """The checks of `send(exchange=...)`, as `Spool.send()` makes them; the event as a
    PUBLISH body carries it, after its routing key.

    Whether the exchange exists only the agent knows: it answers UNKNOWN_EXCHANGE.
    """
    one_target(topic, exchange)
    if not isinstance(exchange, str):
        raise InvalidEventError(f"exchange must be a str, got {type(exchange).__name__}")
    validate_routing_key(routing_key)
    assert isinstance(routing_key, str)
    payload = wire_event(value, key, headers, event_id, "exchange", exchange)
    return encode_routed(routing_key, payload)


TCP_PREFIX = "tcp://"


@dataclass(frozen=True, slots=True)
class Target:
    """Where the agent listens: a unix socket `path`, or a TCP `host` and `port`, with the
    TLS context and the token a TCP connection uses."""

    text: str  # as the caller wrote it, for messages
    path: str | None = None
    host: str = ""
    port: int = 0
    ssl_context: ssl.SSLContext | None = None
    token: bytes | None = None


def parse_target(
    target: str | os.PathLike[str], ssl_context: ssl.SSLContext | None, token: str | None
) -> Target:
    """A unix socket path, or "tcp://host:port" ("tcp://[::1]:7070" for IPv6).

    Raises ValueError for a TCP address that does not parse, for TLS or a token on a unix
    socket (its file permissions and the kernel's word on the peer decide there), and for
    a token without TLS, which would cross the network in clear.
    """
    text = os.fspath(target)
    if not text.startswith(TCP_PREFIX):
        if ssl_context is not None or token is not None:
            raise ValueError(
                f"{text!r} is a unix socket path: ssl_context and token are for TCP "
                f'targets ("{TCP_PREFIX}host:port")'
            )
        return _unix_target(text)
    host, sep, port = text.removeprefix(TCP_PREFIX).rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f'{text!r}: expected "{TCP_PREFIX}host:port" with a port in 1..65535')
    raw_token = None
    if token is not None:
        if ssl_context is None:
            raise ValueError("a token is sent only over TLS: give ssl_context too")
        if not token:
            raise ValueError("token must not be empty")
        raw_token = token.encode()
    return Target(text, None, host, int(port), ssl_context, raw_token)


@functools.lru_cache(maxsize=64)
def _unix_target(path: str) -> Target:
    """One Target per socket path: a short-lived client builds it anew on every call, and
    building a frozen dataclass cost it 1 us of CPU."""
    return Target(path, path=path)


@dataclass(frozen=True, slots=True)
class Greeting:
    """The first request on a TCP connection, answered before any event is sent: AUTH
    with the token, or else a PING. A refusal then fails the connection, not a send whose
    outcome would be unknown."""

    request_id: int
    asked: FrameType
    expected: FrameType
    frame: bytes

    @classmethod
    def for_target(cls, target: Target, request_id: int) -> Greeting:
        if target.token is not None:
            asked, expected = FrameType.AUTH, FrameType.AUTH_RESULT
        else:
            asked, expected = FrameType.PING, FrameType.PONG
        return cls(
            request_id, asked, expected, encode_frame(asked, request_id, target.token or b"")
        )

    def check(self, answer: Frame, where: str) -> None:
        """Raise ForbiddenError for a refused token, AgentError for any other answer."""
        if answer.type is self.expected and answer.request_id == self.request_id:
            return
        if answer.type is FrameType.ERROR:
            refusal = decode_error(answer.body)
            error = ForbiddenError if refusal.status is Status.FORBIDDEN else AgentError
            raise error(f"{where}: {refusal.text}")
        raise AgentError(f"{where}: a {answer.type.name} frame answered {self.asked.name}")


def greeting_failure(exc: Exception, where: str, *, tls: bool) -> AgentError:
    """What a greeting that broke off means: a hang-up, a TLS failure, a broken frame."""
    if isinstance(exc, ConnectionResetError):  # an end of file, or a reset of unread bytes
        return AgentError(f"{where}: the agent closed the connection at once{_hangup_hint(tls)}")
    if isinstance(exc, ssl.SSLError):
        hint = "; is its listener without TLS?" if exc.reason == "WRONG_VERSION_NUMBER" else ""
        return AgentError(f"{where}: TLS failed: {openssl_text(exc)}{hint}")
    return AgentError(f"{where}: {exc}")


def connect_failure(target: Target, exc: OSError) -> str:
    """Why a connection to the agent failed, and what to do about it."""
    reason = exc.strerror or str(exc) or type(exc).__name__
    if target.path is None:
        return (
            f"cannot connect to the agent at {target.text}: {reason}; is an agent "
            "listening there (its [agent] tcp_listen setting)?"
        )
    where = os.path.abspath(target.path)
    relative = "" if os.path.isabs(target.path) else ", relative to the current folder"
    return (
        f"cannot connect to the agent at {where} (socket path {target.path!r}{relative}): "
        f"{reason}; start one with 'eventspool agent --config agent.toml', or give its "
        "socket path (--socket, or EVENTSPOOL_AGENT_SOCKET)"
    )


def _hangup_hint(tls: bool) -> str:
    """Why an agent may hang up on a new TCP connection without a word."""
    if tls:
        return " (one that asks for client certificates does so without one it trusts)"
    return " (a TLS listener does so to a client without TLS: give ssl_context)"


#: The longest wait between two connection attempts: an agent back from a restart is
#: reached within a second.
MAX_BACKOFF_S = 1.0


def next_backoff(current_s: float, first_s: float) -> float:
    """The wait before the next connection attempt: doubling from `first_s`, at most
    `MAX_BACKOFF_S`."""
    return min(max(current_s * 2, first_s), MAX_BACKOFF_S)
