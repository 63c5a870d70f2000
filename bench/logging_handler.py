"""`logger.info()` through `SpoolHandler` against the same logger with a `logging.FileHandler`.

1. ours: records/s of `logger.info(...)` on a logger whose one handler is a
   `SpoolHandler`: the record is JSON on the spool's memory-mapped ring (durability
   `process`: it survives a SIGKILL) when the call returns. No sender; the spool is
   emptied between passes, untimed.
2. the anchor: the same logger, records and `JsonFormatter` with a `logging.FileHandler`
   writing one JSON line per record to a new file per pass on the same file system. It
   flushes each record to the kernel: as safe against a killed process as ours.
3. The same with `THREADS` threads released together, each logging its share; rate =
   records over the wall time from their release to the last one's end.

Each record is ``logger.info("request %s done in %d ms", REQUEST_ID, MS, extra=...)``
with three extra fields (request id, status, path), about 300 bytes of JSON. The anchor
goes first in every repetition; CPU per record is the process's CPU time over the pass.
Each figure is the median over the repetitions. Goal, reported and not asserted: at
least the FileHandler's rate (ratio >= 1.0).
"""

from __future__ import annotations

import logging
import sys
from functools import partial
from pathlib import Path

from eventspool.config import MIB, QueueSettings, SpoolSettings
from eventspool.logging import JsonFormatter, SpoolHandler
from eventspool.pipeline import Spool
from harness.cli import BenchArgs, bench_main
from harness.figures import figure
from harness.output import progress
from harness.rings import expect_emptied
from harness.runs import Runs
from harness.session import Session
from harness.threads import Together, run_together

TOPIC = "app-logs"
THREADS = 4
CAPACITY_BYTES = 256 * MIB
QUICK_RECORDS = 30_000
FULL_RECORDS = 200_000
WARMUP_RECORDS = 5_000
GOAL_RATIO = 1.0


def log_records(
    logger: logging.Logger, handler: logging.Handler, records: int, threads: int
) -> Together[int]:
    """`records` calls of `logger.info()` through `handler` alone, over `threads` threads."""
    per_thread = records // threads

    def work(worker: int) -> int:
        for n in range(per_thread):
            logger.info(
                "request %s done in %d ms",
                f"req-{worker}-{n}",
                n % 250,
                extra={"request_id": f"req-{worker}-{n}", "status": 200, "path": "/api/orders"},
            )
        return per_thread

    handler.setFormatter(JsonFormatter())
    logger.addHandler(handler)
    try:
        return run_together([partial(work, w) for w in range(threads)])
    finally:
        logger.removeHandler(handler)
        handler.close()


def spool_pass(logger: logging.Logger, spool: Spool, records: int, threads: int) -> Together[int]:
    handler = SpoolHandler(spool, TOPIC)
    result = log_records(logger, handler, records, threads)
    if handler.dropped:
        raise RuntimeError(f"SpoolHandler dropped {handler.dropped} records")
    expect_emptied(spool, sum(result.results))
    return result


def file_pass(logger: logging.Logger, path: Path, records: int, threads: int) -> Together[int]:
    result = log_records(logger, logging.FileHandler(path, encoding="utf-8"), records, threads)
    with path.open("rb") as written:
        lines = sum(1 for _ in written)
    path.unlink()
    if lines != sum(result.results):
        raise RuntimeError(f"logged {sum(result.results)} records but the file has {lines} lines")
    return result


def note(runs: Runs, name: str, result: Together[int]) -> float:
    """Note the pass's rate and CPU per record; its rate."""
    records = sum(result.results)
    runs.add(f"{name}_rate", records / result.seconds)
    runs.add(f"{name}_cpu_us", result.cpu_s * 1e6 / records)
    return records / result.seconds


def run(args: BenchArgs) -> dict[str, object]:
    records = QUICK_RECORDS if args.quick else FULL_RECORDS
    runs = Runs()
    logger = logging.getLogger("bench.logging_handler")
    logger.setLevel(logging.INFO)
    logger.propagate = False
    settings = SpoolSettings(queue=QueueSettings(capacity_bytes=CAPACITY_BYTES))
    with Session(args, "logging") as session:
        progress(
            f"{args.repeats} repetitions of {records:,} records per pass; {session.filesystem}"
        )
        with Spool(session.scratch / "spool", settings=settings) as spool:
            spool.set_partition_count(TOPIC, 1)
            log_file = session.scratch / "app.log"
            file_pass(logger, log_file, WARMUP_RECORDS, 1)
            spool_pass(logger, spool, WARMUP_RECORDS, 1)
            for rep in range(args.repeats):
                for threads, suffix in ((1, ""), (THREADS, "_threads")):
                    anchor = note(
                        runs, f"file{suffix}", file_pass(logger, log_file, records, threads)
                    )
                    ours = note(runs, f"spool{suffix}", spool_pass(logger, spool, records, threads))
                    progress(
                        f"rep {rep + 1}/{args.repeats}, {threads} thread(s): SpoolHandler "
                        f"{ours:,.0f}/s, FileHandler {anchor:,.0f}/s"
                    )
    m = runs.medians()
    headline = figure(
        "logging_handler_rate",
        round(m["spool_rate"]),
        round(m["file_rate"]),
        unit="records/s",
        title="logger.info() through SpoolHandler, 1 thread",
        anchor_is="the same logger with a logging.FileHandler and the same JsonFormatter",
    )
    ratio = headline["ratio"]
    return {
        **headline,
        "figures": [
            figure(
                "logging_handler_rate_4_threads",
                round(m["spool_threads_rate"]),
                round(m["file_threads_rate"]),
                unit="records/s",
                title=f"logger.info() through SpoolHandler, {THREADS} threads",
                anchor_is=f"logging.FileHandler, same formatter, {THREADS} threads",
            ),
            figure(
                "logging_handler_cpu",
                round(m["spool_cpu_us"], 2),
                round(m["file_cpu_us"], 2),
                unit="CPU us per record",
                title="CPU per logger.info() through SpoolHandler, 1 thread",
                anchor_is="logging.FileHandler, same formatter, 1 thread",
                higher_is_better=False,
            ),
        ],
        "goals": {"ratio": GOAL_RATIO, "met": isinstance(ratio, float) and ratio >= GOAL_RATIO},
        "settings": {
            "records_per_pass": records,
            "warmup_records": WARMUP_RECORDS,
            "threads": [1, THREADS],
            "ring_bytes": CAPACITY_BYTES,
            "partitions": 1,
        },
        "runs": runs.listed(),
        **session.provenance(broker=None, packages=()),
    }


if __name__ == "__main__":
    sys.exit(bench_main("logger.info() through SpoolHandler against a logging.FileHandler", run))
