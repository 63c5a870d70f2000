"""End-to-end rate of keyed events: `Spool.send()` to broker acknowledgement, against a
plain `confluent_kafka.Producer` sending the same events to the same broker.

What one run measures (each figure is the median over the repetitions):

* ours: a fresh spool directory (default settings: durability `process`, 32 MiB rings)
  and a fresh 12-partition topic. The app thread calls `Spool.send()` for N events of
  100 bytes, keyed by cycling over 10k users (b"user-0" .. b"user-9999"), then
  `flush()` until it returns 0; the sender thread drains the rings meanwhile, in this
  same process. Rate = N / (first send until flush() returned 0).
* the anchor: a fresh `confluent_kafka.Producer` with the settings the sender gives its
  own producer plus `partitioner=murmur2_random` (the Java-compatible partitioner), and
  a fresh 12-partition topic. The same events, each with an `event_id` header of the
  36-byte UUIDv7 text the spool adds (generated before the timed region, which favours
  the anchor slightly), so the bytes on the wire match; one shared counting delivery
  callback; poll(0) every 1000 messages and on BufferError; then `flush()`. Rate = N /
  (first produce until flush() returned).

CPU seconds per million events come from `time.process_time()` over the same window
(every thread of this process); a per-thread split from /proc/self/task and the broker
process's own CPU are reported too, with minor page faults (ours writes its fresh rings'
pages for the first time in the window) and the wall time spent in the cyclic garbage
collector, which the application's heap around the spool drives too. Before each timed
window both sides send the same 2,000 warm-up events and wait for them: this opens the
connections, ring files and partition queues, and checks that both put every warm-up
key on the same partition.
Instructions per event of both sides, counted by callgrind (harness.instructions)
over the same kind of run, come last: unlike the rates they do not move when the
machine is busy.

Runs alternate between ours and the anchor. The broker is tansu, started here (in
memory), on the same machine: it competes with this process for the cores.
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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import confluent_kafka

from eventspool.broker.local import create_topic
from eventspool.config import SenderSettings
from eventspool.envelope import EventIdGenerator
from eventspool.pipeline import Spool
from harness import instructions as _instructions
from harness.cli import BenchArgs, bench_main
from harness.cpu import CpuWindow, cpu_window
from harness.figures import figure
from harness.output import progress
from harness.producer import anchor_config, compared_settings
from harness.runs import Runs, alternate, median, safe_ratio
from harness.session import Session

FIGURE = "e2e_rate_keyed_12p"
PARTITIONS = 12
PAYLOAD_BYTES = 100
KEY_SPACE = 10_000
FULL_EVENTS = 200_000
QUICK_EVENTS = 100_000
WARMUP_EVENTS = 2_000
FLUSH_TIMEOUT_S = 300.0
ANCHOR_POLL_EVERY = 1000
# librdkafka's statistics, for the produce requests each side sends: reported this
# often, and read after waiting this long, so the count covers every request sent.
STATISTICS_INTERVAL_MS = 50
STATISTICS_WAIT_S = 0.2
SENDER_THREAD_NAME = "eventspool-sender"  # the name Sender gives its thread
THREAD_GROUPS = ("app_thread", "sender_thread", "librdkafka_threads", "other")


@dataclass(frozen=True, slots=True)
class Workload:
    """Events 0..WARMUP_EVENTS-1 warm up; the rest are timed. Same for both sides."""

    keys: list[bytes]
    values: list[bytes]
    event_ids: list[bytes]

    def part(self, start: int, stop: int) -> Workload:
        return Workload(self.keys[start:stop], self.values[start:stop], self.event_ids[start:stop])

    def __len__(self) -> int:
        return len(self.keys)


def make_workload(count: int, seed: int = 20240601) -> Workload:
    """`count` keyed events with distinct, JSON-like 100-byte values (lz4 finds some to
    squeeze, as in real events), and 36-byte UUIDv7 event ids for the anchor's header."""
    rng = random.Random(seed)
    users = [f"user-{i}".encode() for i in range(KEY_SPACE)]
    actions = ("click", "view", "purchase", "login", "logout", "search", "share", "like")
    keys: list[bytes] = []
    values: list[bytes] = []
    for i in range(count):
        user = i % KEY_SPACE
        keys.append(users[user])
        text = (
            f'{{"u":{user},"n":{i},"a":"{actions[rng.randrange(len(actions))]}",'
            f'"amt":{rng.randrange(100_000)},"r":"{rng.getrandbits(96):024x}","p":"'
        )
        values.append(text.encode().ljust(PAYLOAD_BYTES - 2, b"x") + b'"}')
    if any(len(v) != PAYLOAD_BYTES for v in values):
        raise RuntimeError("a value is not exactly PAYLOAD_BYTES long")
    ids = EventIdGenerator()
    return Workload(keys, values, [ids.next_id().encode() for _ in range(count)])


