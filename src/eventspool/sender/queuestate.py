"""One queue as the sender sees it: what is in flight, its delivery callback, its backoff.

A state lives as long as one producer's view of one queue: a new producer, or a
failover that parks the queue, replaces it, and delivery reports still addressed to
the old state then no longer move the queue (Sender._settled).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from confluent_kafka import KafkaError, Message

from eventspool._core.native import AckTracker, Deliveries
from eventspool.sender.producer import KafkaHeaders
from eventspool.spool.registry import QueueRef

# (sequence, key, value, create time ms, headers); headers None: undecodable payload.
KafkaRecord = tuple[int, bytes | None, bytes | None, int, KafkaHeaders | None]

FailureHandler = Callable[["QueueState", int, KafkaError, Message], None]


class QueueState:
    """One queue as the sender sees it; `deliveries` is its delivery-report callback.

    `waiting_since`: when the oldest event in flight was produced, or the prefix last
    grew. `parked`: its keyless events were moved away and nothing is produced from it
    until its partition is available again; `moved_until` is the ring's end at the move.
    """

    __slots__ = (
        "backoff_s",
        "deliveries",
        "moved_until",
        "parked",
        "partition",
        "ref",
        "retry_at",
        "tracker",
        "waiting_since",
    )

    def __init__(self, ref: QueueRef, partition: int, on_failure: FailureHandler) -> None:
        self.ref = ref
        self.partition = partition
        self.tracker = AckTracker(ref.ring.head_seq)
        self.deliveries = Deliveries(self.tracker, functools.partial(on_failure, self))
        self.retry_at = 0.0
        self.backoff_s = 0.0
        self.waiting_since = 0.0
        self.parked = False
        self.moved_until = 0
