"""Enqueue cost of `Spool.send()` against `confluent_kafka.Producer.produce()`.

Both sides send 100-byte values, keyless and keyed (10k users, keys like b"user-123"),
from 1 and 4 threads released by one barrier. Ours: 4 partitions of 32 MiB rings, reject
when full, durability `process`, then `fsync` on the same files reopened after os.sync().
The anchor: `produce()` into memory (its bootstrap server is a closed port). Nothing is
sent: between passes, untimed, the rings are emptied (the count checked) and the
producer purged. Warm-up: a cold pass on the fresh mapping (cold_first_pass_rate), then
every ring written through once; the anchor fills and purges one pass of the largest size
(anchor_cold_first_pass_rate). Growing calibration passes size the measured ones.

Figures are medians over the repetitions, ours and the anchor interleaved configuration
by configuration. Rate: events / wall time of a pass without per-call timing. Latency
p50/p99/p99.9: a separate pass timing every call. The fsync latency's anchor is the disk's
100-byte append + fdatasync in the spool's directory (and overwrite in place, as a wrapped
ring does), probed at the start of each fsync repetition. Instructions per event under
callgrind (harness.instructions) of `send()` and `produce()` keyless, and of `send()` into
one partition whose 4 MiB segments chain. Crossing lane: keyless sends to one partition
of 4 MiB segments (a new segment every ~26k events) in chunks of 8,192, the backlog drained
back to two segments between chunks with the clock stopped, against the same on one
256 MiB segment, the two taking turns first. A drainer thread beside the sends made each
pass's rate hang on how the two threads shared the GIL (passes spread from 1.5 to 2.5 M/s).
"""

from __future__ import annotations

import os
import random
import sys
import time
from array import array
from collections.abc import Callable
from contextlib import ExitStack
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
from harness.runs import Runs, alternate, latency_summary_us, safe_ratio
from harness.session import Session
from harness.threads import run_together

TOPIC = "bench-enqueue"
PARTITIONS = 4
PAYLOAD_BYTES = 100
VALUE = random.Random(20240601).randbytes(PAYLOAD_BYTES)
KEY_SPACE = 10_000
USERS = [f"user-{i}".encode() for i in range(KEY_SPACE)]
KEY_MODES = ("keyless", "keyed")
CONFIGS = [(mode, threads) for mode in KEY_MODES for threads in (1, 4)]
CAPACITY_BYTES = 32 * MIB  # one segment per ring
PAGE_BYTES = 4096
CROSSING_SEGMENT_BYTES = 4 * MIB  # the default segment_bytes
STEADY_SEGMENT_BYTES = 256 * MIB
LANE_SEGMENT_BYTES = {"crossing": CROSSING_SEGMENT_BYTES, "steady_backlog": STEADY_SEGMENT_BYTES}
BACKLOG_SEGMENTS = 2
CHUNK_EVENTS = 8_192  # about a third of a 4 MiB segment of 100-byte events
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
    """Minimum pass sizes keep fsync passes meaningful after a calibration on a bad moment."""

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


@dataclass(frozen=True, slots=True)
class PassResult:
    events: int
    seconds: float
    latencies_ns: list[int]

    @property
    def rate(self) -> float:
        return self.events / self.seconds if self.seconds > 0 else 0.0