@dataclass(frozen=True, slots=True)
class RunResult:
    side: str
    events: int
    window: CpuWindow
    warmup_counts: list[int]  # warm-up events per partition: both sides must agree
    notes: dict[str, object]
    produce_requests: int

    @property
    def rate(self) -> float:
        return self.events / self.window.wall_s

    def per_million(self, seconds: float) -> float:
        return seconds * 1e6 / self.events


def run_ours(
    bootstrap: str,
    broker_pid: int,
    topic: str,
    warmup: Workload,
    timed: Workload,
    *,
    directory: Path,
) -> tuple[RunResult, list[int]]:
    """Our run, and its timed events per partition."""
    create_topic(bootstrap, topic, PARTITIONS)
    settings = SenderSettings(statistics_interval_ms=STATISTICS_INTERVAL_MS)
    spool = Spool(directory, bootstrap, sender_settings=settings)
    try:
        spool.set_partition_count(topic, PARTITIONS)
        send = spool.send
        for key, value in zip(warmup.keys, warmup.values, strict=True):
            send(topic, value, key)
        if spool.flush(FLUSH_TIMEOUT_S):
            raise RuntimeError(f"warm-up events of {topic} not acknowledged in time")
        warm_counts = ring_counts(spool, topic)
        if spool.sender is None:
            raise RuntimeError("the spool has no sender")
        counters = spool.sender.counters
        sender_tid = next(
            (t.native_id for t in threading.enumerate() if t.name == SENDER_THREAD_NAME), None
        )
        time.sleep(STATISTICS_WAIT_S)
        requests_before = counters.produce_requests
        gc.collect()
        groups = {threading.get_native_id(): "app_thread", sender_tid: "sender_thread"}
        with cpu_window(broker_pid, groups) as window:
            for key, value in zip(timed.keys, timed.values, strict=True):
                send(topic, value, key)
            left = spool.flush(FLUSH_TIMEOUT_S)
        if left:
            raise RuntimeError(f"{left} events of {topic} not acknowledged in time")
        time.sleep(STATISTICS_WAIT_S)
        requests = counters.produce_requests - requests_before
        total_counts = ring_counts(spool, topic)
        if counters.delivered != len(warmup) + len(timed) or counters.dead_letters:
            raise RuntimeError(
                f"sender delivered {counters.delivered} events (expected "
                f"{len(warmup) + len(timed)}), {counters.dead_letters} dead letters"
            )
        notes: dict[str, object] = {
            "retried_batches": counters.retried_batches,
            "broker_errors": counters.broker_errors,
            "warmup_partition_counts": warm_counts,
        }
    finally:
        spool.close(timeout=10.0)
        shutil.rmtree(directory, ignore_errors=True)
    timed_counts = [t - w for t, w in zip(total_counts, warm_counts, strict=True)]
    return RunResult("ours", len(timed), window, warm_counts, notes, requests), timed_counts


def ring_counts(spool: Spool, topic: str) -> list[int]:
    """Records ever appended to each partition ring of `topic` (fresh rings start at 0)."""
    counts = [0] * PARTITIONS
    for ref in spool.queues():
        if ref.topic == topic:
            if ref.partition is None:
                raise RuntimeError(f"events of {topic} went to the pending ring")
            counts[ref.partition] = ref.ring.next_seq
    return counts


