"""The blocking client: `Client(socket).send(topic, value, key, headers) -> event_id`.

Concurrent sends from several threads are batched: the first caller becomes the leader,
writes every waiting event as pipelined SEND frames (one per topic), reads the answers
and hands each caller its own result; the others just wait. One thread pays one round
trip per call; many threads share them.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eventspool.agent.protocol import (
    DEFAULT_MAX_FRAME,
    MAX_EVENTS_PER_SEND,
    EventResult,
    FrameDecoder,
    FrameType,
    ProtocolError,
    RoutedEvent,
    Status,
    WireEvent,
    decode_error,
    decode_send_result,
    encode_frame,
    encode_publish,
    encode_send,
)
from eventspool.client.common import routed_wire_event, wire_event, wire_size
from eventspool.envelope import HeadersInput
from eventspool.errors import (
    EventspoolError,
    EventTooLargeError,
    InvalidEventError,
    InvalidTopicError,
    SpoolClosedError,
    SpoolFullError,
    UnknownExchangeError,
    UnroutableError,
)

_SEND_OVERHEAD = 9 + 2 + 4  # frame header, topic length, event count


class AgentError(EventspoolError):
    """The agent could not be reached, or failed in a way that is not the event's fault."""


_ERRORS: Mapping[Status, type[EventspoolError]] = {
    Status.SPOOL_FULL: SpoolFullError,
    Status.NO_SPACE: SpoolFullError,
    Status.INVALID_TOPIC: InvalidTopicError,
    Status.TOO_LARGE: EventTooLargeError,
    Status.MALFORMED: InvalidEventError,
    Status.SHUTTING_DOWN: SpoolClosedError,
    Status.INTERNAL: AgentError,
    Status.UNKNOWN_EXCHANGE: UnknownExchangeError,
    Status.UNROUTABLE: UnroutableError,
}


def raise_for(result: EventResult) -> str:
    """The event id of an OK result; the matching exception otherwise."""
    if result.status is Status.OK:
        return result.text
    raise _ERRORS.get(result.status, AgentError)(result.text)


@dataclass(slots=True)
class _Waiting:
    topic: str | None  # None: published through `exchange`
    event: WireEvent
    future: Future[str]
    exchange: str | None = None
    routing_key: str = ""


def _encode(request_id: int, chunk: list[_Waiting]) -> bytes:
    """A SEND frame for a chunk of one topic, a PUBLISH frame for one of an exchange."""
    first = chunk[0]
    if first.exchange is None:
        assert first.topic is not None
        return encode_send(request_id, first.topic, [w.event for w in chunk])
    return encode_publish(
        request_id, first.exchange, [RoutedEvent(w.routing_key, w.event) for w in chunk]
    )


