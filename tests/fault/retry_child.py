"""A publisher that retries with its own event ids, meant to die by SIGKILL.

Run as ``python -m tests.fault.retry_child LEDGER DIR BOOTSTRAP TOPICS SEED START COUNT
RATE`` from the repository root (see `tests.fault.children`), TOPICS comma-separated. It
opens a Spool with a sender on DIR and the fanout exchange of `routing_child`, then
publishes events START..COUNT-1 at RATE per second. Event i is the same on every run of
one SEED: the same business body and the same event id, as a producer that replays from
its last checkpoint sends them. After the last event it waits until everything is
acknowledged by Kafka, then until killed.

    stdout  R <backlog>        ready: the spool is open and held <backlog> unacknowledged events
    LEDGER  <event_id> @fan    the publish of that event returned: it is in every topic's queue
    stdout  D <remaining>      all published; <remaining> events were still unacknowledged
                               after 120 s
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
import time
import uuid
from pathlib import Path

from eventspool.demo import business_event
from eventspool.pipeline import Spool
from eventspool.testing.ledger import LedgerWriter
from tests.fault.children import emit
from tests.fault.routing_child import EXCHANGE, PARTITIONS, fanout

_TICK_S = 0.002
_FLUSH_TIMEOUT_S = 120.0


def event_id_of(seed: int, index: int) -> str:
    """Event `index`'s id, the same in every run with `seed`."""
    digest = hashlib.sha256(b"%d:%d" % (seed, index)).digest()
    return str(uuid.UUID(bytes=digest[:16], version=4))


def event_of(seed: int, index: int) -> tuple[bytes, str]:
    """(value, key) of event `index`: a business event the Spark pipeline parses."""
    _, user, body = business_event(random.Random(f"{seed}:{index}"), index)
    return json.dumps(body).encode(), user


def main(argv: list[str]) -> None:
    ledger_path, directory, bootstrap, topic_list, seed_text, start_text, count_text, rate_text = (
        argv
    )
    topics, seed, start = topic_list.split(","), int(seed_text), int(start_text)
    count, rate = int(count_text), float(rate_text)
    ledger = LedgerWriter(Path(ledger_path))
    spool = Spool(directory, bootstrap, exchanges=[fanout(topics)])
    for topic in topics:
        spool.set_partition_count(topic, PARTITIONS)
    emit(f"R {spool.unacknowledged()}")
    began = time.monotonic()
    index = start
    while index < count:
        due = min(count, start + int((time.monotonic() - began) * rate))
        while index < due:
            value, key = event_of(seed, index)
            event_id = spool.send(
                None,
                value,
                key,
                exchange=EXCHANGE,
                routing_key="any",
                event_id=event_id_of(seed, index),
            )
            ledger.append(event_id, f"@{EXCHANGE}")
            index += 1
        time.sleep(_TICK_S)
    emit(f"D {spool.flush(_FLUSH_TIMEOUT_S)}")
    while True:
        time.sleep(60)


if __name__ == "__main__":
    main(sys.argv[1:])