def run_anchor(
    bootstrap: str, broker_pid: int, topic: str, warmup: Workload, timed: Workload
) -> RunResult:
    create_topic(bootstrap, topic, PARTITIONS)
    errors: list[object] = []
    requests = [0]

    def on_statistics(text: str) -> None:
        """Produce requests sent to every broker so far, from a statistics report."""
        brokers = json.loads(text).get("brokers", {})
        requests[0] = sum(int(b.get("req", {}).get("Produce", 0)) for b in brokers.values())

    config = {
        **anchor_config(bootstrap, errors.append),
        "statistics.interval.ms": STATISTICS_INTERVAL_MS,
        "stats_cb": on_statistics,
    }
    producer: Any = confluent_kafka.Producer(config)
    delivered = [0]
    failed = [0]
    warm_counts = [0] * PARTITIONS

    def on_warm_delivery(err: Any, msg: Any) -> None:
        if err is None:
            warm_counts[msg.partition()] += 1
        else:
            failed[0] += 1

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is None:
            delivered[0] += 1
        else:
            failed[0] += 1

    try:
        produce_all(producer, topic, warmup, on_warm_delivery)
        if producer.flush(FLUSH_TIMEOUT_S):
            raise RuntimeError(f"anchor warm-up of {topic} not acknowledged in time")
        time.sleep(STATISTICS_WAIT_S)
        producer.poll(0)
        requests_before = requests[0]
        gc.collect()
        with cpu_window(
            broker_pid, {threading.get_native_id(): "app_thread", None: "sender_thread"}
        ) as window:
            produce_all(producer, topic, timed, on_delivery)
            left = producer.flush(FLUSH_TIMEOUT_S)
        time.sleep(STATISTICS_WAIT_S)
        producer.poll(0)
        if left:
            raise RuntimeError(f"{left} anchor messages of {topic} not acknowledged in time")
        if delivered[0] != len(timed) or failed[0]:
            raise RuntimeError(
                f"anchor delivered {delivered[0]} of {len(timed)} messages, {failed[0]} failed"
            )
    finally:
        producer.purge()
        producer.poll(0)
        del producer
        gc.collect()
    notes: dict[str, object] = {
        "error_cb_calls": len(errors),
        "warmup_partition_counts": warm_counts,
    }
    return RunResult(
        "anchor", len(timed), window, warm_counts, notes, requests[0] - requests_before
    )


def produce_all(
    producer: Any, topic: str, events: Workload, on_delivery: Callable[[Any, Any], None]
) -> None:
    produce = producer.produce
    poll = producer.poll
    countdown = ANCHOR_POLL_EVERY
    for key, value, event_id in zip(events.keys, events.values, events.event_ids, strict=True):
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


def record(runs: Runs, result: RunResult) -> None:
    """Note one run's rate, CPU by thread group, faults, gc and produce requests."""
    side, window, per_million = result.side, result.window, result.per_million
    runs.add(f"{side}_rate", result.rate)
    runs.add(f"{side}_seconds", window.wall_s)
    runs.add(f"{side}_cpu_s_per_million", per_million(window.cpu_s))
    runs.add(f"{side}_app_thread_cpu_s_per_million", per_million(window.caller_cpu_s))
    for group, seconds in window.threads_s.items():
        runs.add(f"{side}_{group}_cpu_s_per_million", per_million(seconds))
    if window.other_cpu_s is not None:
        runs.add(f"{side}_broker_cpu_s_per_million", per_million(window.other_cpu_s))
    runs.add(f"{side}_minor_faults_per_event", window.minor_faults / result.events)
    runs.add(f"{side}_gc_s_per_million", per_million(window.gc_s))
    runs.add(f"{side}_gc_gen2_collections", window.gc_gen2_collections)
    runs.add(f"{side}_produce_requests_per_s", result.produce_requests / window.wall_s)
    runs.add(f"{side}_events_per_produce_request", result.events / result.produce_requests)


