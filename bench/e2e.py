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
(every thread of this process); a per-thread split from /proc/self/task and the
broker process's own CPU are reported too. Before each timed window both sides send the
same 2,000 warm-up events and wait for them: this opens the connections, ring files
and partition queues, and checks that both put every warm-up key on the same partition.
Instructions per event of both sides, counted by callgrind (harness.instructions)
over the same kind of run, come last: unlike the rates they do not move when the
machine is busy.

Runs alternate between ours and the anchor. The broker is tansu, started here (in
memory), on the same machine: it competes with this process for the cores.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import resource
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
from eventspool.config import SenderSettings, SpoolSettings
from eventspool.envelope import FIXED_SIZE, EventIdGenerator
from eventspool.pipeline import Spool
from eventspool.spool.ring import frame_size
from harness import instructions as _instructions
from harness.cli import BenchArgs, parse_args
from harness.cpu import CLOCK_TICKS, process_ticks, thread_ticks
from harness.figures import figure
from harness.output import emit_result, print_figures, progress
from harness.producer import SENDER_PRODUCER_CONFIG, anchor_config
from harness.runs import Runs, alternate, median, safe_ratio
from harness.session import Session

FIGURE = "e2e_rate_keyed_12p"
TOPIC_PREFIX = "bench-e2e"
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


# ---- the workload ----------------------------------------------------------------------


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
    event_ids = [ids.next_id().encode() for _ in range(count)]
    return Workload(keys, values, event_ids)


# ---- CPU accounting ------------------------------------------------------------------


def native_id_of(name: str) -> int | None:
    for thread in threading.enumerate():
        if thread.name == name:
            return thread.native_id
    return None


class GcTimer:
    """Wall time spent in the cyclic garbage collector (any thread) and collections per
    generation, while installed in gc.callbacks."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.collections = [0, 0, 0]
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._started
            self.collections[int(info["generation"])] += 1


class CpuWindow:
    """Wall time, process CPU, per-thread CPU, page faults, time in the garbage collector
    and the broker's CPU over one timed window."""

    def __init__(self, broker_pid: int) -> None:
        self.broker_pid = broker_pid
        self.gc_timer = GcTimer()
        self.threads_s: dict[str, float] = {}
        self.broker_cpu_s: float | None = None

    def start(self) -> None:
        gc.callbacks.append(self.gc_timer)
        self.threads_start = thread_ticks()
        self.broker_start = process_ticks(self.broker_pid)
        self.faults_start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        self.app_start = time.thread_time()
        self.cpu_start = time.process_time()
        self.wall_start = time.perf_counter()

    def stop(self, sender_tid: int | None = None) -> None:
        self.wall_s = time.perf_counter() - self.wall_start
        self.cpu_s = time.process_time() - self.cpu_start
        self.app_cpu_s = time.thread_time() - self.app_start
        gc.callbacks.remove(self.gc_timer)
        self.minor_faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - self.faults_start
        broker_end = process_ticks(self.broker_pid)
        if broker_end is not None and self.broker_start is not None:
            self.broker_cpu_s = (broker_end - self.broker_start) / CLOCK_TICKS
        groups = {threading.get_native_id(): "app_thread", sender_tid: "sender_thread"}
        split = dict.fromkeys(("app_thread", "sender_thread", "librdkafka_threads", "other"), 0.0)
        for tid, (name, ticks) in thread_ticks().items():
            rdk = "librdkafka_threads" if name.startswith("rdk:") else "other"
            used = ticks - self.threads_start.get(tid, (name, 0))[1]
            split[groups.get(tid, rdk)] += used / CLOCK_TICKS
        self.threads_s = split


def produce_requests(text: str) -> int:
    """Produce requests sent to every broker, from one librdkafka statistics report."""
    brokers = json.loads(text).get("brokers", {})
    return sum(int(broker.get("req", {}).get("Produce", 0)) for broker in brokers.values())


@dataclass(frozen=True, slots=True)
class RunResult:
    side: str
    events: int
    window: CpuWindow
    partition_counts: list[int]
    notes: dict[str, object]
    produce_requests: int

    @property
    def rate(self) -> float:
        return self.events / self.window.wall_s

    def per_million(self, seconds: float) -> float:
        return seconds * 1e6 / self.events


