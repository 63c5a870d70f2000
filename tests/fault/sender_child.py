"""A sending process for the SIGKILL tests, meant to die mid-traffic.

Run as ``python -m tests.fault.sender_child LEDGER DIR BOOTSTRAP TOPIC PARTITIONS
MAX_IN_FLIGHT RATE SEED`` from the repository root (see `tests.fault.children`). It
opens a Spool with a sender on DIR, prints ``R <backlog>`` (the unacknowledged events it
found), then sends keyed events at RATE per second forever. Each id `send()` returned is
appended to LEDGER as ``<event_id> TOPIC`` after the call, so the parent knows exactly
which events were acknowledged when the kill landed.
"""

from __future__ import annotations

import os
import random
import sys
import time
from pathlib import Path

from eventspool.config import SenderSettings
from eventspool.pipeline import Spool
from eventspool.testing.ledger import LedgerWriter
from tests.fault.children import emit

KEY_SPACE = 97
_TICK_S = 0.005


def run(
    ledger: LedgerWriter,
    directory: str,
    bootstrap: str,
    topic: str,
    *,
    partitions: int,
    max_in_flight: int,
    rate: float,
    seed: int,
) -> None:
    """Send until killed; never closes the spool, because a kill is the only way out."""
    rng = random.Random(seed)
    spool = Spool(
        directory,
        bootstrap,
        sender_settings=SenderSettings(max_in_flight_per_queue=max_in_flight),
    )
    # Known up front, as the partition cache would have it after a first run: the
    # duplicates then come only from the sender's in-flight window, which is what the
    # parent bounds.
    spool.set_partition_count(topic, partitions)
    emit(f"R {spool.unacknowledged()}")
    counter = 0
    started = time.monotonic()
    while True:
        due = int((time.monotonic() - started) * rate)
        while counter < due:
            key = b"key-%d" % rng.randrange(KEY_SPACE)
            value = b"event %d of pid %d " % (counter, os.getpid()) + rng.randbytes(64)
            ledger.append(spool.send(topic, value, key), topic)
            counter += 1
        time.sleep(_TICK_S)


def main(argv: list[str]) -> None:
    ledger, directory, bootstrap, topic, partitions, max_in_flight, rate, seed = argv
    run(
        LedgerWriter(Path(ledger)),
        directory,
        bootstrap,
        topic,
        partitions=int(partitions),
        max_in_flight=int(max_in_flight),
        rate=float(rate),
        seed=int(seed),
    )


if __name__ == "__main__":
    main(sys.argv[1:])
