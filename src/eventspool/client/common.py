"""What both clients share: where the agent is, the argument checks of `send()` and the
size of an event.

Checking on the caller's side means a bad argument fails its own call, never a batch
written for other callers.
"""

from __future__ import annotations

import os
import ssl
import uuid
from collections.abc import Mapping
from dataclasses import dataclass

from eventspool._core.native import encode_wire_event
from eventspool.agent.protocol import (
    EventResult,
    Frame,
    FrameType,
    Status,
    decode_error,
    encode_frame,
    encode_routed,
)
from eventspool.agent.tls import openssl_text
from eventspool.config import validate_topic
from eventspool.envelope import HeadersInput, caller_event_id, normalize_headers
from eventspool.errors import (
    AgentError,
    EventspoolError,
    EventTooLargeError,
    ForbiddenError,
    InvalidEventError,
    InvalidTopicError,
    SpoolBudgetError,
    SpoolClosedError,
    SpoolFullError,
    UnknownExchangeError,
    UnroutableError,
)
from eventspool.routing.exchanges import validate_routing_key

#: What `send_many()` takes per event: a value, or (value, key), (value, key, headers) or
#: (value, key, headers, event_id).
BatchEvent = (
    bytes
    | None
    | tuple[bytes | None, bytes | str | None]
    | tuple[bytes | None, bytes | str | None, HeadersInput | None]
    | tuple[bytes | None, bytes | str | None, HeadersInput | None, str | uuid.UUID | None]
)
BatchFields = tuple[bytes | None, bytes | str | None, HeadersInput | None, str | uuid.UUID | None]

#: One event's fate in `send_many()`: its event_id, or the error that refused it.
Outcome = str | EventspoolError


def split_batch_event(item: BatchEvent) -> BatchFields:
    """(value, key, headers, event_id) of one `send_many()` event."""
    if isinstance(item, tuple):
        if len(item) == 2:
            return item[0], item[1], None, None
        if len(item) == 3:
            return item[0], item[1], item[2], None
        if len(item) == 4:
            return item
        raise InvalidEventError(
            f"a send_many() event is a value or a (value, key[, headers[, event_id]]) tuple, "
            f"got a tuple of {len(item)}"
        )
    return item, None, None, None


def event_payload(
    topic: str | None,
    value: bytes | None,
    key: bytes | str | None,
    headers: HeadersInput | None,
    event_id: str | uuid.UUID | None = None,
) -> bytes:
    """Check the arguments as `Client.send()` does; the event as a SEND body carries it.

    A key the blocking client cannot encode, and a topic name, are checked here as
    `Spool.send()` checks them: a bad argument must fail its own call, never a batch
    written for other callers. The agent applies the same topic rule, so the error and its
    message are the ones the agent would have sent back. The event is encoded here too,
    so what waits for a frame is one bytes object, not an object per field.
    """
    payload = _payload(value, key, headers, event_id, "topic", topic)
    if type(topic) is not str or topic not in _VALID_TOPICS:
        _check_topic(topic)
    return payload


def _check_topic(topic: str | None) -> None:
    checked = validate_topic(topic)
    if len(_VALID_TOPICS) < _VALID_TOPICS_MAX:
        _VALID_TOPICS.add(checked)


# Topic names already checked: the rule costs more than the rest of a send.
_VALID_TOPICS: set[str] = set()
_VALID_TOPICS_MAX = 1024


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
    if topic is not None:
        raise InvalidEventError(
            f"send() got topic {topic!r} and exchange {exchange!r}: give one of them "
            "(topic=None to route through the exchange)"
        )
    if not isinstance(exchange, str):
        raise InvalidEventError(f"exchange must be a str, got {type(exchange).__name__}")
    validate_routing_key(routing_key)
    assert isinstance(routing_key, str)
    return encode_routed(routing_key, _payload(value, key, headers, event_id, "exchange", exchange))


def _payload(  # noqa: PLR0917  # send()'s own parameters, in its order
    value: bytes | None,
    key: bytes | str | None,
    headers: HeadersInput | None,
    event_id: str | uuid.UUID | None,
    kind: str,
    name: object,
) -> bytes:
    """The event as the wire carries it; `kind` and `name` only make error messages."""
    if value is not None and type(value) is not bytes:
        raise InvalidEventError(f"value must be bytes or None, got {type(value).__name__}")
    raw_key: bytes | None
    if isinstance(key, str):
        try:
            raw_key = key.encode()
        except UnicodeEncodeError as exc:
            raise InvalidEventError(
                f"key for {kind} {name!r} is not encodable as UTF-8: {exc.reason}"
            ) from None
    elif key is None or type(key) is bytes:
        raw_key = key
    else:
        raise InvalidEventError(
            f"key for {kind} {name!r} must be bytes, str or None, got {type(key).__name__}"
        )
    header_list = None if headers is None else normalize_headers(headers)
    checked_id = None if event_id is None else caller_event_id(event_id)
    try:
        return encode_wire_event(value, raw_key, header_list, checked_id)
    except ValueError as exc:  # a size no frame can carry
        raise InvalidEventError(f"event for {kind} {name!r}: {exc}") from None


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
        return Target(text, path=text)
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


_ERRORS: Mapping[Status, type[EventspoolError]] = {
    Status.SPOOL_FULL: SpoolFullError,
    Status.NO_SPACE: SpoolFullError,
    Status.OVER_BUDGET: SpoolBudgetError,
    Status.FORBIDDEN: ForbiddenError,
    Status.INVALID_TOPIC: InvalidTopicError,
    Status.TOO_LARGE: EventTooLargeError,
    Status.MALFORMED: InvalidEventError,
    Status.SHUTTING_DOWN: SpoolClosedError,
    Status.INTERNAL: AgentError,
    Status.UNKNOWN_EXCHANGE: UnknownExchangeError,
    Status.UNROUTABLE: UnroutableError,
}


def error_for(status: Status, text: str) -> EventspoolError:
    """The exception a refused event's status stands for, the same in both clients."""
    return _ERRORS.get(status, AgentError)(text)


def raise_for(result: EventResult) -> str:
    """The event id of an OK result; the matching exception otherwise."""
    if result.status is Status.OK:
        return result.text
    raise error_for(result.status, result.text)
