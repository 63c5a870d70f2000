"""Consumer throughput: eventspool's Consumer against a bare confluent-kafka consume loop.

(a) No-op handler. A topic of 4 partitions holds N events of 100 bytes, keyed by cycling
    over 10k users, each with an `event_id` header; each run reads them all in a fresh
    consumer group, ours and the anchor alternating.
    * ours: `Consumer(workers=2)` on its defaults. Rate = events processed between the
      first status snapshot showing a received event and the one showing all N
      processed, over the time between them (stamped by the poll thread): the slow group
      join on the embedded broker is left out. Also reported: the CPU of the consumer's
      own process (poll thread and librdkafka) per event between the same snapshots.
    * the anchor: a `confluent_kafka.Consumer`, same group settings, auto-commit, calling
      the same no-op on each message of `consume(1000, 0.1)`; rate = N / (first message
      to last). It gets `fetch.queue.backoff.ms=100`, as `Consumer` does: with
      librdkafka's 1 s its rate moved by a factor of four by chance.
(b) A handler burning 1 ms of CPU per event, M events: `Consumer` with 2 workers against
    1 worker, rate as in (a), on two shared cores.
(c) An `async def` handler awaiting 10 ms per event, K events, `Consumer` with 2 workers
    of concurrency 100, rate as in (a), against the ideal workers x concurrency / 10 ms.
    On a broker of its own, started after (a) and (b): a broker's fetches slow down as
    it holds more data.
"""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from typing import Any

from confluent_kafka import Consumer as KafkaConsumer
from confluent_kafka import Producer

from eventspool.broker.local import LocalBroker, create_topic
from eventspool.consumer import Consumer, ConsumerSettings, Record
from harness.cli import BenchArgs, bench_main
from harness.figures import figure
from harness.output import progress
from harness.runs import Runs, alternate, safe_ratio
from harness.session import Session

EVENTS = {True: 60_000, False: 300_000}  # by --quick
CPU_EVENTS = {True: 1_000, False: 6_000}
IO_EVENTS = {True: 20_000, False: 60_000}
IO_WAIT_S = 0.010
IO_WORKERS = 2
IO_CONCURRENCY = 100
PARTITIONS = 4
VALUE = b"v" * 100
GROUP_SETTINGS = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 500}
ANCHOR_FETCH = {"fetch.queue.backoff.ms": 100}  # as Consumer's default (see (a))
TIMEOUT_S = 300.0


def noop(_record: object) -> None:
    """The handler of (a), for both sides."""


def burn_1ms(_record: Record) -> None:
    """1 ms of CPU, whatever else the machine does."""
    end = time.thread_time() + 0.001
    while time.thread_time() < end:
        pass


async def await_10ms(_record: Record) -> None:
    await asyncio.sleep(IO_WAIT_S)


def fill_topic(bootstrap: str, topic: str, count: int) -> None:
    create_topic(bootstrap, topic, PARTITIONS)
    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 20, "partitioner": "murmur2_random"}
    )
    for i in range(count):
        headers: list[tuple[str, str | bytes | None]] = [("event_id", uuid.uuid4().hex)]
        while True:
            try:
                producer.produce(topic, VALUE, key=f"user-{i % 10_000}", headers=headers)
                break
            except BufferError:
                producer.poll(0.05)
    producer.flush(60)


def ours(
    bootstrap: str, topic: str, count: int, handler: Any, workers: int, **settings: Any
) -> tuple[float, float]:
    """Events/s from status snapshots (see the module doc), and this process's CPU us/event."""
    consumer = Consumer(
        f"bench-ours-{uuid.uuid4().hex[:8]}",
        [topic],
        handler,
        workers=workers,
        bootstrap_servers=bootstrap,
        settings=ConsumerSettings(kafka=GROUP_SETTINGS, **settings),
    )
    consumer.start()
    try:
        first = None
        first_cpu = 0.0
        deadline = time.monotonic() + TIMEOUT_S
        while time.monotonic() < deadline:
            status = consumer.status()
            if first is None and status.counters.received:
                first, first_cpu = status, time.process_time()
            if status.counters.processed >= count and first is not None:
                done = status.counters.processed - first.counters.processed
                cpu_us = (time.process_time() - first_cpu) * 1e6 / done
                return done / (status.taken_at - first.taken_at), cpu_us
            time.sleep(0.005)
        raise RuntimeError(f"ours: {consumer.status().line()} after {TIMEOUT_S} s")
    finally:
        consumer.stop()


