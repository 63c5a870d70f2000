"""The HTTP/1.1 JSON interface, on the same socket as the binary protocol.

So any language with an HTTP client (or `curl --unix-socket`) can send events:

    POST /v1/topics/{topic}   {"value": "...", "key": "...", "headers": {"h": "v"},
                               "event_id": "<the caller's own UUID, optional>"}
                              or {"events": [ ...those objects... ]}
                              `value_b64` / `key_b64` carry bytes that are not UTF-8 text;
                              "value": null is a tombstone
    POST   /v1/exchanges/{name}  the same event objects, each with a "routing_key"
    PUT    /v1/exchanges/{name}  declare (create or replace) an exchange at runtime:
                                 {"type": "topic", "bindings": [{"topic": t, "key": k}],
                                  "alternate_topic": t}
    GET    /v1/exchanges[/{name}]  declarations, sources and counters
    DELETE /v1/exchanges/{name}  remove a runtime exchange
    GET  /metrics             Prometheus text format
    GET  /healthz             200 {"status": "ok", "broker_connected": true|false}, or
                              "spool_only" (no bootstrap_servers, with "reason"); 503
                              with "status" "stalled" (and "reason", "stalled") or
                              "stopping"

h11 parses the HTTP; this module only maps requests to the agent. Every event gets its
own result; the response is 200 when all were spooled, else the status of the first
failure (400 bad event, 404 unknown exchange, 413 too large, 422 unroutable, 503 spool
full or shutting down). Where the agent takes tokens (TCP, [[access]] rules with tokens),
a request without a known `Authorization: Bearer` token gets 401 and the connection closes.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import h11

from eventspool.errors import (
    ExchangeConflictError,
    InvalidExchangeError,
    QueueFileError,
    UnknownExchangeError,
)
from eventspool.routing.exchanges import Exchange
from eventspool.wire.protocol import (
    MAX_EVENTS_PER_SEND,
    EventResult,
    PublishRequest,
    RoutedEvent,
    SendRequest,
    Status,
    WireEvent,
)

_READ_SIZE = 64 * 1024
_HTTP_STATUS = {
    Status.OK: 200,
    Status.SPOOL_FULL: 503,
    Status.INVALID_TOPIC: 400,
    Status.TOO_LARGE: 413,
    Status.MALFORMED: 400,
    Status.INTERNAL: 500,
    Status.SHUTTING_DOWN: 503,
    Status.UNKNOWN_EXCHANGE: 404,
    Status.UNROUTABLE: 422,
    Status.NO_SPACE: 507,
    Status.OVER_BUDGET: 507,
    Status.FORBIDDEN: 403,
}
_EVENT_FIELDS = frozenset({"value", "value_b64", "key", "key_b64", "headers", "event_id"})
_ROUTED_EVENT_FIELDS = _EVENT_FIELDS | {"routing_key"}


class BadRequestError(Exception):
    """The request body is not what the interface accepts; answered with 400."""


@dataclass(frozen=True, slots=True)
class HttpHandlers:
    # bound to the connection's client
    send: Callable[[SendRequest | PublishRequest], Awaitable[list[EventResult]]]
    metrics: Callable[[], bytes]
    health: Callable[[], dict[str, object]]
    exchanges: Callable[[], list[dict[str, object]]]
    exchange: Callable[[str], dict[str, object]]  # raises UnknownExchangeError
    declare: Callable[[Exchange], Awaitable[bool]]  # True: created
    delete: Callable[[str], Awaitable[None]]
    # The Authorization header's value (None: absent) -> accepted; None: nothing to check.
    authenticate: Callable[[bytes | None], bool] | None = None


def looks_like_http(first: bytes) -> bool:
    """Binary frames start with a length whose first byte is 0 below 16 MiB; HTTP with a verb."""
    return first[:1].isalpha()


async def serve_http(
    first: bytes,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    handlers: HttpHandlers,
    *,
    max_body: int,
    request_timeout_s: float,
) -> None:
    connection = h11.Connection(h11.SERVER, max_incomplete_event_size=16 * 1024)
    connection.receive_data(first)
    request: h11.Request | None = None
    body = bytearray()
    started = time.monotonic()
    while True:
        try:
            event = connection.next_event()
        except h11.RemoteProtocolError as exc:
            await _reply_error(writer, connection, exc.error_status_hint, str(exc))
            return
        if event is h11.NEED_DATA:
            remaining = started + request_timeout_s - time.monotonic()
            try:
                data = await asyncio.wait_for(reader.read(_READ_SIZE), max(remaining, 0.0))
            except TimeoutError:
                return
            connection.receive_data(data)
            continue
        if isinstance(event, h11.Request):
            request, body, started = event, bytearray(), time.monotonic()
            if handlers.authenticate is not None and not handlers.authenticate(
                _header(request, b"authorization")
            ):
                await _reply_error(
                    writer,
                    connection,
                    401,
                    "this agent takes a token: send Authorization: Bearer <token>",
                    [(b"www-authenticate", b"Bearer")],
                )
                return
        elif isinstance(event, h11.Data):
            body += event.data
            if len(body) > max_body:
                await _reply_error(writer, connection, 413, f"body over {max_body} bytes")
                return
        elif isinstance(event, h11.EndOfMessage) and request is not None:
            status, content_type, payload = await _route(request, bytes(body), handlers)
            await _reply(writer, connection, status, content_type, payload)
            if connection.our_state is h11.MUST_CLOSE:
                return
            connection.start_next_cycle()
            request = None
        elif isinstance(event, h11.ConnectionClosed) or event is h11.PAUSED:
            return


def _header(request: h11.Request, name: bytes) -> bytes | None:
    """The value of a header; h11 gives names in lower case."""
    return next((value for key, value in request.headers if key == name), None)


async def _route(
    request: h11.Request, body: bytes, handlers: HttpHandlers
) -> tuple[int, bytes, bytes]:
    method = request.method.decode()
    path = request.target.decode().split("?", 1)[0]
    if path == "/metrics" and method == "GET":
        return 200, b"text/plain; version=0.0.4; charset=utf-8", handlers.metrics()
    if path == "/healthz" and method == "GET":
        health = handlers.health()
        code = 200 if health.get("status") in ("ok", "spool_only") else 503
        return code, b"application/json", json.dumps(health).encode()
    if path.startswith("/v1/topics/"):
        if method != "POST":
            return _json(405, {"error": f"{method} not allowed; use POST"})
        topic = path.removeprefix("/v1/topics/")
        try:
            events = [parse_event(item, index) for index, item in _event_items(body)]
        except BadRequestError as exc:
            return _json(400, {"error": str(exc)})
        return _results(await handlers.send(SendRequest(topic, events)))
    if path == "/v1/exchanges":
        if method != "GET":
            return _json(405, {"error": f"{method} not allowed; use GET"})
        return _json(200, {"exchanges": handlers.exchanges()})
    if path.startswith("/v1/exchanges/"):
        return await _route_exchange(method, path.removeprefix("/v1/exchanges/"), body, handlers)
    return _json(404, {"error": f"no such endpoint: {method} {path}"})


async def _route_exchange(
    method: str, name: str, body: bytes, handlers: HttpHandlers
) -> tuple[int, bytes, bytes]:
    try:
        if method == "POST":
            try:
                items = _event_items(body)
                events = [
                    RoutedEvent(_routing_key(item, index), parse_event(item, index, routed=True))
                    for index, item in items
                ]
            except BadRequestError as exc:
                return _json(400, {"error": str(exc)})
            return _results(await handlers.send(PublishRequest(name, events)))
        if method == "GET":
            return _json(200, handlers.exchange(name))
        if method == "PUT":
            try:
                document = json.loads(body)
            except (ValueError, RecursionError) as exc:
                return _json(400, {"error": f"body is not JSON this agent accepts: {exc}"})
            created = await handlers.declare(Exchange.from_json(name, document))
            return _json(201 if created else 200, handlers.exchange(name))
        if method == "DELETE":
            await handlers.delete(name)
            return _json(200, {"deleted": name})
    except UnknownExchangeError as exc:
        return _json(404, {"error": str(exc)})
    except InvalidExchangeError as exc:
        return _json(400, {"error": str(exc)})
    except ExchangeConflictError as exc:
        return _json(409, {"error": str(exc)})
    except QueueFileError as exc:
        return _json(500, {"error": str(exc)})
    return _json(405, {"error": f"{method} not allowed; use POST, GET, PUT or DELETE"})


def _results(results: list[EventResult]) -> tuple[int, bytes, bytes]:
    """One entry per event; the HTTP status of the first failure, or 200."""
    failures = [r for r in results if r.status is not Status.OK]
    status = _HTTP_STATUS[failures[0].status] if failures else 200
    return _json(
        status,
        {
            "results": [
                {"status": r.status.name.lower(), "event_id": r.text}
                if r.ok
                else {"status": r.status.name.lower(), "error": r.text}
                for r in results
            ]
        },
    )


def _event_items(body: bytes) -> list[tuple[int, Any]]:
    """The event objects of a body: one object, or {"events": [...]}; numbered."""
    try:
        document = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise BadRequestError(f"body is not JSON this agent accepts: {exc}") from None
    items = document.get("events") if isinstance(document, dict) and "events" in document else None
    if items is None:
        items = [document]
    if not isinstance(items, list) or not items:
        raise BadRequestError('"events" must be a non-empty list of event objects')
    if len(items) > MAX_EVENTS_PER_SEND:
        raise BadRequestError(f"{len(items)} events; at most {MAX_EVENTS_PER_SEND} per request")
    return list(enumerate(items))


def _routing_key(item: Any, index: int) -> str:
    routing_key = item.get("routing_key", "") if isinstance(item, dict) else ""
    if not isinstance(routing_key, str):
        raise BadRequestError(f"event {index}: routing_key must be a string")
    return routing_key


def parse_event(item: Any, index: int, *, routed: bool = False) -> WireEvent:
    """One event object of the JSON interface (HTTP bodies, `eventspool send --json`):
    value and key are text (or base64 in `value_b64`, `key_b64`), headers an object of
    strings. Anything else is a BadRequestError, never a repr sent as the value."""
    if not isinstance(item, dict):
        raise BadRequestError(f"event {index} is not a JSON object")
    unknown = set(item) - (_ROUTED_EVENT_FIELDS if routed else _EVENT_FIELDS)
    if unknown:
        raise BadRequestError(f"event {index} has unknown fields: {', '.join(sorted(unknown))}")
    value = _bytes_field(item, "value", index)
    key = _bytes_field(item, "key", index)
    event_id = item.get("event_id")
    if event_id is not None and not isinstance(event_id, str):
        raise BadRequestError(f"event {index}: event_id must be a string (a UUID)")
    headers = item.get("headers")
    if headers is None:
        return WireEvent(value, key, None, event_id)
    if not isinstance(headers, dict) or not all(
        isinstance(v, str | None) for v in headers.values()
    ):
        raise BadRequestError(f"event {index}: headers must be an object of strings")
    return WireEvent(
        value,
        key,
        [(k, None if v is None else _utf8(v, index)) for k, v in headers.items()],
        event_id,
    )


def _bytes_field(item: dict[str, Any], name: str, index: int) -> bytes | None:
    text, encoded = item.get(name), item.get(f"{name}_b64")
    if text is not None and encoded is not None:
        raise BadRequestError(f"event {index}: give {name} or {name}_b64, not both")
    if encoded is not None:
        if not isinstance(encoded, str):
            raise BadRequestError(f"event {index}: {name}_b64 must be a base64 string")
        try:
            return base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            raise BadRequestError(f"event {index}: {name}_b64 is not valid base64") from None
    if text is None:
        return None
    if not isinstance(text, str):
        raise BadRequestError(f"event {index}: {name} must be a string (or use {name}_b64)")
    return _utf8(text, index)


def _utf8(text: str, index: int) -> bytes:
    try:
        return text.encode()
    except UnicodeEncodeError:
        raise BadRequestError(
            f"event {index}: text with a lone surrogate cannot be UTF-8; use the _b64 form"
        ) from None


def _json(status: int, document: dict[str, object]) -> tuple[int, bytes, bytes]:
    return status, b"application/json", json.dumps(document).encode()


async def _reply(
    writer: asyncio.StreamWriter,
    connection: h11.Connection,
    status: int,
    content_type: bytes,
    payload: bytes,
) -> None:
    headers = [(b"content-type", content_type), (b"content-length", str(len(payload)).encode())]
    writer.write(connection.send(h11.Response(status_code=status, headers=headers)) or b"")
    writer.write(connection.send(h11.Data(data=payload)) or b"")
    writer.write(connection.send(h11.EndOfMessage()) or b"")
    await writer.drain()


async def _reply_error(
    writer: asyncio.StreamWriter,
    connection: h11.Connection,
    status: int,
    message: str,
    extra_headers: list[tuple[bytes, bytes]] | None = None,
) -> None:
    if connection.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
        return
    payload = json.dumps({"error": message}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(payload)).encode()),
        (b"connection", b"close"),
        *(extra_headers or ()),
    ]
    try:
        writer.write(connection.send(h11.Response(status_code=status, headers=headers)) or b"")
        writer.write(connection.send(h11.Data(data=payload)) or b"")
        writer.write(connection.send(h11.EndOfMessage()) or b"")
        await writer.drain()
    except h11.LocalProtocolError:
        return
