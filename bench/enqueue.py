"""Enqueue cost of `Spool.send()` against `confluent_kafka.Producer.produce()`.

What one run measures (each figure is the median over the repetitions):

1. `Spool.send()` with 100-byte values, keyless and keyed (10k users, keys like
   b"user-123"), with durability `process` and `fsync`, from 1 and from 4 threads:
   the rate (a pass without per-call timing; rate = events / wall time of the pass)
   and the per-call latency p50/p99/p99.9 (a separate pass, `perf_counter_ns` around
   every call).
2. The disk's own cost: append 100 bytes to a file and fdatasync it, in the spool's
   directory (and, for reference, the same with 100-byte overwrites in place).
3. The anchor: `Producer.produce()` on the same payloads, memory only (the bootstrap
   server is a closed local port, so nothing leaves the process), timing only the
   enqueue, keyless and keyed, 1 and 4 threads; purged after every pass.

4. Instructions per event, counted by callgrind (bench/_instructions.py) for
   `Spool.send()` and `produce()` keyless: a figure that a busy machine does not move;
   and for `Spool.send()` into one partition whose 4 MiB segments fill and chain.
5. Appends that cross segment boundaries: keyless sends to one partition with 4 MiB
   segments while a drainer thread (standing in for the sender) keeps two segments of
   backlog, so the queue moves to a new segment every ~26k events; against the same
   sends and drainer on one 256 MiB segment, which wraps and never chains.

Nothing sends the spool's events anywhere, so its rings would fill. There is no
concurrent drainer here: every ring has room for a whole pass, and between passes, out
of the timed region, every ring is drained with read_batch + ack (and the count of
drained records is checked against the count sent). This keeps the comparison
symmetric with the anchor, whose messages are not sent either.

The LAST line on stdout is one JSON object; progress and a table go to stderr.
"""

from __future__ import annotations

import gc
import os
import random
import sys
import threading
import time
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import confluent_kafka

import _instructions
from eventspool.config import MIB, Durability, FullPolicy, QueueSettings, SpoolSettings
from eventspool.envelope import FIXED_SIZE
from eventspool.pipeline import Spool
from eventspool.spool.ring import frame_size
from harness.cli import BenchArgs, bench_main
from harness.figures import figure
from harness.output import progress
from harness.rings import empty_rings, expect_emptied, fitting_events
from harness.runs import Runs, latency_summary_us, median, safe_ratio
from harness.session import Session

TOPIC = "bench-enqueue"
PARTITIONS = 4
PAYLOAD_BYTES = 100
KEY_SPACE = 10_000
THREAD_COUNTS = (1, 4)
KEY_MODES = ("keyless", "keyed")
CAPACITY_BYTES = 32 * MIB  # one ring per partition, as before queues had segments
PAGE_BYTES = 4096
DURABILITIES = (Durability.PROCESS, Durability.FSYNC)

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


QUICK = Profile(
    pass_seconds=0.2,
    calibration_seconds=0.1,
    min_rate_events=1_000,
    min_latency_samples=500,
    max_latency_samples=150_000,
    max_pass_events=1_000_000,
    cold_pass_events=50_000,
    disk_syncs=400,
)
FULL = Profile(
    pass_seconds=1.0,
    calibration_seconds=0.25,
    min_rate_events=4_000,
    min_latency_samples=4_000,
    max_latency_samples=500_000,
    max_pass_events=3_000_000,
    cold_pass_events=200_000,
    disk_syncs=2_000,
)


# ---- running one pass --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PassResult:
    events: int
    seconds: float
    latencies_ns: list[int]

    @property
    def rate(self) -> float:
        return self.events / self.seconds if self.seconds > 0 else 0.0


@dataclass(slots=True)
class Target:
    """Something to enqueue into, and how to empty it between passes (untimed)."""

    name: str
    prefix: str
    call: SendFn
    reset: Callable[[int], None]
    max_pass_events: int
    syncs: Callable[[], int] | None = None