class Client:
    def __init__(
        self,
        socket_path: str | os.PathLike[str],
        *,
        timeout: float = 10.0,
        max_batch: int = 1000,
        reconnect_backoff_s: float = 0.05,
        max_frame_bytes: int = DEFAULT_MAX_FRAME,
    ) -> None:
        self.socket_path = Path(socket_path)
        self.max_frame_bytes = max_frame_bytes
        self.timeout = timeout
        self.max_batch = max_batch
        self.reconnect_backoff_s = reconnect_backoff_s
        self._sock: socket.socket | None = None
        self._decoder = FrameDecoder()
        self._lock = threading.Lock()
        self._io = threading.Lock()
        self._waiting: list[_Waiting] = []
        self._request_id = 0
        self._last_stats: dict[str, Any] = {}

    def send(
        self,
        topic: str | None,
        value: bytes | None,
        key: bytes | str | None = None,
        headers: HeadersInput | None = None,
        *,
        exchange: str | None = None,
        routing_key: str = "",
    ) -> str:
        """Hand one event to the agent; returns its event_id once the agent spooled it.

        Raises what `Spool.send()` raises for the event itself, AgentError when the agent
        cannot be reached within `timeout` (the event may or may not have been spooled
        if the connection broke after it was written). With `exchange` (and
        `topic=None`) the agent routes the event by `routing_key`, as `Spool.send()` does.
        """
        if exchange is None:
            waiting = _Waiting(topic, wire_event(topic, value, key, headers), Future())
        else:
            event = routed_wire_event(
                topic, value, key, headers, exchange=exchange, routing_key=routing_key
            )
            waiting = _Waiting(None, event, Future(), exchange, routing_key)
        with self._lock:
            self._waiting.append(waiting)
        while not waiting.future.done():
            if self._io.acquire(timeout=0.001):
                try:
                    if not waiting.future.done():
                        self._flush_waiting()
                finally:
                    self._io.release()
        return waiting.future.result()

    def ping(self) -> float:
        """Round-trip time to the agent in seconds."""
        with self._io:
            started = time.perf_counter()
            request_id = self._next_id()
            self._exchange([(request_id, encode_frame(FrameType.PING, request_id, b""), 0)])
            return time.perf_counter() - started

    def stats(self) -> dict[str, Any]:
        """The agent's STATS answer: queues, sender counters, connectivity."""
        with self._io:
            request_id = self._next_id()
            self._exchange([(request_id, encode_frame(FrameType.STATS, request_id, b""), 0)])
            return self._last_stats

    def close(self) -> None:
        with self._io:
            if self._sock is not None:
                self._sock.close()
                self._sock = None

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _flush_waiting(self) -> None:
        with self._lock:
            batch, self._waiting = self._waiting[: self.max_batch], self._waiting[self.max_batch :]
        if not batch:
            return
        try:
            chunks = self._chunks(batch)
            requests = []
            for chunk in chunks:
                request_id = self._next_id()
                requests.append((request_id, _encode(request_id, chunk), len(chunk)))
            answers = self._exchange(requests)
            for (request_id, _, _), chunk in zip(requests, chunks, strict=True):
                results = answers[request_id]
                if len(results) != len(chunk):
                    raise AgentError(f"the agent answered {len(results)} of {len(chunk)} events")
                for item, result in zip(chunk, results, strict=True):
                    try:
                        item.future.set_result(raise_for(result))
                    except EventspoolError as exc:
                        item.future.set_exception(exc)
        except Exception as exc:
            # Never leave a caller waiting: whatever failed, every open future learns it.
            error = exc if isinstance(exc, AgentError) else AgentError(str(exc))
            for item in batch:
                if not item.future.done():
                    item.future.set_exception(error)

    def _chunks(self, batch: list[_Waiting]) -> list[list[_Waiting]]:
        """One SEND per topic (PUBLISH per exchange), split to stay under the agent's maximum."""
        by_target: dict[tuple[str | None, str | None], list[_Waiting]] = {}
        for item in batch:
            by_target.setdefault((item.topic, item.exchange), []).append(item)
        chunks: list[list[_Waiting]] = []
        budget = self.max_frame_bytes - _SEND_OVERHEAD
        for (topic, exchange), group in by_target.items():
            name = exchange if exchange is not None else topic
            name_size = len(name.encode()) if name is not None else 0
            chunk: list[_Waiting] = []
            size = name_size
            for item in group:
                item_size = wire_size(item.event, None if exchange is None else item.routing_key)
                if chunk and (size + item_size > budget or len(chunk) >= MAX_EVENTS_PER_SEND):
                    chunks.append(chunk)
                    chunk, size = [], name_size
                chunk.append(item)
                size += item_size
            chunks.append(chunk)
        return chunks

    def _next_id(self) -> int:
        """Request ids wrap around but skip 0, the id of connection-level errors."""
        self._request_id = self._request_id % 0xFFFFFFFF + 1
        return self._request_id

    def _exchange(self, requests: Sequence[tuple[int, bytes, int]]) -> dict[int, list[EventResult]]:
        """Write (request id, frame, event count) requests pipelined; read every answer."""
        expected = {request_id: count for request_id, _, count in requests}
        answers: dict[int, list[EventResult]] = {}
        try:
            sock = self._connect()
            sock.sendall(b"".join(frame for _, frame, _ in requests))
            while len(answers) < len(expected):
                data = sock.recv(256 * 1024)
                if not data:
                    raise ConnectionError("the agent closed the connection")
                for frame in self._decoder.feed(data):
                    count = expected.get(frame.request_id)
                    if count is None:
                        if frame.type is FrameType.ERROR:
                            refusal = decode_error(frame.body).text
                            raise ConnectionError(f"the agent refused the request: {refusal}")
                        continue
                    if frame.type is FrameType.SEND_RESULT:
                        answers[frame.request_id] = decode_send_result(frame.body)
                    elif frame.type is FrameType.STATS_RESULT:
                        self._last_stats = json.loads(frame.body)
                        answers[frame.request_id] = []
                    elif frame.type is FrameType.ERROR:
                        answers[frame.request_id] = [decode_error(frame.body)] * count
                    else:
                        answers[frame.request_id] = []
        except (OSError, ProtocolError) as exc:
            self._drop_connection()
            raise AgentError(f"agent at {self.socket_path}: {exc}") from exc
        return answers

    def _connect(self) -> socket.socket:
        if self._sock is not None:
            return self._sock
        deadline = time.monotonic() + self.timeout
        backoff = self.reconnect_backoff_s
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(self.timeout)
            try:
                sock.connect(str(self.socket_path))
            except OSError as exc:
                sock.close()
                if time.monotonic() + backoff > deadline:
                    raise ConnectionError(
                        f"cannot connect to the agent at {self.socket_path}: {exc.strerror}"
                    ) from exc
                time.sleep(backoff)
                backoff = min(backoff * 2, 1.0)
                continue
            self._sock = sock
            self._decoder = FrameDecoder()
            return sock

    def _drop_connection(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
