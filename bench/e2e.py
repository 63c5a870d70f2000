"""End-to-end rate of keyed events: `Spool.send()` to broker acknowledgement, against a
plain `confluent_kafka.Producer` sending the same events to the same broker.

Both sides send N events of 100 bytes (JSON-like values) keyed by cycling over 10k users
to a fresh 12-partition topic, after the same 2,000 warm-up events. Ours: a fresh spool
on default settings; the app thread calls `send()` for each event, then `flush()` until
it returns 0, while the sender thread of the same process drains it. The anchor: a fresh
`Producer` with the sender's own settings plus `partitioner=murmur2_random`, each event
with the spool's 36-byte UUIDv7 `event_id` header (made before the timed region), one
counting delivery callback, poll(0) every 1000 messages and on BufferError, `flush()`.

Each figure is the median over the repetitions, which alternate the sides. Rate: N / time
from the first send to the end of flush(). CPU per million events: `process_time()` over
that window, with a split by thread (/proc) and the broker's CPU. Events per produce
request: librdkafka's statistics. Instructions per event: callgrind (harness.instructions)
over the same kind of run. The broker is tansu (in memory) on the same machine.
"""

from __future__ import annotations

import gc
import json
import os
import random
import shutil
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import confluent_kafka

from eventspool.broker.local import LocalBroker, create_topic
from eventspool.config import SenderSettings
from eventspool.envelope import EventIdGenerator
from eventspool.pipeline import Spool
from harness import instructions as _instructions
from harness.cli import BenchArgs, bench_main
from harness.cpu import CpuWindow, cpu_window
from harness.figures import figure
from harness.output import progress
from harness.producer import anchor_config, compared_settings
from harness.runs import Runs, alternate, safe_ratio
from harness.session import Session

PARTITIONS = 12
PAYLOAD_BYTES = 100
KEY_SPACE = 10_000
FULL_EVENTS = 200_000
QUICK_EVENTS = 100_000
WARMUP_EVENTS = 2_000
FLUSH_TIMEOUT_S = 300.0
ANCHOR_POLL_EVERY = 1000
# librdkafka's statistics (produce requests sent): their interval, and the wait for them.
STATISTICS_INTERVAL_MS = 50
STATISTICS_WAIT_S = 0.2
SENDER_THREAD_NAME = "eventspool-sender"  # the name Sender gives its thread
THREAD_GROUPS = ("app_thread", "sender_thread", "librdkafka_threads", "other")
SIDES = ("ours", "anchor")


Event = tuple[bytes, bytes, bytes]  # key, value, and the event id of the anchor's header


def make_workload(count: int) -> list[Event]:
    """Keyed events with distinct, JSON-like values (lz4 finds some to squeeze, as in real
    events), and UUIDv7 event ids."""
    rng = random.Random(20240601)
    users = [f"user-{i}".encode() for i in range(KEY_SPACE)]
    actions = ("click", "view", "purchase", "login", "logout", "search", "share", "like")
    ids = EventIdGenerator()
    events = []
    for i in range(count):
        user = i % KEY_SPACE
        text = (
            f'{{"u":{user},"n":{i},"a":"{actions[rng.randrange(len(actions))]}",'
            f'"amt":{rng.randrange(100_000)},"r":"{rng.getrandbits(96):024x}","p":"'
        )
        value = text.encode().ljust(PAYLOAD_BYTES - 2, b"x") + b'"}'
        events.append((users[user], value, ids.next_id().encode()))
    return events


def timed_window(
    broker: LocalBroker, send_all: Callable[[], int], produce_requests: Callable[[], int]
) -> tuple[CpuWindow, int]:
    """`send_all` (which returns the events left unacknowledged, to be 0) in a CPU window,
    and the produce requests it made, read once the statistics caught up."""
    time.sleep(STATISTICS_WAIT_S)
    before = produce_requests()
    gc.collect()
    sender_tid = next(  # the spool's sender thread; None for the anchor, which has none
        (t.native_id for t in threading.enumerate() if t.name == SENDER_THREAD_NAME), None
    )
    groups = {threading.get_native_id(): "app_thread", sender_tid: "sender_thread"}
    with cpu_window(broker.pid, groups) as window:
        left = send_all()
    time.sleep(STATISTICS_WAIT_S)
    if left:
        raise RuntimeError(f"{left} events not acknowledged in {FLUSH_TIMEOUT_S} s")
    return window, produce_requests() - before