def key_lists(mode: str, total: int, threads: int, users: Sequence[bytes]) -> list[KeyList]:
    """The keys each thread sends: its share of `total`, cycling over the users when keyed."""
    per_thread = max(1, total // threads)
    if mode == "keyless":
        return [[None] * per_thread for _ in range(threads)]
    stride = len(users) // threads
    return [
        [users[(t * stride + i) % len(users)] for i in range(per_thread)] for t in range(threads)
    ]


def run_pass(call: SendFn, value: bytes, keys: list[KeyList], *, timed: bool) -> PassResult:
    """Send every key list from its own thread, all released at once by a barrier.

    The rate is total events over the time from the first thread's start to the last
    thread's end. With `timed`, every call is timed separately (which costs time, so
    rates come from untimed passes only).
    """
    threads = len(keys)
    barrier = threading.Barrier(threads)
    starts = [0] * threads
    ends = [0] * threads
    latencies = [array("q", [0]) * len(k) if timed else array("q") for k in keys]
    errors: list[BaseException] = []

    def worker(slot: int) -> None:
        send = call
        topic = TOPIC
        val = value
        mine = keys[slot]
        clock = time.perf_counter_ns
        try:
            barrier.wait()
            if timed:
                lat = latencies[slot]
                start = clock()
                for i, key in enumerate(mine):
                    t0 = clock()
                    send(topic, val, key)
                    lat[i] = clock() - t0
                end = clock()
            else:
                start = clock()
                for key in mine:
                    send(topic, val, key)
                end = clock()
            starts[slot] = start
            ends[slot] = end
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()

    gc.collect()
    workers = [
        threading.Thread(target=worker, args=(slot,), name=f"bench-{slot}")
        for slot in range(threads)
    ]
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join()
    if errors:
        raise errors[0]
    events = sum(len(k) for k in keys)
    seconds = (max(ends) - min(starts)) / 1e9
    samples: list[int] = []
    if timed:
        for lat in latencies:
            samples.extend(lat)
    return PassResult(events, seconds, samples)


def calibrate(
    target: Target, mode: str, threads: int, *, value: bytes, users: Sequence[bytes], seconds: float
) -> float:
    """Estimate events/s with growing untimed passes (which also warm the code path)."""
    n = 64 * threads
    while True:
        result = run_pass(target.call, value, key_lists(mode, n, threads, users), timed=False)
        target.reset(result.events)
        if result.seconds >= seconds or n >= target.max_pass_events:
            return result.rate
        n = min(n * 4, target.max_pass_events)


@dataclass(frozen=True, slots=True)
class PassSizes:
    rate_events: int
    latency_events: int


def pass_sizes(rate: float, threads: int, target: Target, profile: Profile) -> PassSizes:
    wanted = int(rate * profile.pass_seconds)
    rate_events = min(max(wanted, profile.min_rate_events), target.max_pass_events)
    latency_events = min(
        max(wanted, profile.min_latency_samples),
        profile.max_latency_samples,
        target.max_pass_events,
    )
    # Round to a multiple of the thread count, so every thread sends the same share.
    return PassSizes(
        max(threads, rate_events - rate_events % threads),
        max(threads, latency_events - latency_events % threads),
    )


def measure(
    targets: Sequence[Target],
    *,
    value: bytes,
    users: Sequence[bytes],
    profile: Profile,
    repeats: int,
    runs: Runs,
    sizes: dict[str, dict[str, int]],
    before_rep: Callable[[int], None] | None = None,
) -> None:
    """Every key mode x thread count of every target, `repeats` times.

    The targets are interleaved configuration by configuration within each repetition,
    so a disturbance (another process on the machine, writeback) hits them alike;
    `before_rep` runs at the start of each repetition, for the same reason.
    """
    configs = [(mode, threads) for mode in KEY_MODES for threads in THREAD_COUNTS]
    planned: dict[tuple[str, str, int], PassSizes] = {}
    for target in targets:
        for mode, threads in configs:
            rate = calibrate(
                target, mode, threads, value=value, users=users, seconds=profile.calibration_seconds
            )
            size = pass_sizes(rate, threads, target, profile)
            planned[(target.prefix, mode, threads)] = size
            sizes[f"{target.prefix}_{mode}_{threads}t"] = {
                "rate_pass_events": size.rate_events,
                "latency_pass_events": size.latency_events,
            }
            progress(
                f"{target.name} {mode} {threads}t: calibrated ~{rate:,.0f}/s, passes of "
                f"{size.rate_events:,} (rate) and {size.latency_events:,} (latency) events"
            )
    for rep in range(repeats):
        if before_rep is not None:
            before_rep(rep)
        for mode, threads in configs:
            for target in targets:
                size = planned[(target.prefix, mode, threads)]
                name = f"{target.prefix}_{mode}_{threads}t"
                timed = run_pass(
                    target.call,
                    value,
                    key_lists(mode, size.latency_events, threads, users),
                    timed=True,
                )
                target.reset(timed.events)
                summary = latency_summary_us(timed.latencies_ns)
                for stat in ("p50_us", "p99_us", "p999_us", "max_us"):
                    runs.add(f"{name}_{stat}", summary[stat])
                syncs_before = target.syncs() if target.syncs is not None else 0
                untimed = run_pass(
                    target.call,
                    value,
                    key_lists(mode, size.rate_events, threads, users),
                    timed=False,
                )
                if target.syncs is not None:
                    synced = target.syncs() - syncs_before
                    runs.add(f"{name}_events_per_fdatasync", untimed.events / max(1, synced))
                target.reset(untimed.events)
                runs.add(f"{name}_rate", untimed.rate)
                progress(
                    f"rep {rep + 1}/{repeats} {target.name} {mode} {threads}t: "
                    f"{untimed.rate:,.0f} events/s, p50 {summary['p50_us']:.2f} us, "
                    f"p99 {summary['p99_us']:.2f} us, p99.9 {summary['p999_us']:.2f} us"
                )


# ---- the spool -----------------------------------------------------------------------


def spool_settings(durability: Durability) -> SpoolSettings:
    return SpoolSettings(
        queue=QueueSettings(
            capacity_bytes=CAPACITY_BYTES,
            segment_bytes=CAPACITY_BYTES,
            durability=durability,
            full_policy=FullPolicy.REJECT,
        )
    )


def spool_target(spool: Spool, durability: Durability, profile: Profile) -> Target:
    fits = fitting_events(PARTITIONS, CAPACITY_BYTES, len(b"user-9999") + PAYLOAD_BYTES)

    def reset(sent: int) -> None:
        expect_emptied(spool, sent)

    def syncs() -> int:
        return sum(ref.ring.syncs for ref in spool.queues())

    return Target(
        name=f"spool[{durability.value}]",
        prefix=f"spool_{durability.value}",
        call=spool.send,
        reset=reset,
        max_pass_events=min(fits, profile.max_pass_events),
        syncs=syncs if durability is Durability.FSYNC else None,
    )


def open_rings(spool: Spool, users: Sequence[bytes]) -> None:
    """Create every partition's ring (keyed sends reach them all), then empty them."""
    for key in users[:256]:
        spool.send(TOPIC, b"x", key)
    empty_rings(spool)
    opened = sorted(ref.partition for ref in spool.queues() if ref.partition is not None)
    if opened != list(range(PARTITIONS)):
        raise RuntimeError(f"expected rings for partitions 0..{PARTITIONS - 1}, got {opened}")


def warm_rings(spool: Spool, target: Target, value: bytes, users: Sequence[bytes]) -> int:
    """Write every ring through one full lap, so no measured pass hits a fresh page."""
    chunk = target.max_pass_events
    sent = 0
    for chunk_index in range(64):
        tails = [ref.ring.write_core.tail for ref in spool.queues()]
        if min(tails) >= CAPACITY_BYTES + 8 * PAGE_BYTES:
            return sent
        mode = KEY_MODES[chunk_index % 2]
        result = run_pass(target.call, value, key_lists(mode, chunk, 1, users), timed=False)
        target.reset(result.events)
        sent += result.events
    raise RuntimeError("the rings did not wrap during the warm-up")


# ---- the disk ------------------------------------------------------------------------


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


def crossing_lanes(
    directory: Path, value: bytes, profile: Profile, repeats: int, runs: Runs
) -> dict[str, int]:
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
    keys = key_lists("keyless", events, 1, [])
    try:
        for name, segment in lanes.items():
            queue = QueueSettings(capacity_bytes=2048 * MIB, segment_bytes=segment)
            spools[name] = spool = Spool(directory / name, settings=SpoolSettings(queue=queue))
            spool.set_partition_count(TOPIC, 1)
            # Warm: the steady ring written through once, the backlog in place.
            for _ in range(STEADY_SEGMENT_BYTES // (events * frame) + 2):
                sent[name] += run_pass(spool.send, value, keys, timed=False).events
                while Drainer(spool, keep).drain_once():
                    pass
        for rep in range(repeats):
            for name, spool in spools.items():
                drainer = Drainer(spool, keep)
                drainer.start()
                result = run_pass(spool.send, value, keys, timed=False)
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


def disk_fdatasync(directory: Path, value: bytes, count: int) -> dict[str, float]:
    """Latency of write(100 bytes) + fdatasync: appending, and overwriting in place."""
    append_path = directory / "fdatasync-append.probe"
    overwrite_path = directory / "fdatasync-overwrite.probe"
    clock = time.perf_counter_ns
    append: list[int] = []
    overwrite: list[int] = []
    fd = os.open(append_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)
    try:
        for _ in range(10):  # warm-up, not recorded
            os.write(fd, value)
            os.fdatasync(fd)
        for _ in range(count):
            t0 = clock()
            os.write(fd, value)
            os.fdatasync(fd)
            append.append(clock() - t0)
    finally:
        os.close(fd)
        append_path.unlink(missing_ok=True)
    region = 1 * MIB
    fd = os.open(overwrite_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, bytes(region))
        os.fsync(fd)
        for i in range(count + 10):
            t0 = clock()
            os.pwrite(fd, value, (i * len(value)) % (region - len(value)))
            os.fdatasync(fd)
            if i >= 10:
                overwrite.append(clock() - t0)
    finally:
        os.close(fd)
        overwrite_path.unlink(missing_ok=True)
    a = latency_summary_us(append)
    o = latency_summary_us(overwrite)
    return {
        "append_p50_us": a["p50_us"],
        "append_p99_us": a["p99_us"],
        "overwrite_p50_us": o["p50_us"],
        "overwrite_p99_us": o["p99_us"],
    }


# ---- the anchor ----------------------------------------------------------------------

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

    target = Target(
        name="produce",
        prefix="produce",
        call=producer.produce,
        reset=reset,
        max_pass_events=profile.max_pass_events,
    )
    return target, producer, errors


# ---- main ----------------------------------------------------------------------------


def run(args: BenchArgs) -> dict[str, object]:
    profile = QUICK if args.quick else FULL
    repeats = args.repeats
    value = random.Random(20240601).randbytes(PAYLOAD_BYTES)
    users = [f"user-{i}".encode() for i in range(KEY_SPACE)]
    runs = Runs()
    sizes: dict[str, dict[str, int]] = {}
    facts: dict[str, Any] = {}

    session = Session(args, "enqueue")
    spool_dir = session.scratch / "spool"
    progress(
        f"profile {'quick' if args.quick else 'full'}: {repeats} repetitions, "
        f"passes of ~{profile.pass_seconds}s; scratch on {session.filesystem}"
    )
    anchor, producer, anchor_errors = anchor_target(profile)
    with session:
        # 1. process durability: fresh spool, cold pass, warm-up lap; the anchor's
        # warm-up; then the measured passes, spool and anchor interleaved.
        spool = Spool(spool_dir, settings=spool_settings(Durability.PROCESS))
        try:
            spool.set_partition_count(TOPIC, PARTITIONS)
            target = spool_target(spool, Durability.PROCESS, profile)
            open_rings(spool, users)
            cold_events = min(profile.cold_pass_events, target.max_pass_events)
            cold = run_pass(
                target.call, value, key_lists("keyless", cold_events, 1, users), timed=False
            )
            target.reset(cold.events)
            facts["cold_first_pass_rate"] = cold.rate
            facts["cold_first_pass_events"] = cold.events
            progress(f"cold first pass (fresh mapping): {cold.rate:,.0f} events/s")
            t0 = time.perf_counter()
            warm_events = warm_rings(spool, target, value, users)
            facts["warmup_events"] = warm_events
            facts["warmup_seconds"] = round(time.perf_counter() - t0, 2)
            progress(f"warm-up: every ring wrapped once ({warm_events:,} events)")

            # The producer's heap grows on first use: fill it once and purge.
            warm = run_pass(
                anchor.call,
                value,
                key_lists("keyless", anchor.max_pass_events, 1, users),
                timed=False,
            )
            anchor.reset(warm.events)
            facts["anchor_cold_first_pass_rate"] = warm.rate
            progress(f"anchor warm-up: {warm.events:,} messages at {warm.rate:,.0f}/s, purged")

            measure(
                [target, anchor],
                value=value,
                users=users,
                profile=profile,
                repeats=repeats,
                runs=runs,
                sizes=sizes,
            )
        finally:
            spool.close()

        # Appends that cross segment boundaries, against the same appends in one ring.
        facts["crossing"] = crossing_lanes(
            session.scratch / "crossing", value, profile, repeats, runs
        )

        # 2. fsync durability: the same (now warm) ring files, reopened; and the disk's
        # own fdatasync in the spool's directory, one probe at the start of each
        # repetition, so that both see the same disk weather.
        def probe_disk(rep: int) -> None:
            disk = disk_fdatasync(spool_dir, value, profile.disk_syncs)
            for stat, figure in disk.items():
                runs.add(f"disk_fdatasync_{stat}", figure)
            progress(
                f"rep {rep + 1}/{repeats} disk fdatasync ({profile.disk_syncs} x 100 B): "
                f"append p50 {disk['append_p50_us']:.0f} us, p99 {disk['append_p99_us']:.0f} us; "
                f"overwrite p50 {disk['overwrite_p50_us']:.0f} us, "
                f"p99 {disk['overwrite_p99_us']:.0f} us"
            )

        os.sync()
        spool = Spool(spool_dir, settings=spool_settings(Durability.FSYNC))
        try:
            target = spool_target(spool, Durability.FSYNC, profile)
            measure(
                [target],
                value=value,
                users=users,
                profile=profile,
                repeats=repeats,
                runs=runs,
                sizes=sizes,
                before_rep=probe_disk,
            )
        finally:
            spool.close()
        producer.purge(in_queue=True, in_flight=True, blocking=True)
        producer.poll(0)
        producer.flush(0)
    instructions: dict[str, float] = {}
    if _instructions.available():
        events = _instructions.QUICK_EVENTS if args.quick else _instructions.FULL_EVENTS
        progress(f"instructions per event under callgrind ({events:,} events per lane)")
        instructions = _instructions.per_event(["send", "produce", "send_crossing"], events)
        progress(f"instructions per event: {instructions}")

    return build_result(
        args,
        profile,
        runs=runs,
        sizes=sizes,
        facts=facts,
        session=session,
        anchor_errors=anchor_errors[0],
        instructions=instructions,
    )


def build_result(
    args: BenchArgs,
    profile: Profile,
    *,
    runs: Runs,
    sizes: dict[str, dict[str, int]],
    facts: dict[str, Any],
    session: Session,
    anchor_errors: int,
    instructions: dict[str, float],
) -> dict[str, object]:
    figures = runs.medians()
    ours = figures["spool_process_keyless_1t_rate"]
    anchor = figures["produce_keyless_1t_rate"]
    fsync_p99 = figures["spool_fsync_keyless_1t_p99_us"]
    disk_p99 = figures["disk_fdatasync_append_p99_us"]

    result: dict[str, Any] = {
        **figure(
            "enqueue_rate_process_1thread",
            round(ours),
            round(anchor),
            unit="events/s",
            title="Spool.send() rate, 1 thread, keyless, durability process",
            anchor_is="confluent_kafka produce(), memory only",
        ),
        "figures": [
            figure(
                "enqueue_rate_process_keyed_4threads",
                round(figures["spool_process_keyed_4t_rate"]),
                round(figures["produce_keyed_4t_rate"]),
                unit="events/s",
                title="Spool.send() rate, 4 threads, keyed, durability process",
                anchor_is="confluent_kafka produce(), memory only",
            ),
            figure(
                "enqueue_p99_process_1thread",
                round(figures["spool_process_keyless_1t_p99_us"], 2),
                round(figures["produce_keyless_1t_p99_us"], 2),
                unit="us",
                title="Spool.send() p99 latency, 1 thread, durability process",
                anchor_is="confluent_kafka produce(), memory only",
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
        ],
    }
    if instructions:
        result["figures"].append(
            _instructions.instruction_figure(
                "enqueue_instructions_per_event",
                instructions,
                "send",
                "produce",
                title="Instructions per Spool.send(), 1 thread, keyless (callgrind)",
                anchor_is="confluent_kafka produce(), memory only",
            )
        )
    for name, value in figures.items():
        result[name] = round(value) if name.endswith("_rate") else round(value, 3)
    ratios: dict[str, float | None] = {}
    for mode in KEY_MODES:
        for threads in THREAD_COUNTS:
            anchor_rate = figures[f"produce_{mode}_{threads}t_rate"]
            config = f"process_{mode}_{threads}t"
            ratios[config] = safe_ratio(figures[f"spool_{config}_rate"], anchor_rate)
    result["rate_ratio_vs_produce"] = ratios
    paired = zip(
        runs.values["spool_process_keyless_1t_rate"],
        runs.values["produce_keyless_1t_rate"],
        strict=True,
    )
    result["ratio_paired_median"] = round(median(a / b for a, b in paired), 4)
    result["fsync_p99_us"] = fsync_p99
    result["disk_fdatasync_p99_us"] = disk_p99
    result["fsync_p99_vs_disk_fdatasync_p99_ratio"] = safe_ratio(fsync_p99, disk_p99, 3)
    result["fsync_p50_vs_disk_fdatasync_p50_ratio"] = safe_ratio(
        figures["spool_fsync_keyless_1t_p50_us"], figures["disk_fdatasync_append_p50_us"], 3
    )
    # The ring overwrites preallocated blocks, so in-place overwrites are its true floor.
    result["fsync_p99_vs_disk_fdatasync_overwrite_p99_ratio"] = safe_ratio(
        fsync_p99, figures["disk_fdatasync_overwrite_p99_us"], 3
    )
    cold_rate = facts["cold_first_pass_rate"]
    result["crossing_vs_steady_ratio"] = safe_ratio(
        figures["spool_crossing_rate"], figures["spool_steady_backlog_rate"], 3
    )
    result["crossing"] = facts["crossing"]
    if instructions:
        result["crossing_vs_steady_instructions_ratio"] = safe_ratio(
            instructions["send_crossing"], instructions["send"], 3
        )
    result["cold_first_pass_rate"] = round(cold_rate)
    result["cold_first_pass_vs_warm_ratio"] = safe_ratio(cold_rate, ours, 3)
    result["anchor_cold_first_pass_rate"] = round(facts["anchor_cold_first_pass_rate"])

    result["payload_bytes"] = PAYLOAD_BYTES
    result["key_space"] = KEY_SPACE
    result["key_example"] = "user-123"
    result["partitions"] = PARTITIONS
    result["capacity_bytes_per_ring"] = CAPACITY_BYTES
    result["ring_frame_bytes"] = {
        "keyless": frame_size(FIXED_SIZE + PAYLOAD_BYTES),
        "keyed": frame_size(FIXED_SIZE + len(b"user-1234") + PAYLOAD_BYTES),
    }
    result["durability"] = {
        "process": "SpoolSettings(queue=QueueSettings(durability=process, capacity_bytes="
        f"{CAPACITY_BYTES}, full_policy=reject))",
        "fsync": "SpoolSettings(queue=QueueSettings(durability=fsync, capacity_bytes="
        f"{CAPACITY_BYTES}, full_policy=reject)); concurrent writers of one ring share an "
        "fdatasync (group commit)",
    }
    result["queue_mode"] = (
        "capacity, no concurrent drainer: each pass fits in the rings (at most half of "
        f"{PARTITIONS} x {CAPACITY_BYTES // MIB} MiB); between passes, outside the timed "
        "region, every ring is drained with read_batch + ack and the drained count is "
        "checked against the sent count"
    )
    result["warmup"] = {
        "spool": (
            "rings created first; then one cold pass on the fresh mapping (reported as "
            "cold_first_pass_rate), then sends + drains until every ring had wrapped once, "
            "so no measured pass touches a never-written page (first writes to a fresh "
            "mmap page fault, and on a preallocated file also convert unwritten extents); "
            "each configuration then runs growing calibration passes before its measured "
            "ones. The fsync passes reopen the same, already written, ring files after "
            "os.sync(): their mapping is new, so first touches are minor faults only."
        ),
        "anchor": (
            f"one pass of {profile.max_pass_events} messages then purge, so the measured "
            "passes reuse heap the producer already grew (reported as "
            "anchor_cold_first_pass_rate); purge after every pass, so every pass starts "
            "from an empty queue"
        ),
        "spool_warmup_events": facts["warmup_events"],
        "spool_warmup_seconds": facts["warmup_seconds"],
        "cold_first_pass_events": facts["cold_first_pass_events"],
    }
    result["anchor_config"] = {
        **{k: v for k, v in ANCHOR_CONFIG.items() if k != "bootstrap.servers"},
        "bootstrap.servers": "closed local port (memory only, nothing is sent)",
        "error_cb": "swallowed",
        "purge": "after every pass, outside the timed region",
        "errors_swallowed": anchor_errors,
    }
    result["method"] = {
        "rate": "untimed pass; events / (last thread end - first thread start)",
        "latency": "separate pass, time.perf_counter_ns around every call; percentiles "
        "over all threads' calls of one pass",
        "median_over": "repetitions; per-run percentiles, then the median of each",
        "threads": "4 threads each send a quarter of the pass, released by one barrier; "
        "keyed threads start at different users",
        "disk_fdatasync": f"{profile.disk_syncs} x (append 100 bytes with os.write + "
        "os.fdatasync) in the spool directory, timed together, at the start of each "
        "repetition of the fsync passes; overwrite_ variants pwrite 100 bytes in place in "
        "a written 1 MiB file (what the ring does once it has wrapped)",
    }
    result["pass_sizes"] = sizes
    result["pass_seconds_target"] = profile.pass_seconds
    result["runs"] = runs.listed("_rate", "_p99_us")
    result.update(session.provenance(broker=None))
    result["load_average_1m"] = {
        **result["load_average_1m"],
        "note": "other processes on this machine compete for its cores; spool and anchor "
        "passes are interleaved so that they share any disturbance",
    }
    return result


if __name__ == "__main__":
    sys.exit(
        bench_main("Spool.send() enqueue rate and latency against confluent_kafka produce()", run)
    )