def run(args: BenchArgs) -> dict[str, object]:
    events = QUICK_EVENTS if args.quick else FULL_EVENTS
    workload = make_workload(WARMUP_EVENTS + events)
    warmup, timed = workload.part(0, WARMUP_EVENTS), workload.part(WARMUP_EVENTS, len(workload))
    runs = Runs()
    instructions: dict[str, float] = {}
    partition_counts: list[int] = []
    notes: dict[str, list[object]] = {"ours": [], "anchor": []}
    with Session(args, "e2e") as session:
        progress(
            f"{'quick' if args.quick else 'full'}: {args.repeats} repetitions of {events:,} "
            f"keyed events x {PAYLOAD_BYTES} B over {PARTITIONS} partitions; "
            f"scratch on {session.filesystem}"
        )
        broker = session.broker()
        bootstrap = broker.bootstrap_servers
        for rep in range(args.repeats):
            warm: dict[str, list[int]] = {}
            for side in alternate(rep, ("ours", "anchor")):
                topic = f"bench-e2e-{side}-{rep}-{os.getpid()}"
                if side == "ours":
                    directory = session.scratch / f"spool-{rep}"
                    result, partition_counts = run_ours(
                        bootstrap, broker.pid, topic, warmup, timed, directory=directory
                    )
                else:
                    result = run_anchor(bootstrap, broker.pid, topic, warmup, timed)
                warm[side] = result.warmup_counts
                record(runs, result)
                notes[side].append(result.notes)
                window, per_million = result.window, result.per_million
                progress(
                    f"rep {rep + 1}/{args.repeats} {side:6}: {result.rate:>9,.0f} events/s "
                    f"({window.wall_s:.2f} s), {per_million(window.cpu_s):.2f} CPU s/M events "
                    f"(app thread {per_million(window.caller_cpu_s):.2f}), "
                    f"broker {per_million(window.other_cpu_s or 0.0):.2f} CPU s/M"
                )
            if warm["ours"] != warm["anchor"]:
                raise RuntimeError(
                    f"the spool and murmur2_random spread the warm-up keys differently: {warm}"
                )
        if _instructions.available():
            ipe_events = _instructions.QUICK_EVENTS if args.quick else _instructions.FULL_EVENTS
            progress(f"instructions per event under callgrind ({ipe_events:,} per lane)")
            instructions = _instructions.per_event(
                ["e2e_spool", "e2e_producer"], ipe_events, bootstrap
            )
            progress(f"instructions per event: {instructions}")
    medians = runs.medians()

    def fig(name: str, digits: int = 3) -> float | None:
        value = medians.get(name)
        return None if value is None else round(value, digits)

    def both(name: str, digits: int = 3) -> dict[str, float | None]:
        return {side: fig(f"{side}_{name}", digits) for side in ("ours", "anchor")}

    ours, anchor = medians.get("ours_rate", 0.0), medians.get("anchor_rate", 0.0)
    ours_cpu = medians.get("ours_cpu_s_per_million", 0.0)
    anchor_cpu = medians.get("anchor_cpu_s_per_million", 0.0)
    paired = zip(runs.values["ours_rate"], runs.values["anchor_rate"], strict=True)
    instruction_figures = [
        _instructions.instruction_figure(
            "e2e_instructions_per_event",
            instructions,
            "e2e_spool",
            "e2e_producer",
            title="Instructions per event, send to acknowledgement (callgrind)",
            anchor_is="the same producer",
        )
    ]
    return {
        "figure": FIGURE,
        "ours": round(ours),
        "anchor": round(anchor),
        "ratio": safe_ratio(ours, anchor),
        "unit": "events/s",
        "title": "Spool.send() to broker acknowledgement, keyed, 12 partitions",
        "anchor_is": "confluent_kafka Producer, idempotent, lz4, same broker",
        "figures": [
            figure(
                "e2e_cpu_s_per_million_events",
                round(ours_cpu, 3),
                round(anchor_cpu, 3),
                unit="CPU s per million events",
                title="CPU of the sending process per million events",
                anchor_is="the same producer",
                higher_is_better=False,
            ),
            figure(
                "e2e_events_per_produce_request",
                round(medians.get("ours_events_per_produce_request", 0.0), 1),
                round(medians.get("anchor_events_per_produce_request", 0.0), 1),
                unit="events per produce request",
                title="Events per produce request to the broker",
                anchor_is="the same producer",
            ),
            *(instruction_figures if instructions else []),
        ],
        "ours_produce_requests_per_s": fig("ours_produce_requests_per_s", 1),
        "anchor_produce_requests_per_s": fig("anchor_produce_requests_per_s", 1),
        "ours_cpu_s_per_million": round(ours_cpu, 3),
        "anchor_cpu_s_per_million": round(anchor_cpu, 3),
        "cpu_ratio": safe_ratio(anchor_cpu, ours_cpu),
        "ratio_paired_median": round(median(a / b for a, b in paired), 4),
        "events": events,
        "payload_bytes": PAYLOAD_BYTES,
        "partitions": PARTITIONS,
        "settings": {
            **compared_settings(),
            "key_space": KEY_SPACE,
            "warmup_events": WARMUP_EVENTS,
            "anchor_poll_every": ANCHOR_POLL_EVERY,
        },
        "cpu_split_s_per_million": {
            side: {
                **{group: fig(f"{side}_{group}_cpu_s_per_million") for group in THREAD_GROUPS},
                "app_thread_by_thread_time": fig(f"{side}_app_thread_cpu_s_per_million"),
            }
            for side in ("ours", "anchor")
        },
        "broker_cpu_s_per_million": both("broker_cpu_s_per_million"),
        "gc_s_per_million": both("gc_s_per_million"),
        "gc_gen2_collections": both("gc_gen2_collections", 1),
        "minor_faults_per_event": both("minor_faults_per_event", 4),
        "timed_partition_counts_ours": partition_counts,
        "runs": {
            name: values
            for name, values in runs.listed("_rate", "_cpu_s_per_million").items()
            if "_thread" not in name
        },
        "run_notes": notes,
        **session.provenance(),
    }


def main(argv: Sequence[str] | None = None) -> int:
    description = "End-to-end keyed event rate: Spool.send() to broker ack vs a plain Producer"
    return bench_main(description, run, argv)


if __name__ == "__main__":
    sys.exit(main())