def run_ours(
    broker: LocalBroker, topic: str, warmup: list[Event], timed: list[Event], directory: Path
) -> tuple[CpuWindow, int]:
    settings = SenderSettings(statistics_interval_ms=STATISTICS_INTERVAL_MS)
    spool = Spool(directory, broker.bootstrap_servers, sender_settings=settings)

    def send_all(events: list[Event]) -> int:
        send = spool.send
        for key, value, _event_id in events:
            send(topic, value, key)
        return spool.flush(FLUSH_TIMEOUT_S)

    try:
        spool.set_partition_count(topic, PARTITIONS)
        if send_all(warmup):
            raise RuntimeError(f"warm-up events of {topic} not acknowledged in time")
        assert spool.sender is not None
        counters = spool.sender.counters
        window, requests = timed_window(
            broker, lambda: send_all(timed), lambda: counters.produce_requests
        )
        if counters.delivered != len(warmup) + len(timed) or counters.dead_letters:
            raise RuntimeError(
                f"sender delivered {counters.delivered} events (expected "
                f"{len(warmup) + len(timed)}), {counters.dead_letters} dead letters"
            )
    finally:
        spool.close(timeout=10.0)
        shutil.rmtree(directory, ignore_errors=True)
    return window, requests


def run_anchor(
    broker: LocalBroker, topic: str, warmup: list[Event], timed: list[Event]
) -> tuple[CpuWindow, int]:
    requests = [0]

    def on_statistics(text: str) -> None:
        brokers = json.loads(text).get("brokers", {})
        requests[0] = sum(int(b.get("req", {}).get("Produce", 0)) for b in brokers.values())

    config = {
        **anchor_config(broker.bootstrap_servers, lambda _error: None),
        "statistics.interval.ms": STATISTICS_INTERVAL_MS,
        "stats_cb": on_statistics,
    }
    producer: Any = confluent_kafka.Producer(config)
    delivered = [0]
    failed = [0]

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is None:
            delivered[0] += 1
        else:
            failed[0] += 1

    def produce_requests() -> int:
        producer.poll(0)
        return requests[0]

    def send_all() -> int:
        produce_all(producer, topic, timed, on_delivery)
        return int(producer.flush(FLUSH_TIMEOUT_S))

    try:
        produce_all(producer, topic, warmup, on_delivery)
        if producer.flush(FLUSH_TIMEOUT_S):
            raise RuntimeError(f"anchor warm-up of {topic} not acknowledged in time")
        window, sent_requests = timed_window(broker, send_all, produce_requests)
        if delivered[0] != len(warmup) + len(timed) or failed[0]:
            raise RuntimeError(f"the anchor delivered {delivered[0]} messages, {failed[0]} failed")
    finally:
        producer.purge()
        producer.poll(0)
    return window, sent_requests


def produce_all(
    producer: Any, topic: str, events: list[Event], on_delivery: Callable[[Any, Any], None]
) -> None:
    produce = producer.produce
    poll = producer.poll
    countdown = ANCHOR_POLL_EVERY
    for key, value, event_id in events:
        headers = [("event_id", event_id)]
        while True:
            try:
                produce(topic, value, key, headers=headers, on_delivery=on_delivery)
                break
            except BufferError:
                poll(0.01)
        countdown -= 1
        if not countdown:
            poll(0)
            countdown = ANCHOR_POLL_EVERY


def record(runs: Runs, side: str, events: int, window: CpuWindow, requests: int) -> None:
    """Note one run's rate, CPU by thread group and produce requests."""

    def per_million(seconds: float) -> float:
        return seconds * 1e6 / events

    rate = events / window.wall_s
    runs.add(f"{side}_rate", rate)
    runs.add(f"{side}_cpu_s_per_million", per_million(window.cpu_s))
    # The app thread by its own clock, finer than /proc's ticks.
    for group, seconds in (window.threads_s | {"app_thread": window.caller_cpu_s}).items():
        runs.add(f"{side}_{group}_cpu_s_per_million", per_million(seconds))
    if window.other_cpu_s is not None:
        runs.add(f"{side}_broker_cpu_s_per_million", per_million(window.other_cpu_s))
    runs.add(f"{side}_events_per_produce_request", events / requests)
    progress(
        f"{side:6}: {rate:>9,.0f} events/s, {per_million(window.cpu_s):.2f} CPU s/M "
        f"(app thread {per_million(window.caller_cpu_s):.2f})"
    )


