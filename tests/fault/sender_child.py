"""A sending process for the SIGKILL tests, meant to die mid-traffic.

Run as ``python -m tests.fault.sender_child DIR BOOTSTRAP TOPIC PARTITIONS MAX_IN_FLIGHT
RATE SEED`` from the repository root. It opens a Spool with a sender on DIR, then sends
keyed events at RATE per second forever. Each line is one ``os.write`` to the pipe,
written after the call it reports has returned, so the parent knows exactly which
event ids `send()` acknowledged when the kill landed:

    R <backlog>   ready: the spool is open and held <backlog> unacknowledged events
    <event_id>    one `send()` returned this id
"""

from __future__ import annotations

import os
import random
import sys
import time

from eventspool.config import SenderSettings
from eventspool.pipeline import Spool
from tests.fault.children import emit

KEY_SPACE = 97
_TICK_S = 0.005


def run(
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
            emit(spool.send(topic, value, key))
            counter += 1
        time.sleep(_TICK_S)


def main(argv: list[str]) -> None:
    directory, bootstrap, topic, partitions, max_in_flight, rate, seed = argv
    run(
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
