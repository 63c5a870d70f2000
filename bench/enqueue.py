"""Enqueue cost of `Spool.send()` against `confluent_kafka.Producer.produce()`.

What one run measures (each figure is the median over the repetitions):

1. `Spool.send()` with 100-byte values, keyless and keyed (10k users, keys like
   b"user-123"), with durability `process` and `fsync` (32 MiB rings, full policy
   reject; concurrent writers of one ring share an fdatasync), from 1 and from 4 threads
   released together by one barrier, each sending its share (keyed threads start at
   different users): the rate (a pass without per-call timing; events / wall time from
   the release to the last thread's end) and the per-call latency p50/p99/p99.9 (a
   separate pass, `perf_counter_ns` around every call, percentiles over every thread's
   calls of the pass).
2. The disk's own cost, probed at the start of each repetition of the fsync passes so
   both see the same disk weather: append 100 bytes to a file and fdatasync it, in the
   spool's directory (and, for reference, the same with 100-byte overwrites in place in
   a written 1 MiB file, which is what the ring does once it has wrapped).
3. The anchor: `Producer.produce()` on the same payloads, memory only (the bootstrap
   server is a closed local port, so nothing leaves the process; errors are swallowed
   and counted), timing only the enqueue, keyless and keyed, 1 and 4 threads; purged
   after every pass, untimed, so every pass starts from an empty queue.
4. Instructions per event, counted by callgrind (bench/harness/instructions.py) for
   `Spool.send()` and `produce()` keyless: a figure that a busy machine does not move
   (a quick run counts fewer events per lane); and for `Spool.send()` into one partition
   whose 4 MiB segments fill and chain.
5. Appends that cross segment boundaries: keyless sends to one partition with 4 MiB
   segments while a drainer thread (standing in for the sender) keeps two segments of
   backlog, so the queue moves to a new segment every ~26k events; against the same
   sends and drainer on one 256 MiB segment, which wraps and never chains.

Nothing sends the spool's events anywhere, so its rings would fill. There is no
concurrent drainer here: every ring has room for a whole pass (at most half of the
rings), and between passes, out of the timed region, every ring is drained with
read_batch + ack (and the count of drained records is checked against the count sent).
This keeps the comparison symmetric with the anchor, whose messages are not sent either.

Warm-up: the rings are created first, then one cold pass runs on the fresh mapping
(reported as cold_first_pass_rate), then sends and drains until every ring wrapped once,
so no measured pass touches a never-written page (a first write to a fresh mmap page
faults, and on a preallocated file also converts an unwritten extent). The anchor sends
one pass of the largest size and purges it, so measured passes reuse the heap it grew
(reported as anchor_cold_first_pass_rate). Each configuration then runs growing
calibration passes that size its measured ones. The fsync passes reopen the same,
already written, ring files after os.sync(). Spool and anchor passes are interleaved
configuration by configuration, so a disturbance from other processes hits both alike.
"""

from __future__ import annotations

import os
import random
import sys
import threading
import time
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import confluent_kafka

from eventspool.config import MIB, Durability, FullPolicy, QueueSettings, SpoolSettings
from eventspool.envelope import FIXED_SIZE
from eventspool.pipeline import Spool
from eventspool.spool.ring import frame_size
from harness import instructions
from harness.cli import BenchArgs, bench_main
from harness.figures import figure
from harness.output import progress
from harness.rings import empty_rings, expect_emptied, fitting_events
from harness.runs import Runs, latency_summary_us, median, safe_ratio
from harness.session import Session
from harness.threads import run_together