def anchor(bootstrap: str, topic: str, count: int) -> float:
    """Events per second of the bare loop, first message to last."""
    consumer = KafkaConsumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-anchor-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            **GROUP_SETTINGS,
            **ANCHOR_FETCH,
        }
    )
    consumer.subscribe([topic])
    seen = 0
    first = 0.0
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while seen < count and time.monotonic() < deadline:
            for message in consumer.consume(1000, 0.1):
                if message.error():
                    continue
                if not seen:
                    first = time.perf_counter()
                noop(message)
                seen += 1
        if seen < count:
            raise RuntimeError(f"anchor: {seen} of {count} after {TIMEOUT_S} s")
        return (count - 1) / (time.perf_counter() - first)
    finally:
        consumer.close()


def run(args: BenchArgs) -> dict[str, object]:
    quick = args.quick
    events, cpu_events, io_events = EVENTS[quick], CPU_EVENTS[quick], IO_EVENTS[quick]
    runs = Runs()
    with Session(args, "consumer") as session:
        with LocalBroker(session.scratch / "broker") as broker:
            bootstrap = broker.bootstrap_servers
            fill_topic(bootstrap, "noop", events)
            fill_topic(bootstrap, "cpu", cpu_events)
            for rep in range(args.repeats):
                for side in alternate(rep, ("anchor", "ours")):
                    if side == "ours":
                        rate, cpu_us = ours(bootstrap, "noop", events, noop, 2)
                        runs.add("parent_cpu_us", cpu_us)
                    else:
                        rate = anchor(bootstrap, "noop", events)
                    runs.add(side, rate)
                    progress(f"(a) rep {rep + 1} {side}: {rate:,.0f} events/s")
            for rep in range(args.repeats):
                for workers in (1, 2):
                    rate, _ = ours(bootstrap, "cpu", cpu_events, burn_1ms, workers)
                    runs.add(f"cpu_{workers}", rate)
                    progress(f"(b) rep {rep + 1} {workers} workers: {rate:,.0f} events/s")
        # See (c): (a)'s anchor read 861k events/s, then 203k once 60k more were in "io".
        with LocalBroker(session.scratch / "broker-io") as broker:
            bootstrap = broker.bootstrap_servers
            fill_topic(bootstrap, "io", io_events)
            for rep in range(args.repeats):
                rate, _ = ours(
                    bootstrap, "io", io_events, await_10ms, IO_WORKERS, concurrency=IO_CONCURRENCY
                )
                runs.add("io", rate)
                progress(f"(c) rep {rep + 1}: {rate:,.0f} events/s")
    m = runs.medians()
    io_ideal = IO_WORKERS * IO_CONCURRENCY / IO_WAIT_S
    return {
        "figure": "consumer_noop_events_per_s",
        "ours": round(m["ours"]),
        "anchor": round(m["anchor"]),
        "ratio": safe_ratio(m["ours"], m["anchor"]),
        "unit": "events/s",
        "title": "Consumer, no-op handler, 2 worker processes",
        "anchor_is": "a bare confluent-kafka consume loop",
        "figures": [
            figure(
                "consumer_cpu_1ms_2_workers",
                round(m["cpu_2"]),
                round(m["cpu_1"]),
                unit="events/s",
                title="Consumer, 1 ms CPU handler, 2 worker processes",
                anchor_is="the same with 1 worker process",
            ),
            figure(
                "consumer_async_io_10ms",
                round(m["io"]),
                round(io_ideal),
                unit="events/s",
                title="Consumer, async handler awaiting 10 ms, 2 workers, concurrency 100",
                anchor_is="the ideal: workers x concurrency / 10 ms",
            ),
        ],
        "noop_parent_cpu_us_per_event": round(m["parent_cpu_us"], 2),
        "goals": {"noop_ratio": 0.5, "async_io_share_of_ideal": 0.75},
        "events": events,
        "cpu_events": cpu_events,
        "io_events": io_events,
        **session.provenance(),
    }


if __name__ == "__main__":
    sys.exit(bench_main("Consumer throughput against a bare confluent-kafka loop", run))
