"""Fixtures of the Spark tests: one multi-process Spark session and one PostgreSQL server
per test session, and helpers that put records into the real broker."""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition
from pyspark.sql import SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from eventspool.spark.pgserver import LocalPostgres
from eventspool.spark.session import build_session

# Two workers with one core each: executors are separate JVMs with their own Python
# workers, so nothing can lean on state of the driver's process.
SPARK_MASTER = "local-cluster[2,1,1024]"

# Spark gives the Python worker it starts for a streaming source a fixed 10 s to connect
# back (PythonWorkerFactory, not configurable). A fresh interpreter importing the source
# takes 0.8 s of CPU; with the suite's heaviest tests beside it on two cores, it has taken
# longer than 10 s in about one full run in three. A test that failed so runs again, up to
# twice; any other failure fails at once.
SPARK_CONNECT_BACK = "Python worker failed to connect back"
_RERUN_SLOW_WORKER = pytest.mark.flaky(reruns=2, only_rerun=[SPARK_CONNECT_BACK])

# Every test of the shared session runs on one xdist worker, which starts it once.
SPARK_MARKS = [
    pytest.mark.slow,
    pytest.mark.spark,
    pytest.mark.xdist_group("spark"),
    _RERUN_SLOW_WORKER,
]
# A test that runs the pipeline as a command has a Spark of its own: it may run on the
# other worker beside the shared session's tests, which would otherwise wait in line.
SPARK_COMMAND_MARKS = [pytest.mark.slow, pytest.mark.spark, _RERUN_SLOW_WORKER]


def command_failure(stderr: str) -> str:
    """What a failed Spark command said: the tail of its stderr, led by the connect-back
    failure when there was one (the tail alone may hold only its stack)."""
    lead = f"{SPARK_CONNECT_BACK}\n" if SPARK_CONNECT_BACK in stderr else ""
    return lead + stderr[-3000:]


def raise_failure(query: StreamingQuery) -> None:
    """The error a streaming query ended with, as it is: a rerun is decided by its text."""
    error = query.exception()
    if error is not None:
        raise error


def wait_for(query: StreamingQuery, condition: Callable[[], bool], timeout: float = 90.0) -> None:
    """Until `condition()` holds, failing at once with the query's error if it ended."""
    deadline = time.monotonic() + timeout
    while not condition():
        raise_failure(query)
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.5)


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    # The executors' JVMs get the drivers' options (set in tests/conftest.py).
    executors = {"spark.executor.defaultJavaOptions": os.environ.get("SPARK_SUBMIT_OPTS", "")}
    session = build_session(SPARK_MASTER, "eventspool-tests", executors)
    yield session
    session.stop()


@pytest.fixture(scope="session")
def postgres() -> Iterator[LocalPostgres]:
    """A real server in a temporary directory (its binaries: `make postgres`)."""
    with LocalPostgres() as server:
        yield server


@pytest.fixture
def database(postgres: LocalPostgres) -> str:
    """A fresh, empty database on the shared server; returns its DSN."""
    import psycopg  # noqa: PLC0415

    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return postgres.dsn.replace("dbname=postgres", f"dbname={name}")


@dataclass(frozen=True, slots=True)
class Sent:
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int
    headers: list[tuple[str, bytes | None]] | None


def produce(
    bootstrap: str,
    topic: str,
    records: Sequence[tuple[int, bytes | None, bytes | None]],
    *,
    timestamps: Sequence[int] | None = None,
    headers: Sequence[list[tuple[str, bytes | None]] | None] | None = None,
    linger_ms: int = 5,
) -> list[Sent]:
    """Produce (partition, key, value) records; returns what the broker acknowledged."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": linger_ms})
    sent: list[Sent] = []
    errors: list[Any] = []
    for index, (partition, key, value) in enumerate(records):
        stamp = timestamps[index] if timestamps is not None else int(time.time() * 1000)
        header = headers[index] if headers is not None else None

        def on_delivery(error: Any, message: Any, header: Any = header, stamp: int = stamp) -> None:
            if error is not None:
                errors.append(error)
                return
            sent.append(
                Sent(
                    message.partition(),
                    message.offset(),
                    message.key(),
                    message.value(),
                    stamp,
                    header,
                )
            )

        extra: dict[str, Any] = {"timestamp": stamp}
        if header is not None:
            extra["headers"] = header
        producer.produce(
            topic, value=value, key=key, partition=partition, on_delivery=on_delivery, **extra
        )
    assert producer.flush(30) == 0
    assert errors == []
    return sorted(sent, key=lambda s: (s.partition, s.offset))


def read_back(bootstrap: str, topic: str, partitions: int, count: int) -> list[Any]:
    """`count` records of a topic with a plain consumer: the independent view of the data.

    With a count of -1, every record: reading stops once the ends are reached.
    """
    consumer: Any = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"check-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "enable.partition.eof": count < 0,
        }
    )
    records: list[Any] = []
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        deadline = time.monotonic() + 60
        at_end: set[int] = set()
        while time.monotonic() < deadline:
            if (count < 0 and len(at_end) == partitions) or 0 <= count <= len(records):
                break
            for message in consumer.consume(10_000, 0.5):
                if message.error() is None:
                    records.append(message)
                elif message.error().code() == KafkaError._PARTITION_EOF:
                    at_end.add(message.partition())
    finally:
        consumer.close()
    if count >= 0:
        assert len(records) == count
    return records


def event_body(message: Any) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(message.value())
    return body