TOPIC = "bench-enqueue"
PARTITIONS = 4
PAYLOAD_BYTES = 100
VALUE = random.Random(20240601).randbytes(PAYLOAD_BYTES)
KEY_SPACE = 10_000
USERS = [f"user-{i}".encode() for i in range(KEY_SPACE)]
THREAD_COUNTS = (1, 4)
KEY_MODES = ("keyless", "keyed")
CONFIGS = [(mode, threads) for mode in KEY_MODES for threads in THREAD_COUNTS]
CAPACITY_BYTES = 32 * MIB  # one ring per partition, as before queues had segments
DURABILITIES = (Durability.PROCESS, Durability.FSYNC)
PAGE_BYTES = 4096
PRODUCE = "confluent_kafka produce(), memory only"
ANCHOR_CONFIG: dict[str, object] = {
    "bootstrap.servers": "127.0.0.1:1",
    "enable.idempotence": True,
    "acks": "all",
    "compression.type": "lz4",
    "queue.buffering.max.messages": 2_147_483_647,
    "queue.buffering.max.kbytes": 2_147_483_647,
    "message.timeout.ms": 600_000,
    "log_level": 0,
}

SendFn = Callable[[str, bytes, bytes | None], object]
KeyList = list[bytes | None]


@dataclass(frozen=True, slots=True)
class Profile:
    """How long and how often to measure.

    Passes aim at `pass_seconds` from a calibrated rate; the minimum sizes keep the slow
    fsync passes meaningful when a calibration lands on a bad moment of the disk.
    """

    pass_seconds: float
    calibration_seconds: float
    min_rate_events: int
    min_latency_samples: int
    max_latency_samples: int
    max_pass_events: int
    cold_pass_events: int
    disk_syncs: int


QUICK = Profile(0.1, 0.05, 1_000, 500, 50_000, 300_000, 50_000, 400)
FULL = Profile(1.0, 0.25, 4_000, 4_000, 500_000, 3_000_000, 200_000, 2_000)


# ---- running one pass --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PassResult:
    events: int
    seconds: float
    latencies_ns: list[int]

    @property
    def rate(self) -> float:
        return self.events / self.seconds if self.seconds > 0 else 0.0


