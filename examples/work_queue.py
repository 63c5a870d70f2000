"""Work queue: one consumer group, a pool of worker processes sharing its tasks.

Each task is handled by one worker of one member of group `jobs`; start more members
(processes or machines) with the same group to share the load further. Runs against an
embedded broker and exits when every task is done.
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

TASKS = 100
# The embedded broker forms a group in about half the session timeout; keep it short.
QUICK_GROUP = {"session.timeout.ms": 3000, "heartbeat.interval.ms": 300}


def resize_image(done: Path, record: Record) -> None:
    """The task; it runs in a worker process. One O_APPEND write per line, so lines
    from concurrent workers never interleave."""
    time.sleep(0.01)
    fd = os.open(done, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{record.value!r} {os.getpid()}\n".encode())
    finally:
        os.close(fd)


def main() -> None:
    with tempfile.TemporaryDirectory() as work, LocalBroker(work) as broker:
        create_topic(broker.bootstrap_servers, "tasks", partitions=4)
        done = Path(work) / "done"
        with Spool(Path(work) / "spool", bootstrap_servers=broker.bootstrap_servers) as spool:
            for number in range(TASKS):
                spool.send("tasks", f"image-{number}.png".encode(), key=str(number))
            spool.flush(timeout=30)
        jobs = Consumer(
            "jobs",
            ["tasks"],
            functools.partial(resize_image, done),
            workers=4,
            bootstrap_servers=broker.bootstrap_servers,
            settings=ConsumerSettings(kafka=QUICK_GROUP),
        )
        with jobs:
            deadline = time.monotonic() + 60
            while _lines(done) < TASKS and time.monotonic() < deadline:
                time.sleep(0.1)
        pids = {line.split()[-1] for line in done.read_text().splitlines()}
        print(f"{_lines(done)} of {TASKS} tasks done by {len(pids)} worker processes")


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


if __name__ == "__main__":
    main()
