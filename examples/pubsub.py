"""Publish/subscribe: one consumer group per subscriber, so each sees every event.

`billing` and `shipping` both read all of `orders`, each at its own pace and with its
own committed position. Runs against an embedded broker and exits when both have
every order.
"""

from __future__ import annotations

import functools
import os
import tempfile
import time
from pathlib import Path

from eventspool import Spool
from eventspool.broker import LocalBroker, create_topic
from eventspool.consumer import Consumer, ConsumerSettings, Record

ORDERS = 20
QUICK_GROUP = {"session.timeout.ms": 3000, "heartbeat.interval.ms": 300}


def note(log: Path, record: Record) -> None:
    """Each subscriber's handler; it runs in that subscriber's worker process."""
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (record.value or b"") + b"\n")
    finally:
        os.close(fd)


def main() -> None:
    with tempfile.TemporaryDirectory() as work, LocalBroker(work) as broker:
        create_topic(broker.bootstrap_servers, "orders", partitions=2)
        logs = {name: Path(work) / name for name in ("billing", "shipping")}
        subscribers = [
            Consumer(
                name,  # the group: one per subscriber
                ["orders"],
                functools.partial(note, log),
                workers=1,
                bootstrap_servers=broker.bootstrap_servers,
                settings=ConsumerSettings(kafka=QUICK_GROUP),
            )
            for name, log in logs.items()
        ]
        for subscriber in subscribers:
            subscriber.start()
        with Spool(Path(work) / "spool", bootstrap_servers=broker.bootstrap_servers) as spool:
            for number in range(ORDERS):
                spool.send("orders", f'{{"order": {number}}}'.encode(), key=str(number))
        deadline = time.monotonic() + 60
        while min(map(_lines, logs.values())) < ORDERS and time.monotonic() < deadline:
            time.sleep(0.1)
        for subscriber in subscribers:
            subscriber.stop()
        print(", ".join(f"{name} got {_lines(log)} of {ORDERS}" for name, log in logs.items()))


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


if __name__ == "__main__":
    main()
