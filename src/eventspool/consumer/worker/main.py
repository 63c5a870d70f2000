"""A worker process's entry point: it ignores the signals meant for its parent, resolves
the handler, reads parts' blobs out of its hand-off ring, and runs the loop that suits
the handler."""

from __future__ import annotations

import asyncio
import signal
from multiprocessing.connection import Connection
from typing import Any

from eventspool._core.native import Handoff
from eventspool.consumer.handler import HandlerRef, is_async, resolve_handler
from eventspool.consumer.messages import STARTED, InRing, Parts, SentParts
from eventspool.consumer.scheduler import Ordering
from eventspool.consumer.settings import RetryPolicy
from eventspool.consumer.worker.aio import AsyncWorker
from eventspool.consumer.worker.plain import PlainWorker


class RingPipe:
    """A worker's end of its pipe, which copies the blobs of the parts it receives out
    of the hand-off ring; in the order they were put there, as the ring needs."""

    def __init__(self, conn: Connection, handoff: Handoff) -> None:
        self._conn = conn
        self._handoff = handoff

    def send(self, obj: Any) -> None:
        self._conn.send(obj)

    def recv(self) -> Any:
        message = self._conn.recv()
        if not isinstance(message, SentParts):
            return message
        take = self._handoff.take
        return Parts(
            [
                (part_id, topic, partition, take(*packed), attempts)
                if isinstance(packed, InRing)
                else (part_id, topic, partition, packed, attempts)
                for part_id, topic, partition, packed, attempts in message.parts
            ]
        )


def worker_main(
    conn: Connection,
    handler_ref: HandlerRef,
    ordering: Ordering,
    progress: Any,
    concurrency: int,
    *,
    ring: Any,
    retry: RetryPolicy,
) -> None:
    # The parent decides when in-flight work stops; a terminal's Ctrl-C or a service
    # manager's SIGTERM to the whole group must not cut a handler short behind its back.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    handler = resolve_handler(handler_ref)
    conn.send(STARTED)
    pipe = RingPipe(conn, Handoff(ring))
    if is_async(handler):
        asyncio.run(AsyncWorker(pipe, handler, ordering, concurrency, retry).serve())
    else:
        PlainWorker(pipe, handler, ordering, progress, retry).serve()