def run(args: BenchArgs) -> dict[str, object]:
    events = QUICK_EVENTS if args.quick else FULL_EVENTS
    workload = make_workload(WARMUP_EVENTS + events)
    warmup, timed = workload[:WARMUP_EVENTS], workload[WARMUP_EVENTS:]
    runs = Runs()
    instructions: dict[str, float] = {}
    with Session(args, "e2e") as session:
        broker = session.broker()
        for rep in range(args.repeats):
            for side in alternate(rep, SIDES):
                topic = f"bench-e2e-{side}-{rep}-{os.getpid()}"
                create_topic(broker.bootstrap_servers, topic, PARTITIONS)
                if side == "ours":
                    spool_dir = session.scratch / f"spool-{rep}"
                    window, requests = run_ours(broker, topic, warmup, timed, spool_dir)
                else:
                    window, requests = run_anchor(broker, topic, warmup, timed)
                record(runs, side, len(timed), window, requests)
        if _instructions.available():
            ipe_events = _instructions.QUICK_EVENTS if args.quick else _instructions.FULL_EVENTS
            instructions = _instructions.per_event(
                ["e2e_spool", "e2e_producer"], ipe_events, broker.bootstrap_servers
            )
            progress(f"instructions per event ({ipe_events:,} per lane): {instructions}")
    medians = runs.medians()

    def fig(name: str) -> float | None:
        value = medians.get(name)
        return None if value is None else round(value, 3)

    listed = [
        figure(
            "e2e_cpu_s_per_million_events",
            round(medians["ours_cpu_s_per_million"], 3),
            round(medians["anchor_cpu_s_per_million"], 3),
            unit="CPU s per million events",
            title="CPU of the sending process per million events",
            anchor_is="the same producer",
            higher_is_better=False,
        ),
        figure(
            "e2e_events_per_produce_request",
            round(medians["ours_events_per_produce_request"], 1),
            round(medians["anchor_events_per_produce_request"], 1),
            unit="events per produce request",
            title="Events per produce request to the broker",
            anchor_is="the same producer",
        ),
    ]
    if instructions:
        listed.append(
            _instructions.instruction_figure(
                "e2e_instructions_per_event",
                instructions,
                "e2e_spool",
                "e2e_producer",
                title="Instructions per event, send to acknowledgement (callgrind)",
                anchor_is="the same producer",
            )
        )
    return {
        "figure": "e2e_rate_keyed_12p",
        "ours": round(medians["ours_rate"]),
        "anchor": round(medians["anchor_rate"]),
        "ratio": safe_ratio(medians["ours_rate"], medians["anchor_rate"]),
        "unit": "events/s",
        "title": "Spool.send() to broker acknowledgement, keyed, 12 partitions",
        "anchor_is": "confluent_kafka Producer, idempotent, lz4, same broker",
        "figures": listed,
        "events": events,
        "settings": {
            **compared_settings(),
            "key_space": KEY_SPACE,
            "warmup_events": WARMUP_EVENTS,
            "anchor_poll_every": ANCHOR_POLL_EVERY,
        },
        "cpu_split_s_per_million": {
            side: {group: fig(f"{side}_{group}_cpu_s_per_million") for group in THREAD_GROUPS}
            for side in SIDES
        },
        "broker_cpu_s_per_million": {
            side: fig(f"{side}_broker_cpu_s_per_million") for side in SIDES
        },
        "runs": {
            name: values
            for name, values in runs.listed("_rate", "_cpu_s_per_million").items()
            if "_thread" not in name
        },
        **session.provenance(),
    }


if __name__ == "__main__":
    sys.exit(bench_main("Keyed events, Spool.send() to broker ack, vs a plain Producer", run))