def key_lists(mode: str, total: int, threads: int) -> list[KeyList]:
    """Each thread's share of `total`, cycling over the users from its own start when keyed."""
    per_thread = max(1, total // threads)
    if mode == "keyless":
        return [[None] * per_thread for _ in range(threads)]
    stride = len(USERS) // threads
    return [
        [USERS[(t * stride + i) % len(USERS)] for i in range(per_thread)] for t in range(threads)
    ]


def run_pass(call: SendFn, keys: list[KeyList], *, timed: bool) -> PassResult:
    """Each key list from its own thread; `timed` times every call (so rates come from
    untimed passes)."""

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

    prefix: str
    call: SendFn
    reset: Callable[[int], None]
    max_pass_events: int
    syncs: Callable[[], int] | None = None

    def send(self, mode: str, events: int, threads: int = 1, *, timed: bool = False) -> PassResult:
        result = run_pass(self.call, key_lists(mode, events, threads), timed=timed)
        self.reset(result.events)
        return result


def plan(target: Target, mode: str, threads: int, profile: Profile) -> dict[str, int]:
    """Pass sizes of about `pass_seconds`, from growing untimed passes (which warm up too)."""
    n = 64 * threads
    calibration = target.send(mode, n, threads)
    while calibration.seconds < profile.calibration_seconds and n < target.max_pass_events:
        n = min(n * 4, target.max_pass_events)
        calibration = target.send(mode, n, threads)
    wanted = int(calibration.rate * profile.pass_seconds)
    limit = target.max_pass_events
    sizes = {
        "rate_pass_events": min(max(wanted, profile.min_rate_events), limit),
        "latency_pass_events": min(
            max(wanted, profile.min_latency_samples), profile.max_latency_samples, limit
        ),
    }
    progress(f"{target.prefix}_{mode}_{threads}t: calibrated ~{calibration.rate:,.0f}/s")
    return {name: max(threads, events - events % threads) for name, events in sizes.items()}


def measure(
    targets: list[Target],
    profile: Profile,
    repeats: int,
    runs: Runs,
    sizes: dict[str, dict[str, int]],
    *,
    before_rep: Callable[[int], None] | None = None,
) -> None:
    """Every configuration of every target, `repeats` times, the targets interleaved."""
    for target in targets:
        for mode, threads in CONFIGS:
            sizes[f"{target.prefix}_{mode}_{threads}t"] = plan(target, mode, threads, profile)
    for rep in range(repeats):
        if before_rep is not None:
            before_rep(rep)
        for (mode, threads), target in ((config, t) for config in CONFIGS for t in targets):
            name = f"{target.prefix}_{mode}_{threads}t"
            timed = target.send(mode, sizes[name]["latency_pass_events"], threads, timed=True)
            summary = latency_summary_us(timed.latencies_ns)
            for stat in ("p50_us", "p99_us", "p999_us", "max_us"):
                runs.add(f"{name}_{stat}", summary[stat])
            syncs_before = target.syncs() if target.syncs is not None else 0
            untimed = target.send(mode, sizes[name]["rate_pass_events"], threads)
            if target.syncs is not None:
                synced = target.syncs() - syncs_before
                runs.add(f"{name}_events_per_fdatasync", untimed.events / max(1, synced))
            runs.add(f"{name}_rate", untimed.rate)
            progress(f"rep {rep + 1}/{repeats} {name}: {untimed.rate:,.0f}/s, {summary}")


def open_spool(directory: Path, durability: Durability, profile: Profile) -> tuple[Spool, Target]:
    settings = QueueSettings(
        capacity_bytes=CAPACITY_BYTES,
        segment_bytes=CAPACITY_BYTES,
        durability=durability,
        full_policy=FullPolicy.REJECT,
    )
    spool = Spool(directory, settings=SpoolSettings(queue=settings))
    fits = fitting_events(PARTITIONS, CAPACITY_BYTES, len(b"user-9999") + PAYLOAD_BYTES)
    return spool, Target(
        prefix=f"spool_{durability.value}",
        call=spool.send,
        reset=partial(expect_emptied, spool),
        max_pass_events=min(fits, profile.max_pass_events),
        syncs=(lambda: sum(ref.ring.syncs for ref in spool.queues()))
        if durability is Durability.FSYNC
        else None,
    )


def warm_up(spool: Spool, target: Target, profile: Profile) -> PassResult:
    """Open every partition's ring, time one cold pass on the fresh mapping (returned), then
    write every ring through one full lap, so no measured pass faults in a fresh page."""
    spool.set_partition_count(TOPIC, PARTITIONS)
    for key in USERS[:256]:  # keyed sends reach every partition
        spool.send(TOPIC, b"x", key)
    empty_rings(spool)
    cold = target.send("keyless", min(profile.cold_pass_events, target.max_pass_events))
    for chunk_index in range(64):
        tails = [ref.ring.write_core.tail for ref in spool.queues()]
        if min(tails) >= CAPACITY_BYTES + 8 * PAGE_BYTES:
            return cold
        target.send(KEY_MODES[chunk_index % 2], target.max_pass_events)
    raise RuntimeError("the rings did not wrap during the warm-up")


def drain_excess(spool: Spool, keep: int) -> int:
    """Acknowledge, as the sender would, what the queue holds over `keep` records; how many."""
    (ref,) = spool.queues()
    drained = 0
    while (excess := ref.ring.depth - keep) > 0:
        batch = ref.ring.read_batch(min(excess, 20_000), 64 * MIB)
        if not batch:
            break
        ref.ring.ack(batch[-1].seq)
        drained += len(batch)
    return drained


def chunked_pass(spool: Spool, keys: KeyList, keep: int) -> float:
    """Sends per second of `keys` sent in chunks, the backlog drained back to `keep` records
    between chunks with the clock stopped: the drain is the sender's work, not send()'s."""
    send, topic, value, clock = spool.send, TOPIC, VALUE, time.perf_counter_ns
    sending_ns = 0
    for start in range(0, len(keys), CHUNK_EVENTS):
        chunk = keys[start : start + CHUNK_EVENTS]
        t0 = clock()
        for key in chunk:
            send(topic, value, key)
        sending_ns += clock() - t0
        drain_excess(spool, keep)
    return len(keys) / (sending_ns / 1e9)


def crossing_lanes(directory: Path, profile: Profile, repeats: int, runs: Runs) -> dict[str, int]:
    """Rates of sends that cross segment boundaries and of the same sends that do not; the
    backlog stays between passes, so the crossing lane's segments are recycled, not remade."""
    events = profile.max_pass_events // 3
    frame = frame_size(FIXED_SIZE + PAYLOAD_BYTES)
    keep = BACKLOG_SEGMENTS * CROSSING_SEGMENT_BYTES // frame
    keys: KeyList = [None] * events
    with ExitStack() as stack:
        spools: dict[str, Spool] = {}
        for name, segment in LANE_SEGMENT_BYTES.items():
            queue = QueueSettings(capacity_bytes=2048 * MIB, segment_bytes=segment)
            spools[name] = spool = Spool(directory / name, settings=SpoolSettings(queue=queue))
            stack.enter_context(spool)
            spool.set_partition_count(TOPIC, 1)
            # Warm: the steady ring written through once, the backlog in place.
            for _ in range(STEADY_SEGMENT_BYTES // (events * frame) + 2):
                chunked_pass(spool, keys, keep)
        for rep in range(repeats):
            for name, spool in alternate(rep, list(spools.items())):
                rate = chunked_pass(spool, keys, keep)
                runs.add(f"spool_{name}_rate", rate)
                progress(f"rep {rep + 1}/{repeats} {name}: {rate:,.0f} events/s")
        for spool in spools.values():
            expect_emptied(spool, keep)
    chained = repeats * events * frame // CROSSING_SEGMENT_BYTES
    return {"events_per_pass": events, "backlog_records": keep, "segments_chained": chained}


def anchor_target(profile: Profile) -> Target:
    """The memory-only producer; the errors of its closed bootstrap port are swallowed."""
    producer: Any = confluent_kafka.Producer({**ANCHOR_CONFIG, "error_cb": lambda _error: None})

    def reset(sent: int) -> None:
        if (queued := len(producer)) < sent:
            raise RuntimeError(f"produced {sent} messages but only {queued} are queued")
        producer.purge(in_queue=True, in_flight=True, blocking=True)
        producer.poll(0)

    return Target("produce", producer.produce, reset, profile.max_pass_events)


def disk_fdatasync(directory: Path, count: int) -> dict[str, float]:
    """write(100 bytes) + fdatasync: appending, and overwriting in place in a 1 MiB file."""
    region = 1 * MIB
    stats: dict[str, float] = {}
    for kind, flags in (("append", os.O_APPEND), ("overwrite", 0)):
        path = directory / f"fdatasync-{kind}.probe"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | flags, 0o600)
        samples = []
        try:
            if kind == "overwrite":
                os.write(fd, bytes(region))
                os.fsync(fd)
            for i in range(count + 10):  # the first 10 are a warm-up
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
        summary = latency_summary_us(samples)
        stats |= {f"{kind}_p50_us": summary["p50_us"], f"{kind}_p99_us": summary["p99_us"]}
    return stats


def run(args: BenchArgs) -> dict[str, object]:
    profile = QUICK if args.quick else FULL
    runs = Runs()
    sizes: dict[str, dict[str, int]] = {}
    anchor = anchor_target(profile)
    with Session(args, "enqueue") as session:
        spool_dir = session.scratch / "spool"
        spool, target = open_spool(spool_dir, Durability.PROCESS, profile)
        with spool:
            cold = warm_up(spool, target, profile)
            anchor_warm = anchor.send("keyless", anchor.max_pass_events)
            progress(f"cold first pass {cold.rate:,.0f}/s, anchor's {anchor_warm.rate:,.0f}/s")
            measure([target, anchor], profile, args.repeats, runs, sizes)
        crossing = crossing_lanes(session.scratch / "crossing", profile, args.repeats, runs)

        def probe_disk(rep: int) -> None:
            disk = disk_fdatasync(spool_dir, profile.disk_syncs)
            for stat, value in disk.items():
                runs.add(f"disk_fdatasync_{stat}", value)
            progress(f"rep {rep + 1}/{args.repeats} disk fdatasync: {disk}")

        os.sync()
        spool, target = open_spool(spool_dir, Durability.FSYNC, profile)
        with spool:
            measure([target], profile, args.repeats, runs, sizes, before_rep=probe_disk)
    counts: dict[str, float] = {}
    if instructions.available():
        events = instructions.QUICK_EVENTS if args.quick else instructions.FULL_EVENTS
        counts = instructions.per_event(["send", "produce", "send_crossing"], events)
        progress(f"instructions per event ({events:,} events per lane): {counts}")
    m = runs.medians()
    ours = m["spool_process_keyless_1t_rate"]
    fsync_p99 = m["spool_fsync_keyless_1t_p99_us"]
    figures = [
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
            round(m["disk_fdatasync_append_p99_us"], 2),
            unit="us",
            title="Spool.send() p99 latency, 1 thread, durability fsync",
            anchor_is="the disk's own 100-byte append + fdatasync",
            higher_is_better=False,
        ),
    ]
    if counts:
        figures.append(
            instructions.instruction_figure(
                "enqueue_instructions_per_event",
                counts,
                "send",
                "produce",
                title="Instructions per Spool.send(), 1 thread, keyless (callgrind)",
                anchor_is=PRODUCE,
            )
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
        "figures": figures,
        **{
            name: round(value) if name.endswith("_rate") else round(value, 3)
            for name, value in m.items()
        },
        # The ring overwrites preallocated blocks, so in-place overwrites are its true floor.
        "fsync_p99_vs_disk_fdatasync_overwrite_p99_ratio": safe_ratio(
            fsync_p99, m["disk_fdatasync_overwrite_p99_us"], 3
        ),
        "cold_first_pass_rate": round(cold.rate),
        "crossing_vs_steady_ratio": safe_ratio(
            m["spool_crossing_rate"], m["spool_steady_backlog_rate"], 3
        ),
        "crossing": crossing,
        "crossing_vs_steady_instructions_ratio": safe_ratio(
            counts.get("send_crossing", 0), counts.get("send", 0), 3
        ),
        "anchor_cold_first_pass_rate": round(anchor_warm.rate),
        "pass_sizes": sizes,
        "runs": runs.listed("_rate", "_p99_us"),
        **session.provenance(broker=None),
    }


if __name__ == "__main__":
    sys.exit(bench_main("Spool.send() rate and latency against confluent_kafka produce()", run))
