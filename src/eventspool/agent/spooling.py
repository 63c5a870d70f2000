"""The agent's send path: a SEND's or PUBLISH's events onto the spool, and their results.

A request to queues that never wait (durability `process`, full policy not `block`) is
spooled on the event loop, through the compiled intake when it is a SEND; one that may
wait goes to the thread pool, queued per topic or exchange. Once a topic is known never
to wait, a read's SENDs to it are spooled straight from the read (`spool_inline`, and the
unix socket's compiled listener). Each event gets its own status; a full disk is logged
once a minute, not once per refused event.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor

from eventspool._core.native import intake_frames, intake_send
from eventspool.agent.access import AllowList, Grant, PeerRules
from eventspool.agent.counters import AgentCounters
from eventspool.agent.quotas import Quotas
from eventspool.config import Durability, FullPolicy
from eventspool.errors import DiskFullError, UnknownExchangeError
from eventspool.pipeline import Spool
from eventspool.wire.protocol import (
    EventResult,
    Frame,
    FrameType,
    ProtocolError,
    PublishRequest,
    SendRequest,
    Status,
    WireEvent,
    decode_publish,
    decode_send,
    encode_error,
    encode_send_result,
    encode_text,
)
from eventspool.wire.status import status_for

log = logging.getLogger(__name__)

_INLINE_MAX_EVENTS = 64
_TOPIC_CACHE_MAX = 10_000

# What a request is answered with, and the key and value bytes it spooled (for quotas).
Answer = tuple[bytes, int]


class RequestSpooler:
    """Spools the events of SEND and PUBLISH requests, for binary frames and HTTP alike."""

    def __init__(
        self,
        spool: Spool,
        executor: ThreadPoolExecutor,
        counters: AgentCounters,
        *,
        quotas: Quotas,
        allow: AllowList,
        peer_rules: PeerRules,
    ) -> None:
        self.spool = spool
        self.executor = executor
        self.counters = counters
        self.quotas = quotas
        self.allow = allow
        self.peer_rules = peer_rules
        self.accepting = True
        # The raw names of topics found never to wait: their SENDs need no judging.
        self.inline_topics: set[bytes] = set()

    def queue_of(self, frame: Frame) -> str | None:
        """Which pool queue a SEND or PUBLISH waits in; None when it is answered at once.

        Requests that may wait (for an `fsync` or a `block` topic, or an exchange that
        reaches one) are queued per topic or exchange.
        """
        body = frame.body
        if frame.type is FrameType.SEND and self.never_waits(
            body[2 : 2 + int.from_bytes(body[:2], "big")]
        ):
            return None
        name = target_name(body)
        if name is None:
            return None  # undecodable: refused at once
        if frame.type is FrameType.SEND:
            return f"topic {name}"
        try:
            topics = self.spool.exchange(name).exchange.topics()
        except UnknownExchangeError:
            return None  # refused at once
        if any(self._topic_may_wait(topic) for topic in topics):
            return f"exchange {name}"
        return None

    def never_waits(self, raw_topic: bytes) -> bool:
        """Whether SENDs to the topic of this raw name are spooled at once (False for a
        name that does not decode); the answer is kept in `inline_topics`."""
        if raw_topic in self.inline_topics:
            return True
        try:
            topic = raw_topic.decode()
        except UnicodeDecodeError:
            return False
        if self._topic_may_wait(topic):
            return False
        if len(self.inline_topics) < _TOPIC_CACHE_MAX:
            self.inline_topics.add(raw_topic)
        return True

    def spool_inline(self, data: bytes, max_frame: int) -> tuple[bytes, int]:
        """Answer the SENDs to topics that never wait and the PINGs that start a read:
        (their answers, the bytes they took). The rest of the read is the caller's,
        frame by frame.

        Only for a connection that nothing is judged on (no access rules, no quotas):
        this skips the decoder, the frame objects and the judging, half of the agent's
        CPU per request (profiled with 16 blocking callers).
        """
        if not self.accepting:
            return b"", 0
        answers, consumed, requests = intake_frames(
            self.spool, data, max_frame, self.inline_topics, self.never_waits, self.send_one
        )
        self.counters.requests += requests
        return answers, consumed

    def _topic_may_wait(self, topic: str) -> bool:
        queue = self.spool.settings.for_topic(topic)
        return queue.durability is not Durability.PROCESS or queue.full_policy is FullPolicy.BLOCK

    def spool_request(self, frame: Frame) -> Answer:
        """Spool a SEND or PUBLISH; its answer, whatever happens to its events."""
        if frame.type is FrameType.SEND and self.accepting:
            compiled = intake_send(self.spool, frame.request_id, frame.body, self.send_one)
            if compiled is not None:
                return compiled
        try:
            request = (
                decode_send(frame.body)
                if frame.type is FrameType.SEND
                else decode_publish(frame.body)
            )
        except ProtocolError as exc:
            self.counters.protocol_errors += 1
            return encode_error(frame.request_id, Status.MALFORMED, str(exc)), 0
        results = self.results(request)
        return encode_send_result(frame.request_id, results), _accepted_bytes(request, results)

    def send_one(self, topic: str, value: bytes | None, key: bytes | None) -> tuple[int, bytes]:
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


def target_name(body: bytes) -> str | None:
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
