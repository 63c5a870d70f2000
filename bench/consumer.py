"""Consumer throughput: eventspool's Consumer against a bare confluent-kafka consume loop.

(a) No-op handler. One topic (4 partitions) holds N events of 100 bytes, keyed by
    cycling over 10k users, each with an `event_id` header. Each run reads all of them
    with a fresh consumer group, so both sides read the same records from the same broker:
    * ours: `Consumer(workers=2)` with the default settings (ordering by key, 200 events
      per worker batch, 10,000 buffered) and a handler that does nothing. Rate = events
      processed between the first status snapshot that shows a received event and the one
      that shows all N processed, divided by the time between those two snapshots (the
      poll thread stamps each snapshot), so the slow group join on the embedded broker is
      left out on both sides.
    * the anchor: a `confluent_kafka.Consumer` in the same group settings, subscribed,
      calling the same no-op function on each message from `consume(1000, 0.1)` with
      auto-commit on (the loop most users write). Rate = N / (first message to last).
      It gets `fetch.queue.backoff.ms=100`, the value `Consumer` sets by default: with
      librdkafka's own 1 s, a loop that drains librdkafka's 100,000-event queue faster
      than that stops fetching for the rest of the second, zero to two times per read,
      so the anchor read 220k or 1M events/s by chance and the ratio moved with it.
      The steadier figure is ours' parent CPU per event: the CPU time of the consumer's
      own process (its poll thread and librdkafka's threads) between the same two
      snapshots, divided by the events processed in between.
(b) CPU-bound handler: each event burns 1 ms of CPU (`time.thread_time`), M events,
    `Consumer` with 1 and then 2 workers, rate measured as in (a). Scaling = rate with 2
    workers / rate with 1. The machine has two cores, which the poll thread, librdkafka
    and the broker share with the workers.
(c) I/O-bound handler: `async def`, awaiting 10 ms (`asyncio.sleep`) per event, K
    events, `Consumer` with 2 workers and concurrency 100 per worker, rate measured as in
    (a). The anchor is the ideal: workers x concurrency / 10 ms = 20,000 events/s.
    It runs on a broker of its own, started after (a) and (b): the embedded broker's
    fetches slow down as it holds more data, which would hold (a)'s anchor back.

Runs alternate between ours and the anchor. The LAST stdout line is one JSON object.
"""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from confluent_kafka import Consumer as KafkaConsumer
from confluent_kafka import Producer

from eventspool.broker.local import LocalBroker, create_topic
from eventspool.consumer import Consumer, ConsumerSettings, Record
from harness.cli import BenchArgs, bench_main
from harness.figures import figure
from harness.output import progress
from harness.runs import alternate, median, safe_ratio
from harness.session import Session

FULL_EVENTS = 300_000
QUICK_EVENTS = 60_000
FULL_CPU_EVENTS = 6_000
QUICK_CPU_EVENTS = 2_000
FULL_IO_EVENTS = 60_000
QUICK_IO_EVENTS = 20_000
IO_WAIT_S = 0.010
IO_WORKERS = 2
IO_CONCURRENCY = 100
PARTITIONS = 4
VALUE = b"v" * 100
GROUP_SETTINGS = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 500}
ANCHOR_FETCH = {"fetch.queue.backoff.ms": 100}  # as Consumer's default (see (a))
TIMEOUT_S = 300.0


def noop(_record: object) -> None:
    """The no-op handler of figure (a), for both sides."""


def burn_1ms(_record: Record) -> None:
    """Figure (b): 1 ms of CPU, whatever else the machine does."""
    end = time.thread_time() + 0.001
    while time.thread_time() < end:
        pass


async def await_10ms(_record: Record) -> None:
    """Figure (c): an I/O-bound handler, 10 ms of waiting and no CPU to speak of."""
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


class Measured(NamedTuple):
    rate: float
    parent_cpu_us: float  # CPU of the consumer's process per event