def key_lists(mode: str, total: int, threads: int) -> list[KeyList]:
    """The keys each thread sends: its share of `total`, cycling over the users when keyed."""
    per_thread = max(1, total // threads)
    if mode == "keyless":
        return [[None] * per_thread for _ in range(threads)]
    stride = len(USERS) // threads
    return [
        [USERS[(t * stride + i) % len(USERS)] for i in range(per_thread)] for t in range(threads)
    ]


def run_pass(call: SendFn, keys: list[KeyList], *, timed: bool) -> PassResult:
    """Send every key list from its own thread, the threads released together.

    With `timed`, every call is timed separately (which costs time, so rates come from
    untimed passes only).
    """

    def send_all(mine: KeyList) -> array[int]:
        send, topic, value, clock = call, TOPIC, VALUE, time.perf_counter_ns
        if not timed:
            for key in mine:
                send(topic, value, key)
            return array("q")
        lat = array("q", [0]) * len(mine)
        for i, key in enumerate(mine):
            t0 = clock()
            send(topic, value, key)
            lat[i] = clock() - t0
        return lat

    ran = run_together([partial(send_all, mine) for mine in keys])
    return PassResult(sum(len(k) for k in keys), ran.seconds, [ns for a in ran.results for ns in a])


@dataclass(slots=True)
class Target:
    """Something to enqueue into, and how to empty it between passes (untimed)."""

    name: str
    prefix: str
    call: SendFn
    reset: Callable[[int], None]
    max_pass_events: int
    syncs: Callable[[], int] | None = None

    def send(self, mode: str, events: int, threads: int = 1, *, timed: bool = False) -> PassResult:
        """One pass of `events` split over `threads`, emptied afterwards."""
        result = run_pass(self.call, key_lists(mode, events, threads), timed=timed)
        self.reset(result.events)
        return result


def calibrate(target: Target, mode: str, threads: int, seconds: float) -> float:
    """Estimate events/s with growing untimed passes (which also warm the code path)."""
    n = 64 * threads
    while True:
        result = target.send(mode, n, threads)
        if result.seconds >= seconds or n >= target.max_pass_events:
            return result.rate
        n = min(n * 4, target.max_pass_events)


def pass_sizes(rate: float, threads: int, target: Target, profile: Profile) -> tuple[int, int]:
    """(rate pass, latency pass) events, each a multiple of `threads` (equal shares)."""
    wanted = int(rate * profile.pass_seconds)
    rate_events = min(max(wanted, profile.min_rate_events), target.max_pass_events)
    latency_events = min(
        max(wanted, profile.min_latency_samples),
        profile.max_latency_samples,
        target.max_pass_events,
    )
    return (
        max(threads, rate_events - rate_events % threads),
        max(threads, latency_events - latency_events % threads),
    )


def measure(
    targets: list[Target],
    profile: Profile,
    repeats: int,
    *,
    runs: Runs,
    sizes: dict[str, dict[str, int]],
    before_rep: Callable[[int], None] | None = None,
) -> None:
    """Every key mode x thread count of every target, `repeats` times, the targets
    interleaved configuration by configuration (as the module docstring says);
    `before_rep` runs at the start of each repetition, for the same reason."""
    planned: dict[str, tuple[int, int]] = {}
    for target in targets:
        for mode, threads in CONFIGS:
            rate = calibrate(target, mode, threads, profile.calibration_seconds)
            name = f"{target.prefix}_{mode}_{threads}t"
            planned[name] = rate_events, latency_events = pass_sizes(rate, threads, target, profile)
            sizes[name] = {"rate_pass_events": rate_events, "latency_pass_events": latency_events}
            progress(
                f"{target.name} {mode} {threads}t: calibrated ~{rate:,.0f}/s, passes of "
                f"{rate_events:,} (rate) and {latency_events:,} (latency) events"
            )
    for rep in range(repeats):
        if before_rep is not None:
            before_rep(rep)
        for (mode, threads), target in ((config, t) for config in CONFIGS for t in targets):
            name = f"{target.prefix}_{mode}_{threads}t"
            rate_events, latency_events = planned[name]
            summary = latency_summary_us(
                target.send(mode, latency_events, threads, timed=True).latencies_ns
            )
            for stat in ("p50_us", "p99_us", "p999_us", "max_us"):
                runs.add(f"{name}_{stat}", summary[stat])
            syncs_before = target.syncs() if target.syncs is not None else 0
            untimed = target.send(mode, rate_events, threads)
            if target.syncs is not None:
                synced = target.syncs() - syncs_before
                runs.add(f"{name}_events_per_fdatasync", untimed.events / max(1, synced))
            runs.add(f"{name}_rate", untimed.rate)
            progress(
                f"rep {rep + 1}/{repeats} {target.name} {mode} {threads}t: "
                f"{untimed.rate:,.0f} events/s, p50 {summary['p50_us']:.2f} us, "
                f"p99 {summary['p99_us']:.2f} us, p99.9 {summary['p999_us']:.2f} us"
            )


# ---- the two sides and the disk -------------------------------------------------------


def open_spool(directory: Path, durability: Durability, profile: Profile) -> tuple[Spool, Target]:
    settings = QueueSettings(
        capacity_bytes=CAPACITY_BYTES,
        segment_bytes=CAPACITY_BYTES,
        durability=durability,
        full_policy=FullPolicy.REJECT,
    )
    spool = Spool(directory, settings=SpoolSettings(queue=settings))
    fits = fitting_events(PARTITIONS, CAPACITY_BYTES, len(b"user-9999") + PAYLOAD_BYTES)

    def syncs() -> int:
        return sum(ref.ring.syncs for ref in spool.queues())

    return spool, Target(
        name=f"spool[{durability.value}]",
        prefix=f"spool_{durability.value}",
        call=spool.send,
        reset=partial(expect_emptied, spool),
        max_pass_events=min(fits, profile.max_pass_events),
        syncs=syncs if durability is Durability.FSYNC else None,
    )


def open_rings(spool: Spool) -> None:
    """Create every partition's ring (keyed sends reach them all), then empty them."""
    for key in USERS[:256]:
        spool.send(TOPIC, b"x", key)
    empty_rings(spool)
    opened = sorted(ref.partition for ref in spool.queues() if ref.partition is not None)
    if opened != list(range(PARTITIONS)):
        raise RuntimeError(f"expected rings for partitions 0..{PARTITIONS - 1}, got {opened}")


def warm_rings(spool: Spool, target: Target) -> int:
    """Write every ring through one full lap, so no measured pass hits a fresh page."""
    sent = 0
    for chunk_index in range(64):
        tails = [ref.ring.write_core.tail for ref in spool.queues()]
        if min(tails) >= CAPACITY_BYTES + 8 * PAGE_BYTES:
            return sent
        sent += target.send(KEY_MODES[chunk_index % 2], target.max_pass_events).events
    raise RuntimeError("the rings did not wrap during the warm-up")


# ---- appends that cross segment boundaries -------------------------------------------

CROSSING_SEGMENT_BYTES = 4 * MIB  # the default segment_bytes
STEADY_SEGMENT_BYTES = 256 * MIB
BACKLOG_SEGMENTS = 2


class Drainer(threading.Thread):
    """Reads and acknowledges a queue as the sender would, leaving `keep` records queued."""

    def __init__(self, spool: Spool, keep: int) -> None:
        super().__init__(daemon=True)
        self._spool = spool
        self._keep = keep
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            if not self.drain_once():
                time.sleep(0.0002)

    def drain_once(self) -> int:
        """Acknowledge one batch of what is over `keep`; how many records."""
        (ref,) = self._spool.queues()
        queue = ref.ring
        excess = queue.depth - self._keep
        batch = queue.read_batch(min(excess, 20_000), 64 * MIB) if excess > 0 else []
        if batch:
            queue.ack(batch[-1].seq)
        return len(batch)


def crossing_lanes(directory: Path, profile: Profile, repeats: int, runs: Runs) -> dict[str, int]:
    """Rates of sends that cross segment boundaries and of the same sends that do not.

    Each queue keeps its backlog of two segments between passes too, as under a
    sustained backlog: the crossing lane's emptied segments are recycled, not remade.
    """
    events = profile.max_pass_events // 3
    frame = frame_size(FIXED_SIZE + PAYLOAD_BYTES)
    keep = BACKLOG_SEGMENTS * CROSSING_SEGMENT_BYTES // frame
    lanes = {"crossing": CROSSING_SEGMENT_BYTES, "steady_backlog": STEADY_SEGMENT_BYTES}
    spools: dict[str, Spool] = {}
    sent = dict.fromkeys(lanes, 0)
    keys = key_lists("keyless", events, 1)
    try:
        for name, segment in lanes.items():
            queue = QueueSettings(capacity_bytes=2048 * MIB, segment_bytes=segment)
            spools[name] = spool = Spool(directory / name, settings=SpoolSettings(queue=queue))
            spool.set_partition_count(TOPIC, 1)
            # Warm: the steady ring written through once, the backlog in place.
            for _ in range(STEADY_SEGMENT_BYTES // (events * frame) + 2):
                sent[name] += run_pass(spool.send, keys, timed=False).events
                while Drainer(spool, keep).drain_once():
                    pass
        for rep in range(repeats):
            for name, spool in spools.items():
                drainer = Drainer(spool, keep)
                drainer.start()
                result = run_pass(spool.send, keys, timed=False)
                drainer.stop.set()
                drainer.join()
                while drainer.drain_once():
                    pass
                sent[name] += result.events
                runs.add(f"spool_{name}_rate", result.rate)
                progress(f"rep {rep + 1}/{repeats} {name}: {result.rate:,.0f} events/s")
        for name, spool in spools.items():
            expect_emptied(spool, keep)
            (ref,) = spool.queues()
            if ref.ring.next_seq != sent[name]:
                raise RuntimeError(f"{name}: sent {sent[name]}, queued {ref.ring.next_seq}")
    finally:
        for spool in spools.values():
            spool.close()
    chained = repeats * events * frame // CROSSING_SEGMENT_BYTES
    return {"events_per_pass": events, "backlog_records": keep, "segments_chained": chained}


def anchor_target(profile: Profile) -> tuple[Target, Any, list[int]]:
    errors = [0]

    def swallow(_err: object) -> None:
        errors[0] += 1

    producer: Any = confluent_kafka.Producer({**ANCHOR_CONFIG, "error_cb": swallow})

    def reset(sent: int) -> None:
        queued = len(producer)
        if queued < sent:
            raise RuntimeError(f"produced {sent} messages but only {queued} are queued")
        producer.purge(in_queue=True, in_flight=True, blocking=True)
        producer.poll(0)

    target = Target("produce", "produce", producer.produce, reset, profile.max_pass_events)
    return target, producer, errors


def disk_fdatasync(directory: Path, count: int) -> dict[str, float]:
    """Latency of write(100 bytes) + fdatasync: appending, and overwriting in place."""
    region = 1 * MIB
    summaries = {}
    for kind, flags in (("append", os.O_APPEND), ("overwrite", 0)):
        path = directory / f"fdatasync-{kind}.probe"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | flags, 0o600)
        samples = []
        try:
            if kind == "overwrite":
                os.write(fd, bytes(region))
                os.fsync(fd)
            for i in range(count + 10):  # the first 10 are a warm-up, not recorded
                t0 = time.perf_counter_ns()
                if kind == "append":
                    os.write(fd, VALUE)
                else:
                    os.pwrite(fd, VALUE, (i * len(VALUE)) % (region - len(VALUE)))
                os.fdatasync(fd)
                if i >= 10:
                    samples.append(time.perf_counter_ns() - t0)
        finally:
            os.close(fd)
            path.unlink(missing_ok=True)
        summaries[kind] = latency_summary_us(samples)
    return {f"{kind}_{q}_us": s[f"{q}_us"] for kind, s in summaries.items() for q in ("p50", "p99")}


# ---- main ----------------------------------------------------------------------------


def run(args: BenchArgs) -> dict[str, object]:
    profile = QUICK if args.quick else FULL
    runs = Runs()
    sizes: dict[str, dict[str, int]] = {}
    facts: dict[str, Any] = {}
    session = Session(args, "enqueue")
    spool_dir = session.scratch / "spool"
    progress(
        f"profile {'quick' if args.quick else 'full'}: {args.repeats} repetitions, "
        f"passes of ~{profile.pass_seconds}s; scratch on {session.filesystem}"
    )
    anchor, producer, anchor_errors = anchor_target(profile)
    with session:
        # 1. process durability: fresh spool, cold pass, warm-up lap; the anchor's
        # warm-up; then the measured passes, spool and anchor interleaved.
        spool, target = open_spool(spool_dir, Durability.PROCESS, profile)
        with spool:
            spool.set_partition_count(TOPIC, PARTITIONS)
            open_rings(spool)
            cold = target.send("keyless", min(profile.cold_pass_events, target.max_pass_events))
            facts["cold_first_pass_rate"] = cold.rate
            facts["cold_first_pass_events"] = cold.events
            progress(f"cold first pass (fresh mapping): {cold.rate:,.0f} events/s")
            t0 = time.perf_counter()
            facts["warmup_events"] = warm_rings(spool, target)
            facts["warmup_seconds"] = round(time.perf_counter() - t0, 2)
            progress(f"warm-up: every ring wrapped once ({facts['warmup_events']:,} events)")
            # The producer's heap grows on first use: fill it once and purge.
            warm = anchor.send("keyless", anchor.max_pass_events)
            facts["anchor_cold_first_pass_rate"] = warm.rate
            progress(f"anchor warm-up: {warm.events:,} messages at {warm.rate:,.0f}/s, purged")
            measure([target, anchor], profile, args.repeats, runs=runs, sizes=sizes)

        # Appends that cross segment boundaries, against the same appends in one ring.
        facts["crossing"] = crossing_lanes(
            session.scratch / "crossing", profile, args.repeats, runs
        )

        # 2. fsync durability: the same (now warm) ring files, reopened; and the disk's
        # own fdatasync in the spool's directory, one probe at the start of each
        # repetition, so that both see the same disk weather.
        def probe_disk(rep: int) -> None:
            disk = disk_fdatasync(spool_dir, profile.disk_syncs)
            for stat, value in disk.items():
                runs.add(f"disk_fdatasync_{stat}", value)
            progress(
                f"rep {rep + 1}/{args.repeats} disk fdatasync ({profile.disk_syncs} x 100 B): "
                f"append p50 {disk['append_p50_us']:.0f} us, p99 {disk['append_p99_us']:.0f} us; "
                f"overwrite p50 {disk['overwrite_p50_us']:.0f} us, "
                f"p99 {disk['overwrite_p99_us']:.0f} us"
            )

        os.sync()
        spool, target = open_spool(spool_dir, Durability.FSYNC, profile)
        with spool:
            measure([target], profile, args.repeats, runs=runs, sizes=sizes, before_rep=probe_disk)
        producer.purge(in_queue=True, in_flight=True, blocking=True)
        producer.poll(0)
        producer.flush(0)
    counts: dict[str, float] = {}
    if instructions.available():
        events = instructions.QUICK_EVENTS if args.quick else instructions.FULL_EVENTS
        progress(f"instructions per event under callgrind ({events:,} events per lane)")
        counts = instructions.per_event(["send", "produce", "send_crossing"], events)
        progress(f"instructions per event: {counts}")
    facts["anchor_errors"] = anchor_errors[0]
    return build_result(profile, runs, sizes=sizes, facts=facts, session=session, counts=counts)


def build_result(
    profile: Profile,
    runs: Runs,
    *,
    sizes: dict[str, dict[str, int]],
    facts: dict[str, Any],
    session: Session,
    counts: dict[str, float],
) -> dict[str, object]:
    m = runs.medians()
    ours = m["spool_process_keyless_1t_rate"]
    fsync_p99 = m["spool_fsync_keyless_1t_p99_us"]
    disk_p99 = m["disk_fdatasync_append_p99_us"]
    listed = [
        figure(
            "enqueue_rate_process_keyed_4threads",
            round(m["spool_process_keyed_4t_rate"]),
            round(m["produce_keyed_4t_rate"]),
            unit="events/s",
            title="Spool.send() rate, 4 threads, keyed, durability process",
            anchor_is=PRODUCE,
        ),
        figure(
            "enqueue_p99_process_1thread",
            round(m["spool_process_keyless_1t_p99_us"], 2),
            round(m["produce_keyless_1t_p99_us"], 2),
            unit="us",
            title="Spool.send() p99 latency, 1 thread, durability process",
            anchor_is=PRODUCE,
            higher_is_better=False,
        ),
        figure(
            "enqueue_p99_fsync_1thread",
            round(fsync_p99, 2),
            round(disk_p99, 2),
            unit="us",
            title="Spool.send() p99 latency, 1 thread, durability fsync",
            anchor_is="the disk's own 100-byte append + fdatasync",
            higher_is_better=False,
        ),
    ]
    if counts:
        listed.append(
            instructions.instruction_figure(
                "enqueue_instructions_per_event",
                counts,
                "send",
                "produce",
                title="Instructions per Spool.send(), 1 thread, keyless (callgrind)",
                anchor_is=PRODUCE,
            )
        )
    paired = zip(
        runs.values["spool_process_keyless_1t_rate"],
        runs.values["produce_keyless_1t_rate"],
        strict=True,
    )
    return {
        **figure(
            "enqueue_rate_process_1thread",
            round(ours),
            round(m["produce_keyless_1t_rate"]),
            unit="events/s",
            title="Spool.send() rate, 1 thread, keyless, durability process",
            anchor_is=PRODUCE,
        ),
        "figures": listed,
        **{
            name: round(value) if name.endswith("_rate") else round(value, 3)
            for name, value in m.items()
        },
        "rate_ratio_vs_produce": {
            f"process_{mode}_{threads}t": safe_ratio(
                m[f"spool_process_{mode}_{threads}t_rate"], m[f"produce_{mode}_{threads}t_rate"]
            )
            for mode, threads in CONFIGS
        },
        "ratio_paired_median": round(median(a / b for a, b in paired), 4),
        "fsync_p99_us": fsync_p99,
        "disk_fdatasync_p99_us": disk_p99,
        "fsync_p99_vs_disk_fdatasync_p99_ratio": safe_ratio(fsync_p99, disk_p99, 3),
        "fsync_p50_vs_disk_fdatasync_p50_ratio": safe_ratio(
            m["spool_fsync_keyless_1t_p50_us"], m["disk_fdatasync_append_p50_us"], 3
        ),
        # The ring overwrites preallocated blocks, so in-place overwrites are its true floor.
        "fsync_p99_vs_disk_fdatasync_overwrite_p99_ratio": safe_ratio(
            fsync_p99, m["disk_fdatasync_overwrite_p99_us"], 3
        ),
        "cold_first_pass_rate": round(facts["cold_first_pass_rate"]),
        "cold_first_pass_vs_warm_ratio": safe_ratio(facts["cold_first_pass_rate"], ours, 3),
        "crossing_vs_steady_ratio": safe_ratio(
            m["spool_crossing_rate"], m["spool_steady_backlog_rate"], 3
        ),
        "crossing": facts["crossing"],
        **(
            {
                "crossing_vs_steady_instructions_ratio": safe_ratio(
                    counts["send_crossing"], counts["send"], 3
                )
            }
            if counts
            else {}
        ),
        "anchor_cold_first_pass_rate": round(facts["anchor_cold_first_pass_rate"]),
        "payload_bytes": PAYLOAD_BYTES,
        "key_space": KEY_SPACE,
        "key_example": "user-123",
        "partitions": PARTITIONS,
        "capacity_bytes_per_ring": CAPACITY_BYTES,
        "ring_frame_bytes": {
            "keyless": frame_size(FIXED_SIZE + PAYLOAD_BYTES),
            "keyed": frame_size(FIXED_SIZE + len(b"user-1234") + PAYLOAD_BYTES),
        },
        "durability": [mode.value for mode in DURABILITIES],
        "warmup": {
            "spool_warmup_events": facts["warmup_events"],
            "spool_warmup_seconds": facts["warmup_seconds"],
            "cold_first_pass_events": facts["cold_first_pass_events"],
            "anchor_warmup_events": profile.max_pass_events,
        },
        "anchor_config": {
            **{k: v for k, v in ANCHOR_CONFIG.items() if k != "bootstrap.servers"},
            "errors_swallowed": facts["anchor_errors"],
        },
        "disk_fdatasync_samples": profile.disk_syncs,
        "pass_sizes": sizes,
        "pass_seconds_target": profile.pass_seconds,
        "runs": runs.listed("_rate", "_p99_us"),
        **session.provenance(broker=None),
    }


if __name__ == "__main__":
    sys.exit(
        bench_main("Spool.send() enqueue rate and latency against confluent_kafka produce()", run)
    )
