"""The producing process of `kill_loss.py`: produces as fast as it can until SIGKILLed.

Run as ``python bench/_kill_child.py LANE ACK_LOG CAPACITY BOOTSTRAP TOPIC SPOOL_DIR``.
After every event its application considers acknowledged, the child records the event's
id in ACK_LOG (see `_acklog`), so the parent learns exactly what a kill took away.
Lanes, and what "acknowledged" means in each:

    spool       `Spool.send()` returned (default settings: durability `process`, reject
                when full; a full queue is retried after 1 ms, like BufferError below)
    producer    `Producer.produce()` returned (acks=all, idempotent, lz4); BufferError
                (librdkafka's queue full) is answered by poll(0.01) and a retry
    wait-N      N events produced, then `flush()`, then each one whose delivery report
                carried no error

Before its loop each lane delivers its first event and waits for the broker's
acknowledgement (connections, producer id and metadata are then in place), so the
parent's kill lands while the lane runs at full speed, not during its start-up.

Every value is 100 bytes: the event's sequence number, zero-padded to 12 digits, then
padding. The producer lanes put an `event_id` header (a UUIDv7, as the spool does).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import confluent_kafka

from _acklog import AckLog
from eventspool.envelope import EventIdGenerator
from eventspool.errors import SpoolFullError
from eventspool.pipeline import Spool

PAYLOAD_BYTES = 100
_PADDING = b"." * (PAYLOAD_BYTES - 12)
_POLL_EVERY = 1000
_FULL_RETRY_S = 0.001
_BUFFER_RETRY_S = 0.01
_WARM_UP_TIMEOUT_S = 60.0
WAIT_LANE_PREFIX = "wait-"


def value_of(sequence: int) -> bytes:
    return b"%012d" % sequence + _PADDING


def producer_config(bootstrap: str) -> dict[str, object]:
    """A producer as users configure one for safety; librdkafka's defaults otherwise."""
    return {
        "bootstrap.servers": bootstrap,
        "acks": "all",
        "enable.idempotence": True,
        "compression.type": "lz4",
    }


def warm_up(producer: Any, log: AckLog, ids: EventIdGenerator, topic: str) -> None:
    """Deliver event 0 and wait for it, so the measured loop starts connected."""
    event_id = ids.next_id()
    failures: list[object] = []

    def on_delivery(error: Any, _message: Any) -> None:
        if error is not None:
            failures.append(error)

    producer.produce(topic, value_of(0), headers=[("event_id", event_id)], on_delivery=on_delivery)
    if producer.flush(_WARM_UP_TIMEOUT_S) or failures:
        raise RuntimeError(f"the first event was not delivered: {failures}")
    log.append(event_id)


def run_spool(log: AckLog, bootstrap: str, topic: str, directory: str) -> None:
    spool = Spool(directory, bootstrap)
    send = spool.send
    first = send(topic, value_of(0))
    if spool.flush(_WARM_UP_TIMEOUT_S):
        raise RuntimeError(f"the first event was not acknowledged in {_WARM_UP_TIMEOUT_S} s")
    log.append(first)
    sequence = 1
    while True:
        value = value_of(sequence)
        while True:
            try:
                event_id = send(topic, value)
                break
            except SpoolFullError:
                time.sleep(_FULL_RETRY_S)
        log.append(event_id)
        sequence += 1


def run_producer(log: AckLog, bootstrap: str, topic: str) -> None:
    producer: Any = confluent_kafka.Producer(producer_config(bootstrap))
    produce = producer.produce
    poll = producer.poll
    ids = EventIdGenerator()
    warm_up(producer, log, ids, topic)
    sequence = 1
    countdown = _POLL_EVERY
    while True:
        event_id = ids.next_id()
        value = value_of(sequence)
        while True:
            try:
                produce(topic, value, headers=[("event_id", event_id)])
                break
            except BufferError:
                poll(_BUFFER_RETRY_S)
        log.append(event_id)
        sequence += 1
        countdown -= 1
        if not countdown:
            poll(0)
            countdown = _POLL_EVERY


def run_wait(log: AckLog, bootstrap: str, topic: str, batch: int) -> None:
    producer: Any = confluent_kafka.Producer(producer_config(bootstrap))
    ids = EventIdGenerator()
    delivered: list[str] = []

    def report_for(event_id: str) -> Callable[[Any, Any], None]:
        def on_delivery(error: Any, _message: Any) -> None:
            if error is None:
                delivered.append(event_id)

        return on_delivery

    warm_up(producer, log, ids, topic)
    sequence = 1
    while True:
        for _ in range(batch):
            event_id = ids.next_id()
            producer.produce(
                topic,
                value_of(sequence),
                headers=[("event_id", event_id)],
                on_delivery=report_for(event_id),
            )
            sequence += 1
        producer.flush()
        for event_id in delivered:
            log.append(event_id)
        delivered.clear()


def main(argv: list[str]) -> None:
    lane, log_path, capacity, bootstrap, topic, directory = argv
    log = AckLog(Path(log_path), int(capacity))
    if lane == "spool":
        run_spool(log, bootstrap, topic, directory)
    elif lane == "producer":
        run_producer(log, bootstrap, topic)
    elif lane.startswith(WAIT_LANE_PREFIX):
        run_wait(log, bootstrap, topic, int(lane.removeprefix(WAIT_LANE_PREFIX)))
    else:
        raise SystemExit(f"unknown lane {lane!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