def ours(
    bootstrap: str, topic: str, count: int, handler: Any, workers: int, **settings: Any
) -> Measured:
    """Events per second through Consumer, from status snapshots (see the module doc)."""
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
                return Measured(done / (status.taken_at - first.taken_at), cpu_us)
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
    events = QUICK_EVENTS if args.quick else FULL_EVENTS
    cpu_events = QUICK_CPU_EVENTS if args.quick else FULL_CPU_EVENTS
    io_events = QUICK_IO_EVENTS if args.quick else FULL_IO_EVENTS
    with Session(args, "consumer") as session:
        with LocalBroker(session.scratch / "broker") as broker:
            bootstrap = broker.bootstrap_servers
            fill_topic(bootstrap, "noop", events)
            fill_topic(bootstrap, "cpu", cpu_events)
            ours_rates: list[float] = []
            parent_cpu: list[float] = []
            anchor_rates: list[float] = []

            def measure_ours() -> float:
                measured = ours(bootstrap, "noop", events, noop, 2)
                parent_cpu.append(measured.parent_cpu_us)
                return measured.rate

            for rep in range(args.repeats):
                pair: list[tuple[str, Callable[[], float], list[float]]] = [
                    ("anchor", lambda: anchor(bootstrap, "noop", events), anchor_rates),
                    ("ours", measure_ours, ours_rates),
                ]
                for name, measure, rates in alternate(rep, pair):
                    rates.append(measure())
                    cpu = f", parent CPU {parent_cpu[-1]:.1f} us/event" if name == "ours" else ""
                    progress(f"(a) rep {rep + 1} {name}: {rates[-1]:,.0f} events/s{cpu}")
            one: list[float] = []
            two: list[float] = []
            for rep in range(args.repeats):
                for workers, rates in ((1, one), (2, two)):
                    rates.append(ours(bootstrap, "cpu", cpu_events, burn_1ms, workers).rate)
                    progress(f"(b) rep {rep + 1} {workers} workers: {rates[-1]:,.0f} events/s")
        # A broker of its own: the embedded broker's fetches slow down with all it holds
        # (the anchor of (a) read 861k events/s, then 203k once 60k more were in "io").
        with LocalBroker(session.scratch / "broker-io") as broker:
            bootstrap = broker.bootstrap_servers
            fill_topic(bootstrap, "io", io_events)
            io_rates: list[float] = []
            for rep in range(args.repeats):
                io_rates.append(
                    ours(
                        bootstrap,
                        "io",
                        io_events,
                        await_10ms,
                        IO_WORKERS,
                        concurrency=IO_CONCURRENCY,
                    ).rate
                )
                progress(f"(c) rep {rep + 1}: {io_rates[-1]:,.0f} events/s")
    ours_rate, anchor_rate = median(ours_rates), median(anchor_rates)
    one_rate, two_rate = median(one), median(two)
    io_rate = median(io_rates)
    cpu_us = median(parent_cpu)
    io_ideal = IO_WORKERS * IO_CONCURRENCY / IO_WAIT_S
    return {
        "figure": "consumer_noop_events_per_s",
        "ours": round(ours_rate),
        "anchor": round(anchor_rate),
        "ratio": safe_ratio(ours_rate, anchor_rate),
        "unit": "events/s",
        "title": "Consumer, no-op handler, 2 worker processes",
        "anchor_is": "a bare confluent-kafka consume loop",
        "anchor_kafka": ANCHOR_FETCH,
        "figures": [
            figure(
                "consumer_cpu_1ms_2_workers",
                round(two_rate),
                round(one_rate),
                unit="events/s",
                title="Consumer, 1 ms CPU handler, 2 worker processes",
                anchor_is="the same with 1 worker process",
            ),
            figure(
                "consumer_async_io_10ms",
                round(io_rate),
                round(io_ideal),
                unit="events/s",
                title="Consumer, async handler awaiting 10 ms, 2 workers, concurrency 100",
                anchor_is="the ideal: workers x concurrency / 10 ms",
            ),
        ],
        "noop_parent_cpu_us_per_event": round(cpu_us, 2),
        "cpu_1ms_events_per_s_1_worker": round(one_rate),
        "cpu_1ms_events_per_s_2_workers": round(two_rate),
        "cpu_scaling_2_vs_1": safe_ratio(two_rate, one_rate),
        "async_io_events_per_s": round(io_rate),
        "async_io_ideal_events_per_s": round(io_ideal),
        "async_io_share_of_ideal": safe_ratio(io_rate, io_ideal),
        "goals": {"noop_ratio": 0.5, "async_io_share_of_ideal": 0.75},
        "io_events": io_events,
        "io_settings": {
            "workers": IO_WORKERS,
            "concurrency": IO_CONCURRENCY,
            "max_buffered": ConsumerSettings().max_buffered,
            "wait_s": IO_WAIT_S,
        },
        "events": events,
        "cpu_events": cpu_events,
        "value_bytes": len(VALUE),
        "partitions": PARTITIONS,
        "repeats": args.repeats,
        **session.provenance(),
    }


def main(argv: Sequence[str] | None = None) -> int:
    return bench_main("Consumer throughput against a bare confluent-kafka loop", run, argv)


if __name__ == "__main__":
    sys.exit(main())
