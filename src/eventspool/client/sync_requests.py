"""What a call of the blocking `Client` queues, and how its answer reaches it.

A call encodes its event before queuing it, so a frame is a join of bytes; what waits for
the answer is one object per event (see `EventFuture`), settled by whoever reads the
answers: the reply a caller of `send()` or `send_many()` waits on, or the future of
`send_async()`.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterable
from concurrent.futures import InvalidStateError
from concurrent.futures import wait as futures_wait
from dataclasses import dataclass, field

from eventspool._core.native import InPerson, QueuedCall
from eventspool.client.future import LazyFuture
from eventspool.errors import AgentError, EventspoolError, InvalidEventError
from eventspool.wire.checks import Outcome
from eventspool.wire.protocol import (
    EventResult,
    Frame,
    FrameType,
    ProtocolError,
    Status,
    decode_error,
    encode_publish_payloads,
    encode_send_payloads,
)
from eventspool.wire.status import error_for


class Reply:
    """Where the outcomes of one call go; whoever reads the answers fills it."""

    __slots__ = ("_finished", "_guard", "_left", "_lock", "outcomes")

    def __init__(self, count: int) -> None:
        self.outcomes: list[Outcome | None] = [None] * count
        self._finished = False
        self._left = count
        self._lock = threading.Lock()
        self._lock.acquire()
        # Each slot is set once, but two threads may set two slots of one batch at once.
        self._guard = threading.Lock() if count > 1 else None

    def set(self, index: int, outcome: Outcome) -> None:
        self.outcomes[index] = outcome
        if self._guard is None:
            self._finished = True
            self._lock.release()
            return
        with self._guard:
            self._left -= 1
            if self._left == 0:
                self._finished = True
                self._lock.release()

    def done(self) -> bool:
        return self._finished

    def _wait_done(self, timeout: float) -> bool:
        return self._lock.acquire(timeout=timeout)


class Outstanding:
    """How many `send_async()` events were queued and settled; `itertools.count` steps
    atomically, so callers and readers count without a lock. Queued minus settled is
    roughly how many are unsettled, ample for a bound."""

    __slots__ = ("queued", "settled", "settled_total")

    def __init__(self) -> None:
        self.queued = itertools.count(1)
        self.settled = itertools.count(1)
        self.settled_total = 0


class EventFuture(LazyFuture[str]):
    """The future `send_async()` returns, and the event it stands for while it waits to
    be written and answered: one object per event, where a queue entry, a reply and a
    future would be three for the cyclic collector to track (measured: with 8 callers
    firing, the collector took half of the client's time). What the client keeps on it
    is named as private, as the future is the caller's to hold."""

    def __init__(
        self, topic: str | None, exchange: str | None, payload: bytes, outstanding: Outstanding
    ) -> None:
        LazyFuture.__init__(self)
        self._topic = topic
        self._exchange = exchange
        self._payload = payload
        self._outstanding = outstanding

    def _wait_done(self, timeout: float) -> bool:
        return bool(futures_wait((self,), timeout).done)

    def _settle(self, outcome: Outcome) -> None:
        outstanding = self._outstanding
        outstanding.settled_total = next(outstanding.settled)
        try:
            if isinstance(outcome, str):
                self._finish(outcome, None)
            else:
                self._finish(None, outcome)
        except InvalidStateError:  # cancelled by its caller
            pass


@dataclass(slots=True, eq=False)
class Waiting:
    """One event of `send_many()` queued or written, and the slot of its caller's reply."""

    _topic: str | None  # None: published through `exchange`
    _exchange: str | None
    _payload: bytes  # the event as its SEND (PUBLISH) body carries it
    reply: Reply
    index: int = 0

    def _settle(self, outcome: Outcome) -> None:
        self.reply.set(self.index, outcome)


#: One event on its way: the caller waits in person, or holds its future.
Event = Waiting | EventFuture | InPerson | QueuedCall


@dataclass(slots=True, eq=False)
class Control:
    """A PING or STATS in flight; `body` holds the answer once `reply` is done."""

    type: FrameType
    answer: FrameType
    reply: Reply = field(default_factory=lambda: Reply(1))
    body: bytes = b""


Request = list[Event] | Control


def unframed_error(chunk: list[Event]) -> InvalidEventError:
    """Why no frame carries `chunk`, one target's events, in the protocol's words. The
    compiled encoder (`PipelineCore._frames`) makes every frame that can be made, and
    leaves only these to the client's Python."""
    first = chunk[0]
    payloads = [event._payload for event in chunk]
    try:
        if first._exchange is None:
            assert first._topic is not None
            encode_send_payloads(0, first._topic, payloads)
        else:
            encode_publish_payloads(0, first._exchange, payloads)
    except ProtocolError as exc:
        return InvalidEventError(str(exc))
    raise AssertionError(f"the compiled encoder left {len(chunk)} events the protocol frames")


def settle(request: Request, frame: Frame, where: str) -> None:
    """Hand `frame`, the answer to `request`, to its callers; ProtocolError when it cannot
    answer that request. `where` names the agent in errors. A SEND_RESULT to events does
    not come here: `settle_results` hands it out, compiled (`PipelineCore._answer_all`)."""
    if isinstance(request, Control):
        if frame.type is request.answer:
            request.body = frame.body
            request.reply.set(0, "")
        elif frame.type is FrameType.ERROR:
            text = decode_error(frame.body).text
            request.reply.set(0, AgentError(f"{where}: {text}"))
        else:
            raise ProtocolError(f"a {frame.type.name} frame answered {request.type.name}")
    elif frame.type is FrameType.ERROR:
        error = _outcome(decode_error(frame.body))
        for item in request:
            item._settle(error)
    else:
        raise ProtocolError(f"a {frame.type.name} frame answered a SEND")


def fail(items: Iterable[Event | Control], error: EventspoolError) -> None:
    """Settle requests that will get no answer: never written, or written on a lost
    connection."""
    for item in items:
        if isinstance(item, Control):
            item.reply.set(0, error)
        else:
            item._settle(error)


def refusal_error(result: str | tuple[int, str]) -> EventspoolError:
    """The error of a refused event, from its (status, text) as the compiled decoder gives it."""
    assert not isinstance(result, str)
    status, text = result
    try:
        known = Status(status)
    except ValueError:
        raise ProtocolError(f"SEND_RESULT: unknown status {status}") from None
    return error_for(known, text)


def _outcome(result: EventResult) -> Outcome:
    return result.text if result.status is Status.OK else error_for(result.status, result.text)
