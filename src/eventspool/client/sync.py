"""The blocking client: `Client(socket).send(topic, value, key, headers) -> event_id`.

One Client is meant to be shared by every thread of a process. Its sends are pipelined
over one connection: callers that fire faster than the round trip share frames and
round trips (`client.sync_pipeline` says how), and each caller is woken for its own
answer only. The connection, its TLS and its greeting are `client.sync_connection`'s;
what a call queues and how its answer reaches it, `client.sync_requests`'.

`send_many()` hands a batch for one topic over in one call; `send_async()` returns at
once with a future, for callers that want fire-and-go latency yet learn each outcome.
At most `max_queued` of its events wait for an answer; a call over that waits for its own.

A call checks its arguments and encodes its event (compiled) before queuing it, so a
size the format cannot carry fails its own call, never a frame of other callers' events.

A broken connection fails the requests written on it with AgentError (their outcome is
unknown: the agent may have spooled them before it died); the next call reconnects,
with backoff for as long as `timeout` allows.
"""

from __future__ import annotations

import json
import os
import ssl
import time
import uuid
from collections.abc import Iterable
from typing import Any

from eventspool._core.native import ClientCore
from eventspool.client.common import parse_target, routed_event_payload
from eventspool.client.sync_pipeline import Pipeline
from eventspool.client.sync_requests import Control, Outstanding, Reply, Waiting
from eventspool.config import DEFAULT_BUSY_POLL_US, busy_poll_problem, busy_poll_seconds
from eventspool.envelope import HeadersInput
from eventspool.errors import AgentError, EventspoolError
from eventspool.wire.checks import BatchEvent, Outcome, event_payload, split_batch_event
from eventspool.wire.protocol import DEFAULT_MAX_FRAME, FrameType

__all__ = ["AgentError", "Client"]


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


def _busy_poll_s(microseconds: float) -> float:
    """The pipeline's budget in seconds; a ValueError in the client's words."""
    problem = busy_poll_problem(microseconds)
    if problem:
        raise ValueError(f"busy_poll_us={microseconds}: {problem}")
    return busy_poll_seconds(microseconds)


class Client(ClientCore):
    """A connection to the local agent shared by every thread of a process.

    Its `send()` and `send_async()` are compiled (`ClientCore`); it checks the uncommon
    event here."""

    _checked_payload = staticmethod(_checked_payload)
    _unreachable = AgentError
    # Made by __init__; typed here as this layer knows them.
    _pipeline: Pipeline
    _outstanding: Outstanding

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
        busy_poll_us: float = DEFAULT_BUSY_POLL_US,
    ) -> None:
        """`target`: the agent's unix socket path, or "tcp://host:port" for its TCP
        listener; there `ssl_context` turns TLS on (with a client certificate loaded into
        it where the agent asks for one) and `token` is presented to an agent that takes
        tokens. A `send()` alone on the connection waits for its answer trying for
        `busy_poll_us` before it blocks (0: blocks at once), as the README's agent
        section tells."""
        if timeout <= 0:
            raise ValueError(f"timeout={timeout}: must be positive")
        if max_batch < 1:
            raise ValueError(f"max_batch={max_batch}: must be at least 1")
        if max_queued < 1:
            raise ValueError(f"max_queued={max_queued}: must be at least 1")
        parsed = parse_target(target, ssl_context, token)
        self.target = parsed.text
        self.max_queued = max_queued
        self._outstanding = Outstanding()
        # Positionally: a short-lived client makes one per call, and keywords cost the
        # compiled constructor a dict.
        self._pipeline = Pipeline(
            parsed,
            timeout,
            max_batch,
            reconnect_backoff_s,
            max_frame_bytes,
            _busy_poll_s(busy_poll_us),
        )

    # The pipeline reads these on every use: set on the client, they take effect there.

    @property
    def timeout(self) -> float:
        return self._pipeline.timeout

    @timeout.setter
    def timeout(self, value: float) -> None:
        self._pipeline.timeout = value

    @property
    def max_batch(self) -> int:
        return self._pipeline.max_batch

    @max_batch.setter
    def max_batch(self, value: int) -> None:
        self._pipeline.max_batch = value

    @property
    def max_frame_bytes(self) -> int:
        return self._pipeline.max_frame_bytes

    @max_frame_bytes.setter
    def max_frame_bytes(self, value: int) -> None:
        self._pipeline.max_frame_bytes = value

    @property
    def busy_poll_us(self) -> float:
        return self._pipeline.busy_poll_s * 1e6

    @busy_poll_us.setter
    def busy_poll_us(self, value: float) -> None:
        self._pipeline.busy_poll_s = _busy_poll_s(value)

    @property
    def reconnect_backoff_s(self) -> float:
        return self._pipeline.reconnect_backoff_s

    @reconnect_backoff_s.setter
    def reconnect_backoff_s(self, value: float) -> None:
        self._pipeline.reconnect_backoff_s = value

    def send_many(self, topic: str, events: Iterable[BatchEvent]) -> list[Outcome]:
        """Hand a batch of events for one topic to the agent in one call.

        Each event is a value, or a (value, key), (value, key, headers) or (value, key,
        headers, event_id) tuple. Returns
        each event's outcome in order: its event_id, or the error that refused it (so one
        bad event does not hide the fate of the others). Raises AgentError when the agent
        cannot be reached; InvalidEventError, before anything is sent, for an argument
        the wire cannot carry.
        """
        items: list[Waiting] = []
        batch = list(events)
        reply = Reply(len(batch))
        for index, item in enumerate(batch):
            value, key, headers, event_id = split_batch_event(item)
            payload = event_payload(topic, value, key, headers, event_id)
            items.append(Waiting(topic, None, payload, reply, index))
        if not items:
            return []
        self._pipeline.submit(items)
        self._pipeline.wait(reply)
        outcomes = [outcome for outcome in reply.outcomes if outcome is not None]
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
        self._pipeline.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _control(self, frame_type: FrameType, answer: FrameType) -> bytes:
        control = Control(frame_type, answer)
        self._pipeline.submit([control], control=True)
        self._pipeline.wait(control.reply)
        outcome = control.reply.outcomes[0]
        if isinstance(outcome, EventspoolError):
            raise outcome
        return control.body
