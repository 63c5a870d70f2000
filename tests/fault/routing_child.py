"""A process that publishes through a fanout exchange with a Spool, meant to die by SIGKILL.

Run as ``python -m tests.fault.routing_child LEDGER DIR BOOTSTRAP TOPICS RATE SEED`` from
the repository root (see `tests.fault.children`), TOPICS comma-separated. It opens a
Spool with a sender on DIR and an exchange `fan` bound to every topic, prints
``R <backlog>`` (the unacknowledged events it found), then publishes keyed events at
RATE per second forever. Each id `send()` returned (the event is in every topic's
queue) is appended to LEDGER as ``<event_id> @fan`` after the call, so the parent knows
exactly which events were acknowledged at the kill.
"""

from __future__ import annotations

import os
import random
import sys
import time
from pathlib import Path

from eventspool.pipeline import Spool
from eventspool.routing import Binding, Exchange, ExchangeType
from eventspool.testing.ledger import LedgerWriter
from tests.fault.children import emit

EXCHANGE = "fan"
PARTITIONS = 2
KEY_SPACE = 97
_TICK_S = 0.002


def fanout(topics: list[str]) -> Exchange:
    return Exchange(EXCHANGE, ExchangeType.FANOUT, tuple(Binding(topic) for topic in topics))


def run(
    ledger: LedgerWriter,
    directory: str,
    bootstrap: str,
    topics: list[str],
    *,
    rate: float,
    seed: int,
) -> None:
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
            event_id = spool.send(None, value, key, exchange=EXCHANGE, routing_key="any")
            ledger.append(event_id, f"@{EXCHANGE}")
            counter += 1
        time.sleep(_TICK_S)


def main(argv: list[str]) -> None:
    ledger, directory, bootstrap, topics, rate, seed = argv
    run(
        LedgerWriter(Path(ledger)),
        directory,
        bootstrap,
        topics.split(","),
        rate=float(rate),
        seed=int(seed),
    )


if __name__ == "__main__":
    main(sys.argv[1:])
