"""A process that logs through `SpoolHandler` from several threads until it is SIGKILLed.

Run as ``python -m tests.fault.logging_child LEDGER SPOOL_DIR BOOTSTRAP TOPIC THREADS
RECORDS`` from the repository root (see `tests.fault.children`). It prints ``R 0`` once
the handler is set up, then appends ``SEQ TOPIC`` to LEDGER per record whose
`logger.info()` (or `logger.exception()`) returned, after the call (the handler is told
no event id: SEQ names the record), prints ``D UNACKED`` when all RECORDS were logged,
and waits for its end. Each record's fields are derived from its SEQ (see `expected`),
so the parent can tell an intact record from a damaged one.
"""

from __future__ import annotations

import logging
import sys
import threading
from pathlib import Path

from eventspool.logging import SpoolHandler
from eventspool.pipeline import Spool
from eventspool.testing.ledger import LedgerWriter
from tests.fault.children import emit

LOGGER = "fault.logging"
EXCEPTION_EVERY = 1000


def payload(seq: int) -> str:
    return f"{seq:08d}" * (1 + seq % 7)


def expected(seq: int, worker: int) -> dict[str, object]:
    """The fields of record SEQ that do not depend on the moment or the thread id."""
    return {
        "message": f"record {seq} of worker {worker}",
        "level": "ERROR" if seq % EXCEPTION_EVERY == 0 else "INFO",
        "logger": LOGGER,
        "extra": {"seq": seq, "worker": worker, "payload": payload(seq)},
    }


def _log(
    logger: logging.Logger,
    ledger: LedgerWriter,
    topic: str,
    *,
    worker: int,
    workers: int,
    records: int,
) -> None:
    for seq in range(worker, records, workers):
        extra = {"seq": seq, "worker": worker, "payload": payload(seq)}
        if seq % EXCEPTION_EVERY == 0:
            try:
                raise RuntimeError(f"failure {seq}")
            except RuntimeError:
                logger.exception("record %d of worker %d", seq, worker, extra=extra)
        else:
            logger.info("record %d of worker %d", seq, worker, extra=extra)
        ledger.append(str(seq), topic)


def main(argv: list[str]) -> None:
    ledger_path, directory, bootstrap, topic, threads, records = argv
    workers = int(threads)
    ledger = LedgerWriter(Path(ledger_path))
    spool = Spool(directory, bootstrap)
    logger = logging.getLogger(LOGGER)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    logger.addHandler(SpoolHandler(spool, topic, key_attribute="worker"))
    emit("R 0")
    started = [
        threading.Thread(
            target=_log,
            args=(logger, ledger, topic),
            kwargs={"worker": n, "workers": workers, "records": int(records)},
        )
        for n in range(workers)
    ]
    for thread in started:
        thread.start()
    for thread in started:
        thread.join()
    emit(f"D {spool.unacknowledged()}")
    threading.Event().wait()


if __name__ == "__main__":
    main(sys.argv[1:])
