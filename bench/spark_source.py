"""Records per second read by the Spark source into a count, against a bare confluent-kafka
consumer reading the same records in one process; and the source's Arrow path against
its tuple path.

The workload: N records of 100-byte values with a 9-byte key and an ``event_id`` header
(as the spool writes them), lz4, over 2 partitions of one topic on the embedded broker.
Each figure is the median over the repetitions, after one uncounted read of each kind.

* ours: ``spark.read.format("eventspool-kafka")...load().count()`` on a local Spark
  (``local[2]``), one task per partition. Rate = records / wall time of the count,
  planning included.
* the anchor: one ``confluent_kafka.Consumer``, assigned to every partition from the
  beginning (no group join, as the source), calling ``consume(10000)`` until it has seen
  every record, prefetching as deep as the source's consumers (``queued.min.messages``).
  Rate = records / wall time from assign to the last record.
* arrow vs tuple: the same count with the source's Arrow record batches (the default),
  and with ``arrow=false``, where it yields tuples that Spark converts itself.
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

import confluent_kafka
from confluent_kafka import OFFSET_BEGINNING, TopicPartition
from pyspark.sql import SparkSession

from eventspool.broker.local import create_topic
from eventspool.envelope import EventIdGenerator
from eventspool.spark.kafka import READ_DEFAULTS
from eventspool.spark.session import build_session
from eventspool.spark.source import FORMAT
from harness.cli import BenchArgs, bench_main
from harness.figures import figure
from harness.output import progress
from harness.runs import Runs, safe_ratio
from harness.session import Session

PARTITIONS = 2
PAYLOAD_BYTES = 100
FULL_RECORDS = 1_000_000
QUICK_RECORDS = 100_000
MASTER = "local[2]"
FILL_CONFIG = {"linger.ms": 20, "compression.type": "lz4"}


def fill(bootstrap: str, topic: str, records: int) -> None:
    create_topic(bootstrap, topic, PARTITIONS)
    producer: Any = confluent_kafka.Producer({"bootstrap.servers": bootstrap, **FILL_CONFIG})
    ids = EventIdGenerator()
    value = b"v" * PAYLOAD_BYTES
    for n in range(records):
        while True:
            try:
                producer.produce(
                    topic,
                    value,
                    b"user-%04d" % (n % 10_000),
                    partition=n % PARTITIONS,
                    headers=[("event_id", ids.next_id().encode())],
                )
                break
            except BufferError:
                producer.poll(0.01)
    if producer.flush(120):
        raise RuntimeError("the records were not acknowledged in time")


def read_spark(spark: SparkSession, bootstrap: str, topic: str, arrow: bool) -> tuple[int, float]:
    began = time.perf_counter()
    count = (
        spark.read.format(FORMAT)
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("arrow", str(arrow).lower())
        .load()
        .count()
    )
    return count, time.perf_counter() - began


def read_anchor(bootstrap: str, topic: str, records: int) -> tuple[int, float]:
    consumer: Any = confluent_kafka.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            **READ_DEFAULTS,
        }
    )
    seen = 0
    try:
        began = time.perf_counter()
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        deadline = time.monotonic() + 300
        while seen < records and time.monotonic() < deadline:
            for message in consumer.consume(10_000, 0.5):
                if message.error() is None:
                    seen += 1
        took = time.perf_counter() - began
    finally:
        consumer.close()
    return seen, took


def run(args: BenchArgs) -> dict[str, object]:
    records = QUICK_RECORDS if args.quick else FULL_RECORDS
    runs = Runs()
    with Session(args, "spark") as session:
        bootstrap = session.broker().bootstrap_servers
        topic = f"bench-spark-{os.getpid()}"
        progress(f"filling {topic}: {records:,} records of {PAYLOAD_BYTES} B")
        fill(bootstrap, topic, records)
        spark = build_session(MASTER, "eventspool-bench")
        try:
            kinds: dict[str, Callable[[], tuple[int, float]]] = {
                "ours": lambda: read_spark(spark, bootstrap, topic, arrow=True),
                "tuple": lambda: read_spark(spark, bootstrap, topic, arrow=False),
                "anchor": lambda: read_anchor(bootstrap, topic, records),
            }
            for kind, read in kinds.items():
                read()  # warm-up: JVM, Python workers, connections
                progress(f"warmed up {kind}")
            for rep in range(args.repeats):
                for kind, read in kinds.items():
                    count, seconds = read()
                    if count != records:
                        raise RuntimeError(f"{kind} read {count} of {records} records")
                    runs.add(kind, records / seconds)
                    progress(
                        f"rep {rep + 1}/{args.repeats} {kind:6}: "
                        f"{records / seconds:>10,.0f} records/s ({seconds:.2f} s)"
                    )
        finally:
            spark.stop()
    m = runs.medians()
    ours, anchor, tuples = m["ours"], m["anchor"], m["tuple"]
    return {
        "figure": "spark_source_read_rate",
        "ours": round(ours),
        "anchor": round(anchor),
        "ratio": safe_ratio(ours, anchor),
        "unit": "records/s",
        "title": "Spark count over the eventspool-kafka source, local[2]",
        "anchor_is": "one bare confluent-kafka consumer in one process",
        "figures": [
            figure(
                "spark_source_arrow_vs_tuples",
                round(ours),
                round(tuples),
                unit="records/s",
                title="The source yielding Arrow record batches",
                anchor_is="the same source yielding tuples",
            ),
        ],
        "records": records,
        "settings": {"spark_master": MASTER, "consumers": READ_DEFAULTS, "producer": FILL_CONFIG},
        "runs": {kind: [round(v) for v in values] for kind, values in runs.values.items()},
        **session.provenance(packages=("pyspark", "pyarrow", "confluent-kafka")),
    }


if __name__ == "__main__":
    sys.exit(bench_main("Spark source read rate vs a bare confluent-kafka consumer", run))