# ---- the two sides -----------------------------------------------------------------


def settings_description() -> dict[str, object]:
    sender = SenderSettings()
    spool = SpoolSettings()
    return {
        "shared": dict(SENDER_PRODUCER_CONFIG),
        "linger.ms": sender.linger_ms,
        "batch.size": sender.batch_size,
        "compression.type": sender.compression,
        "anchor_partitioner": "murmur2_random",
        "spool": {
            "durability": spool.queue.durability.value,
            "capacity_bytes_per_ring": spool.queue.capacity_bytes,
            "full_policy": spool.queue.full_policy.value,
            "read_batch_records": sender.read_batch_records,
            "max_in_flight_per_queue": sender.max_in_flight_per_queue,
        },
        "key_space": KEY_SPACE,
        "key_example": "user-123",
        "warmup_events": WARMUP_EVENTS,
    }


def run_ours(
    bootstrap: str,
    broker_pid: int,
    topic: str,
    *,
    directory: Path,
    warmup: Workload,
    timed: Workload,
) -> RunResult:
    create_topic(bootstrap, topic, PARTITIONS)
    spool = Spool(
        directory,
        bootstrap,
        sender_settings=SenderSettings(statistics_interval_ms=STATISTICS_INTERVAL_MS),
    )
    try:
        spool.set_partition_count(topic, PARTITIONS)
        send = spool.send
        for key, value in zip(warmup.keys, warmup.values, strict=True):
            send(topic, value, key)
        if spool.flush(FLUSH_TIMEOUT_S):
            raise RuntimeError(f"warm-up events of {topic} not acknowledged in time")
        warm_counts = ring_counts(spool, topic)
        sender = spool.sender
        if sender is None:
            raise RuntimeError("the spool has no sender")
        sender_tid = native_id_of(SENDER_THREAD_NAME)
        time.sleep(STATISTICS_WAIT_S)
        requests_before = sender.counters.produce_requests
        gc.collect()
        window = CpuWindow(broker_pid)
        window.start()
        for key, value in zip(timed.keys, timed.values, strict=True):
            send(topic, value, key)
        left = spool.flush(FLUSH_TIMEOUT_S)
        window.stop(sender_tid)
        if left:
            raise RuntimeError(f"{left} events of {topic} not acknowledged in time")
        time.sleep(STATISTICS_WAIT_S)
        requests = sender.counters.produce_requests - requests_before
        total_counts = ring_counts(spool, topic)
        counters = sender.counters
        delivered = counters.delivered
        if delivered != len(warmup) + len(timed) or counters.dead_letters:
            raise RuntimeError(
                f"sender delivered {delivered} events (expected {len(warmup) + len(timed)}), "
                f"{counters.dead_letters} dead letters"
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
    return RunResult("ours", len(timed), window, timed_counts, notes, requests)


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
        requests[0] = produce_requests(text)

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
        window = CpuWindow(broker_pid)
        window.start()
        produce_all(producer, topic, timed, on_delivery)
        left = producer.flush(FLUSH_TIMEOUT_S)
        window.stop()
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
    return RunResult(
        "anchor",
        len(timed),
        window,
        [],
        {"error_cb_calls": len(errors), "warmup_partition_counts": warm_counts},
        requests[0] - requests_before,
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


# ---- main ----------------------------------------------------------------------------


def record(runs: Runs, result: RunResult) -> None:
    """Note one run's rate, CPU by thread group, faults, gc and produce requests."""
    side = result.side
    window = result.window
    runs.add(f"{side}_rate", result.rate)
    runs.add(f"{side}_seconds", window.wall_s)
    runs.add(f"{side}_cpu_s_per_million", result.per_million(window.cpu_s))
    runs.add(f"{side}_app_thread_cpu_s_per_million", result.per_million(window.app_cpu_s))
    for group, seconds in window.threads_s.items():
        runs.add(f"{side}_{group}_cpu_s_per_million", result.per_million(seconds))
    if window.broker_cpu_s is not None:
        runs.add(f"{side}_broker_cpu_s_per_million", result.per_million(window.broker_cpu_s))
    runs.add(f"{side}_minor_faults_per_event", window.minor_faults / result.events)
    runs.add(f"{side}_gc_s_per_million", result.per_million(window.gc_timer.seconds))
    runs.add(f"{side}_gc_gen2_collections", window.gc_timer.collections[2])
    runs.add(f"{side}_produce_requests_per_s", result.produce_requests / window.wall_s)
    runs.add(f"{side}_events_per_produce_request", result.events / result.produce_requests)


def check_same_partitions(ours: RunResult, anchor: RunResult) -> None:
    mine = ours.notes["warmup_partition_counts"]
    theirs = anchor.notes["warmup_partition_counts"]
    if mine != theirs:
        raise RuntimeError(
            f"the spool and murmur2_random spread the warm-up keys differently: {mine} vs {theirs}"
        )


def run(args: BenchArgs) -> dict[str, object]:
    events_arg: int | None = args.namespace.events
    events = events_arg or (QUICK_EVENTS if args.quick else FULL_EVENTS)
    repeats = args.repeats
    ring_bytes = frame_size(FIXED_SIZE + len(b"user-9999") + PAYLOAD_BYTES)
    capacity = SpoolSettings().queue.capacity_bytes
    # Keys spread evenly over 12 partitions; leave a wide margin for skew.
    if (events + WARMUP_EVENTS) * ring_bytes // PARTITIONS > capacity // 2:
        raise SystemExit(f"--events {events} would fill the spool's default rings; use fewer")

    workload = make_workload(WARMUP_EVENTS + events)
    warmup = workload.part(0, WARMUP_EVENTS)
    timed = workload.part(WARMUP_EVENTS, len(workload))
    runs = Runs()
    instructions: dict[str, float] = {}
    partition_counts: list[int] = []
    notes: dict[str, list[object]] = {"ours": [], "anchor": []}
    with Session(args, "e2e") as session:
        progress(
            f"{'quick' if args.quick else 'full'}: {repeats} repetitions of {events:,} keyed "
            f"events x {PAYLOAD_BYTES} B over {PARTITIONS} partitions; "
            f"scratch on {session.filesystem}"
        )
        broker = session.broker()
        bootstrap = broker.bootstrap_servers
        for rep in range(repeats):
            results: dict[str, RunResult] = {}
            for side in alternate(rep, ("ours", "anchor")):
                topic = f"{TOPIC_PREFIX}-{side}-{rep}-{os.getpid()}"
                if side == "ours":
                    result = run_ours(
                        bootstrap,
                        broker.pid,
                        topic,
                        directory=session.scratch / f"spool-{rep}",
                        warmup=warmup,
                        timed=timed,
                    )
                    partition_counts = result.partition_counts
                else:
                    result = run_anchor(bootstrap, broker.pid, topic, warmup, timed)
                results[side] = result
                record(runs, result)
                notes[side].append(result.notes)
                window = result.window
                progress(
                    f"rep {rep + 1}/{repeats} {side:6}: {result.rate:>9,.0f} events/s "
                    f"({window.wall_s:.2f} s), "
                    f"{result.per_million(window.cpu_s):.2f} CPU s/M events "
                    f"(app thread {result.per_million(window.app_cpu_s):.2f}), "
                    f"broker {result.per_million(window.broker_cpu_s or 0.0):.2f} CPU s/M"
                )
            check_same_partitions(results["ours"], results["anchor"])
        if _instructions.available():
            ipe_events = _instructions.QUICK_EVENTS if args.quick else _instructions.FULL_EVENTS
            progress(f"instructions per event under callgrind ({ipe_events:,} per lane)")
            instructions = _instructions.per_event(
                ["e2e_spool", "e2e_producer"], ipe_events, bootstrap
            )
            progress(f"instructions per event: {instructions}")
    return build_result(
        args,
        events=events,
        runs=runs,
        partition_counts=partition_counts,
        notes=notes,
        instructions=instructions,
        provenance=session.provenance(),
    )


def build_result(
    args: BenchArgs,
    *,
    events: int,
    runs: Runs,
    partition_counts: list[int],
    notes: dict[str, list[object]],
    instructions: dict[str, float],
    provenance: dict[str, object],
) -> dict[str, object]:
    medians = runs.medians()

    def fig(name: str, digits: int = 3) -> float | None:
        value = medians.get(name)
        return None if value is None else round(value, digits)

    ours = medians.get("ours_rate", 0.0)
    anchor = medians.get("anchor_rate", 0.0)
    ours_cpu = medians.get("ours_cpu_s_per_million", 0.0)
    anchor_cpu = medians.get("anchor_cpu_s_per_million", 0.0)
    paired = zip(runs.values["ours_rate"], runs.values["anchor_rate"], strict=True)
    groups = ("app_thread", "sender_thread", "librdkafka_threads", "other")
    result: dict[str, object] = {
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
            *(
                [
                    _instructions.instruction_figure(
                        "e2e_instructions_per_event",
                        instructions,
                        "e2e_spool",
                        "e2e_producer",
                        title="Instructions per event, send to acknowledgement (callgrind)",
                        anchor_is="the same producer",
                    )
                ]
                if instructions
                else []
            ),
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
        "settings": settings_description(),
        "cpu_split_s_per_million": {
            side: {
                **{group: fig(f"{side}_{group}_cpu_s_per_million") for group in groups},
                "app_thread_by_thread_time": fig(f"{side}_app_thread_cpu_s_per_million"),
            }
            for side in ("ours", "anchor")
        },
        "broker_cpu_s_per_million": {
            "ours": fig("ours_broker_cpu_s_per_million"),
            "anchor": fig("anchor_broker_cpu_s_per_million"),
        },
        "gc_s_per_million": {
            "ours": fig("ours_gc_s_per_million"),
            "anchor": fig("anchor_gc_s_per_million"),
            "note": "wall time inside the cyclic garbage collector (included in the CPU "
            "figures); it is triggered by allocations and scans every tracked object, so it "
            "also depends on the heap of the application around the spool",
        },
        "gc_gen2_collections": {
            "ours": fig("ours_gc_gen2_collections", 1),
            "anchor": fig("anchor_gc_gen2_collections", 1),
        },
        "minor_faults_per_event": {
            "ours": fig("ours_minor_faults_per_event", 4),
            "anchor": fig("anchor_minor_faults_per_event", 4),
        },
        "timed_partition_counts_ours": partition_counts,
        "method": {
            "rate": "events / wall time from the first send()/produce() until flush() "
            "returned 0 (Spool.flush polls every 5 ms)",
            "cpu": "time.process_time() delta over the same window: every thread of this "
            "process; the split by thread comes from /proc/self/task (10 ms ticks)",
            "broker_cpu": "utime+stime delta of the tansu process over the same window",
            "median_over": "repetitions; ours and anchor alternate, each on a fresh topic; "
            "ours also on a fresh spool directory, so its rings' pages are written for the "
            "first time during the window (see minor_faults_per_event)",
            "warmup": f"{WARMUP_EVENTS} events per side before each window, acknowledged; "
            "both sides must spread them over the partitions identically",
            "anchor_loop": f"produce() with headers=[('event_id', id)] and one shared "
            f"counting on_delivery; poll(0) every {ANCHOR_POLL_EVERY} messages; "
            "BufferError -> poll(0.01) and retry; then flush()",
        },
        "runs": {
            name: [round(v, 3) for v in values]
            for name, values in runs.values.items()
            if name.endswith(("_rate", "_cpu_s_per_million")) and "_thread" not in name
        },
        "run_notes": notes,
        **provenance,
    }
    return result


def main(argv: Sequence[str] | None = None) -> int:
    def extra(parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--events",
            type=int,
            default=None,
            help=f"timed events per run (default {FULL_EVENTS:,}, {QUICK_EVENTS:,} with --quick)",
        )

    args = parse_args(
        "End-to-end keyed event rate: Spool.send() to broker ack vs a plain Producer",
        argv,
        extra,
    )
    result = run(args)
    print_figures(result)
    emit_result(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
