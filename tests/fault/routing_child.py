"""A process that publishes through a fanout exchange with a Spool, meant to die by SIGKILL.

Run as ``python -m tests.fault.routing_child DIR BOOTSTRAP TOPICS RATE SEED`` from the
repository root, TOPICS comma-separated. It opens a Spool with a sender on DIR and an
exchange `fan` bound to every topic, then publishes keyed events at RATE per second
forever. Each line is one ``os.write`` to the pipe, written after the call it reports
returned, so the parent knows exactly which event ids were acknowledged at the kill:

    R <backlog>   ready: the spool is open and held <backlog> unacknowledged events
    <event_id>    one `send()` returned this id: the event is in every topic's queue
"""

from __future__ import annotations

import os
import random
import sys
import time

from eventspool.pipeline import Spool
from eventspool.routing import Binding, Exchange, ExchangeType
from tests.fault.children import emit

EXCHANGE = "fan"
PARTITIONS = 2
KEY_SPACE = 97
_TICK_S = 0.002


def fanout(topics: list[str]) -> Exchange:
    return Exchange(EXCHANGE, ExchangeType.FANOUT, tuple(Binding(topic) for topic in topics))


def run(directory: str, bootstrap: str, topics: list[str], rate: float, seed: int) -> None:
    """Publish until killed; never closes the spool, because a kill is the only way out."""
    rng = random.Random(seed)
    spool = Spool(directory, bootstrap, exchanges=[fanout(topics)])
    for topic in topics:
        spool.set_partition_count(topic, PARTITIONS)
    emit(f"R {spool.unacknowledged()}")
    counter = 0
    started = time.monotonic()
    while True:
        due = int((time.monotonic() - started) * rate)
        while counter < due:
            key = b"key-%d" % rng.randrange(KEY_SPACE)
            value = b"event %d of pid %d " % (counter, os.getpid()) + rng.randbytes(64)
            emit(spool.send(None, value, key, exchange=EXCHANGE, routing_key="any"))
            counter += 1
        time.sleep(_TICK_S)


def main(argv: list[str]) -> None:
    directory, bootstrap, topics, rate, seed = argv
    run(directory, bootstrap, topics.split(","), float(rate), int(seed))


if __name__ == "__main__":
    main(sys.argv[1:])
