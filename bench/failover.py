"""Broker failover under a steady keyed stream: recovery once the broker is back, send to
acknowledgement, and what a SIGKILL in mid-outage takes, `Spool.send()` against a bare
idempotent `confluent_kafka.Producer` on a 3-broker cluster.

Each run has a fresh librdkafka mock cluster (`eventspool.broker.mock`), a topic of 6
partitions (p led by broker p % 3 + 1) and a child process per side sending keys cycling
over b"user-0" .. b"user-9999" with 100-byte JSON-like values, 20,000 events/s in bursts
every 5 ms, after 2,000 warm-up events that both sides must put on the same partitions.
From its ready report, after 2 s (1 s with --quick) plus up to 1 s to place the loss (see
3.), every leader moves to the next broker; as long again, broker 3 goes down and its
partitions move to brokers 1 and 2; 5 s later it is back, leading nothing; 4 s (2 s) later
the child stops and waits for every acknowledgement. Send times are taken just before
`send()` / `produce()`. Ours (default settings) is acknowledged when its ring's head,
moved only on the broker's acknowledgement, passes the event; a thread reads the heads
every 1 ms, so ours may be charged about 1 ms too much. The anchor has the sender's
settings plus partitioner=murmur2_random, an `event_id` header per event and a delivery
callback that stamps each acknowledgement. Figures:

1. recovery: from broker 3's return until every event sent before it is acknowledged
   (from the leader move and from the loss too in the JSON); anchor / ours.
2. p99 (p50, max in the JSON) of send to acknowledgement after the warm-up; anchor / ours.
3. the longest send-to-acknowledgement wait of an event sent while broker 3 was down;
   anchor / ours. librdkafka re-queries a lost leader on a 1 s timer from the client's
   creation: in repetition r of N the broker goes down (r + 0.5) / N s past a second of it.
4. acknowledged events lost to a SIGKILL 2.5 s into the outage, by a ledger that survives
   the kill (ours: `send()` returned; the anchor: `produce()` returned, and apart its
   delivery reports). Ours restarts at once and flushes; 0.5 s after the broker is back
   the topic is read to its end. Ratio (anchor + 1) / (ours + 1).

Sides alternate, each run on a fresh cluster; each figure is the median over 5 runs and 3
kills per side (1 and 1 with --quick).
"""

from __future__ import annotations

import bisect
import functools
import json
import math
import os
import sys
import threading
import time
from array import array
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import confluent_kafka
from confluent_kafka import Consumer, TopicPartition

from eventspool.envelope import EventIdGenerator
from eventspool.errors import SpoolFullError
from eventspool.pipeline import Spool
from eventspool.spool.partitioner import partition_for_key
from eventspool.spool.segments import SegmentedQueue
from eventspool.testing.ledger import LedgerWriter, read_lines
from eventspool.verify import ledger
from harness.child import Child, child_arguments
from harness.cli import BenchArgs, bench_main
from harness.figures import figure
from harness.ledger import Tally, lost_figure, summary, tally
from harness.output import progress
from harness.producer import anchor_config, compared_settings
from harness.runs import alternate, median, percentile
from harness.session import Session, drain

FIGURE = "failover"
SIDES = ("ours", "anchor")
BROKERS = 3
DOWN_BROKER = 3
PARTITIONS = 6
REPLICATION = 3
PAYLOAD_BYTES = 100
KEY_SPACE = 10_000
RATE = 20_000
BURST_S = 0.005
WARMUP_EVENTS = 2_000
OUTAGE_S = 5.0
STEADY_S = {True: 1.0, False: 2.0}  # by --quick
TAIL_S = {True: 2.0, False: 4.0}
RUNS = {True: 1, False: 5}
KILLS = {True: 1, False: 3}
HEAD_POLL_S = 0.001
CLIENT_TIMER_NS = 1_000_000_000  # librdkafka's leader re-query timer, from client creation
READY_TIMEOUT_S = 60.0
FLUSH_TIMEOUT_S = 120.0  # and to read a topic back
SETTLE_S = 0.5
LOGS = ("sent", "delivered")  # the child's ledgers: send() or produce() returned; delivered
_BUFFER_RETRY_S = 0.01
_FULL_RETRY_S = 0.001
_ACTIONS = (b"click", b"view", b"purchase", b"login", b"logout", b"search", b"share", b"like")
KEYS = [b"user-%d" % user for user in range(KEY_SPACE)]
INITIAL_LEADERS = {p: p % BROKERS + 1 for p in range(PARTITIONS)}
MOVED_LEADERS = {p: (p + 1) % BROKERS + 1 for p in range(PARTITIONS)}
OUTAGE_LEADERS = {1: 1, 4: 2}  # what DOWN_BROKER leads after the move, to the live brokers
PARTITION_OF_KEY = [partition_for_key(key, PARTITIONS) for key in KEYS]


def value_of(index: int) -> bytes:
    """Event `index`'s value: JSON-like text, so that lz4 finds some to squeeze."""
    mix = index * 0x9E3779B97F4A7C15 % 2**64  # Fibonacci hashing: a well-spread 64-bit mix
    fields = (index % KEY_SPACE, index, _ACTIONS[mix % len(_ACTIONS)], mix >> 44, mix)
    text = b'{"u":%d,"n":%d,"a":"%s","amt":%d,"r":"%016x","p":"' % fields
    return text.ljust(PAYLOAD_BYTES - 2, b"x") + b'"}'


@dataclass(frozen=True, slots=True)
class Phases:
    """The fault schedule, in seconds, from the child's ready report."""

    steady_s: float
    outage_s: float
    tail_s: float
    kill_after_down_s: float


@dataclass(frozen=True, slots=True)
class ChildSpec:
    """A child's side and stream; `run_dir` holds its spool, its ledgers and its result."""

    side: str
    bootstrap: str
    topic: str
    run_dir: str

    def path(self, name: str) -> Path:
        return Path(self.run_dir) / name


Stream = tuple["array[int]", "array[int]"]  # send times, acknowledgement times
RunFigures = dict[str, float]
HeadLogs = dict[int, tuple["array[int]", "array[int]"]]  # by ring: times read, heads
Heads = Mapping[int, tuple[Sequence[int], Sequence[int]]]  # HeadLogs, read


def paced(
    rate: int,
    stop: threading.Event,
    burst: Callable[[int, int], None],
    idle: Callable[[float], None],
    first: int,
) -> int:
    """Send events from `first` at `rate` in bursts every BURST_S until `stop`; a late burst
    is followed at once by the next. `idle` may return early (poll() does)."""
    per_burst = max(1, round(rate * BURST_S))
    start = time.monotonic()
    sent = 0
    while not stop.is_set():
        burst(first + sent, first + sent + per_burst)
        sent += per_burst
        due = start + sent / per_burst * BURST_S
        while (wait := due - time.monotonic()) > 0:
            idle(wait)
    return sent


def log_heads(rings: Mapping[int, SegmentedQueue], logs: HeadLogs, done: threading.Event) -> None:
    """Log each ring's head_seq at each change, read every HEAD_POLL_S and once at `done`."""
    finished = False
    while not finished:
        finished = done.wait(HEAD_POLL_S)
        for partition, ring in rings.items():
            times, heads = logs[partition]
            if (head := ring.head_seq) != heads[-1]:
                times.append(time.monotonic_ns())
                heads.append(head)


def ack_times_from_heads(
    partitions: Sequence[int], first_seq: Mapping[int, int], logs: Heads
) -> array[int]:
    """Each event's acknowledgement time: the first logged head past its sequence in ring
    `partitions[n]`, counted from `first_seq`; -1 if no read saw it acknowledged."""
    next_seq = dict(first_seq)
    out = array("q")
    for partition in partitions:
        times, heads = logs[partition]
        at = bisect.bisect_right(heads, next_seq[partition])
        next_seq[partition] += 1
        out.append(times[at] if at < len(heads) else -1)
    return out


def child_ours(spec: ChildSpec, stop: threading.Event, logs: Mapping[str, LedgerWriter]) -> Stream:
    client_started = time.monotonic_ns()
    with Spool(spec.path("spool"), spec.bootstrap) as spool:
        topic, send = spec.topic, spool.send
        spool.set_partition_count(topic, PARTITIONS)
        for index in range(WARMUP_EVENTS):
            send(topic, value_of(index), KEYS[index % KEY_SPACE])
        if spool.flush(READY_TIMEOUT_S):
            raise RuntimeError(f"warm-up events not acknowledged in {READY_TIMEOUT_S} s")
        rings = {r.partition: r.ring for r in spool.queues() if r.partition is not None}
        first_seq = {partition: ring.next_seq for partition, ring in rings.items()}
        send_ns = array("q")
        stamp, clock = send_ns.append, time.monotonic_ns
        record = functools.partial(logs["sent"].append, target=topic)

        def burst(start: int, stop_at: int) -> None:
            for index in range(start, stop_at):
                value, key = value_of(index), KEYS[index % KEY_SPACE]
                stamp(clock())
                while True:
                    try:
                        event_id = send(topic, value, key)
                        break
                    except SpoolFullError:
                        time.sleep(_FULL_RETRY_S)
                record(event_id)

        heads = {p: (array("q", [clock()]), array("q", [r.head_seq])) for p, r in rings.items()}
        done = threading.Event()
        poller = threading.Thread(target=log_heads, args=(rings, heads, done), daemon=True)
        poller.start()
        print(f"ready {client_started}", flush=True)
        sent = paced(RATE, stop, burst, time.sleep, WARMUP_EVENTS)
        left = spool.flush(FLUSH_TIMEOUT_S)
        done.set()
        poller.join()
        if left:
            raise RuntimeError(f"{left} events unacknowledged at stop")
        # Each ring must hold its keys' events, warm-up included: the anchor's are checked too.
        partitions = [PARTITION_OF_KEY[i % KEY_SPACE] for i in range(WARMUP_EVENTS + sent)]
        ends = {partition: ring.next_seq for partition, ring in rings.items()}
        if ends != dict(Counter(partitions)):
            raise RuntimeError(f"ring ends {ends}, but the keys make {dict(Counter(partitions))}")
        return send_ns, ack_times_from_heads(partitions[WARMUP_EVENTS:], first_seq, heads)


def child_anchor(
    spec: ChildSpec, stop: threading.Event, logs: Mapping[str, LedgerWriter]
) -> Stream:
    errors: list[str] = []
    failed: list[str] = []
    client_started = time.monotonic_ns()
    producer: Any = confluent_kafka.Producer(
        anchor_config(spec.bootstrap, lambda error: errors.append(str(error)))
    )
    produce, poll, topic, ids = producer.produce, producer.poll, spec.topic, EventIdGenerator()
    send_ns, ack_ns = array("q"), array("q")
    clock = time.monotonic_ns
    record = functools.partial(logs["sent"].append, target=topic)
    delivered = functools.partial(logs["delivered"].append, target=topic)

    def on_delivery(slot: int, event_id: str, error: Any, message: Any) -> None:
        """Stamp an acknowledgement; check a warm-up event (slot -1) is where ours puts it."""
        if error is not None:
            failed.append(str(error))
        elif slot >= 0:
            ack_ns[slot] = clock()
            delivered(event_id)
        elif message.partition() != partition_for_key(message.key(), PARTITIONS):
            failed.append(f"{message.key()!r} went to partition {message.partition()}")

    def send(index: int, slot: int) -> str:
        value, key, event_id = value_of(index), KEYS[index % KEY_SPACE], ids.next_id()
        callback = functools.partial(on_delivery, slot, event_id)
        if slot >= 0:
            ack_ns.append(-1)
            send_ns.append(clock())
        while True:
            try:
                produce(topic, value, key, headers=[("event_id", event_id)], on_delivery=callback)
                return event_id
            except BufferError:
                poll(_BUFFER_RETRY_S)

    def burst(start: int, stop_at: int) -> None:
        for index in range(start, stop_at):
            record(send(index, len(send_ns)))
        poll(0)

    for index in range(WARMUP_EVENTS):
        send(index, -1)
    if producer.flush(READY_TIMEOUT_S) or failed:
        raise RuntimeError(f"warm-up events not delivered in {READY_TIMEOUT_S} s: {failed[:3]}")
    print(f"ready {client_started}", flush=True)
    paced(RATE, stop, burst, poll, WARMUP_EVENTS)
    if (left := producer.flush(FLUSH_TIMEOUT_S)) or failed:
        raise RuntimeError(f"{left} unacknowledged at stop, {failed[:3]} failed; {errors[:3]}")
    return send_ns, ack_ns


def child_main(argv: Sequence[str]) -> int:
    """Stream until "stop" comes on stdin, then write its send and acknowledgement times."""
    spec = ChildSpec(**json.loads(argv[0]))
    stop = threading.Event()

    def watch_stdin() -> None:
        sys.stdin.readline()  # "stop", or nothing once the parent is gone
        stop.set()

    threading.Thread(target=watch_stdin, daemon=True).start()
    logs = {log: LedgerWriter(spec.path(f"{log}.ids")) for log in LOGS}
    stream = child_ours if spec.side == "ours" else child_anchor
    with spec.path("result.bin").open("wb") as handle:
        for times in stream(spec, stop, logs):  # send times, then acknowledgement times
            times.tofile(handle)
    return 0


@dataclass(frozen=True, slots=True)
class FaultTimes:
    """When each fault began (CLOCK_MONOTONIC, ns): before its first control call (`up`: after)."""

    moved: int
    down: int
    up: int
    client_started: int
    killed: int | None = None

    @property
    def down_phase_s(self) -> float:
        """Where the broker's loss fell in the client's 1 s timer."""
        return ((self.down - self.client_started) % CLIENT_TIMER_NS) / 1e9


def settle_s(send_ns: Sequence[int], ack_ns: Sequence[int], at_ns: int) -> float:
    """From `at_ns` until every event sent before it was acknowledged (0: all were)."""
    last = at_ns
    for sent, acked in zip(send_ns, ack_ns, strict=True):
        if sent < at_ns:
            if acked < 0:
                raise ValueError("an event sent before the moment was never acknowledged")
            last = max(last, acked)
    return (last - at_ns) / 1e9


def backlog_at(send_ns: Sequence[int], ack_ns: Sequence[int], at_ns: int) -> int:
    pairs = zip(send_ns, ack_ns, strict=True)
    return sum(1 for sent, acked in pairs if sent < at_ns and (acked < 0 or acked > at_ns))


def longest_wait_s(send_ns: Sequence[int], ack_ns: Sequence[int], start: int, end: int) -> float:
    pairs = zip(send_ns, ack_ns, strict=True)
    return max(((a - s) / 1e9 for s, a in pairs if start <= s < end), default=0.0)


def run_figures(send_ns: Sequence[int], ack_ns: Sequence[int], faults: FaultTimes) -> RunFigures:
    """One run's figures, named as in the result, where each side reports their medians."""
    if missing := sum(1 for acked in ack_ns if acked < 0):
        raise RuntimeError(f"{missing} events never acknowledged")
    waits = sorted(acked - sent for sent, acked in zip(send_ns, ack_ns, strict=True))
    return {
        "recovery_s": round(settle_s(send_ns, ack_ns, faults.up), 4),
        "p50_ack_ms": round(percentile(waits, 50.0, presorted=True) / 1e6, 3),
        "p99_ack_ms": round(percentile(waits, 99.0, presorted=True) / 1e6, 3),
        "max_ack_ms": round(waits[-1] / 1e6, 3),
        "backlog_at_up": backlog_at(send_ns, ack_ns, faults.up),
        "outage_stall_s": round(longest_wait_s(send_ns, ack_ns, faults.down, faults.up), 4),
        "leader_move_settle_s": round(settle_s(send_ns, ack_ns, faults.moved), 4),
        "broker_down_settle_s": round(settle_s(send_ns, ack_ns, faults.down), 4),
        "events": len(send_ns),
    }


@dataclass(frozen=True, slots=True)
class KillFigures(Tally):
    """One SIGKILLed child's tally, its delivery reports' (the anchor) or backlog (ours)."""

    side: str
    repetition: int
    down_phase_s: float
    kill_after_down_s: float
    delivery_acknowledged: int | None
    delivery_acknowledged_lost: int | None
    found_in_topic: int
    backlog_at_restart: int | None


def sleep_until(deadline_ns: int) -> None:
    time.sleep(max(0.0, (deadline_ns - time.monotonic_ns()) / 1e9))


def down_at(earliest_ns: int, client_started_ns: int, phase: float) -> int:
    """The first moment from `earliest_ns` `phase` s past a whole second of the client's life."""
    offset = round(phase * CLIENT_TIMER_NS)
    seconds = math.ceil((earliest_ns - client_started_ns - offset) / CLIENT_TIMER_NS)
    return client_started_ns + offset + max(0, seconds) * CLIENT_TIMER_NS


@contextmanager
def faulted_run(
    name: str,
    side: str,
    session: Session,
    phases: Phases,
    phase: float,
    *,
    at_peak: Callable[[Child, ChildSpec], int | None] = lambda _child, _spec: None,
) -> Iterator[tuple[ChildSpec, Child, FaultTimes]]:
    """`side`'s child on a fresh cluster through the faults, the broker's loss `phase` s into
    the client's 1 s timer, `at_peak` `phases.kill_after_down_s` into the outage."""
    topic = f"bench-failover-{name}"
    directory = session.scratch / name
    directory.mkdir(parents=True)
    with session.cluster(name, BROKERS) as cluster:
        cluster.create_topic(topic, PARTITIONS, REPLICATION)
        for partition, leader in INITIAL_LEADERS.items():
            cluster.set_leader(topic, partition, leader)
        spec = ChildSpec(side, cluster.bootstrap_servers, topic, os.fspath(directory))
        argv, stderr = [json.dumps(asdict(spec))], spec.path("child.stderr")
        child = Child.of_script(f"{side} child", __file__, argv, stderr, piped=True)
        try:
            word, _, stamp = child.start().read_line().partition(" ")
            if word != "ready":
                raise RuntimeError(f"{child.name} did not start: {child.stderr_tail()}")
            client_started_ns = int(stamp)
            steady = round(phases.steady_s * 1e9)
            planned_down = down_at(time.monotonic_ns() + 2 * steady, client_started_ns, phase)
            sleep_until(planned_down - steady)
            moved = time.monotonic_ns()
            for partition, leader in MOVED_LEADERS.items():
                cluster.set_leader(topic, partition, leader)
            sleep_until(planned_down)
            down = time.monotonic_ns()
            cluster.broker_down(DOWN_BROKER)
            for partition, leader in OUTAGE_LEADERS.items():
                cluster.set_leader(topic, partition, leader)
            sleep_until(down + round(phases.kill_after_down_s * 1e9))
            killed = at_peak(child, spec)
            sleep_until(down + round(phases.outage_s * 1e9))
            cluster.broker_up(DOWN_BROKER)
            up = time.monotonic_ns()
            yield spec, child, FaultTimes(moved, down, up, client_started_ns, killed)
        finally:
            child.terminate()


def measure(side: str, rep: int, session: Session, phases: Phases, phase: float) -> RunFigures:
    with faulted_run(f"{side}-{rep}", side, session, phases, phase) as (spec, child, faults):
        sleep_until(faults.up + round(phases.tail_s * 1e9))
        child.stop(FLUSH_TIMEOUT_S + 30)
    values = array("q", spec.path("result.bin").read_bytes())
    count = len(values) // 2
    return run_figures(values[:count], values[count:], faults)


def kill_run(side: str, rep: int, session: Session, phases: Phases, phase: float) -> KillFigures:
    """SIGKILL `side` in mid-outage (ours is restarted at once, as by a supervisor)."""
    restarted: list[tuple[Spool, int]] = []  # ours: the spool and its backlog at restart

    def kill(child: Child, spec: ChildSpec) -> int:
        child.kill()
        killed = time.monotonic_ns()
        if side == "ours":
            spool = Spool(spec.path("spool"), spec.bootstrap)
            restarted.append((spool, spool.unacknowledged()))
        return killed

    name = f"{side}-kill-{rep}"
    with faulted_run(name, side, session, phases, phase, at_peak=kill) as (spec, _child, faults):
        for spool, _ in restarted:
            with spool:
                if left := spool.flush(FLUSH_TIMEOUT_S):
                    raise RuntimeError(f"{left} spooled events not acknowledged after restart")
        time.sleep(SETTLE_S)
        consumer = Consumer({"bootstrap.servers": spec.bootstrap, "group.id": f"bench-{name}"})
        # Each partition's first offset: above 0 when the mock dropped old records.
        partitions = [TopicPartition(spec.topic, p) for p in range(PARTITIONS)]
        starts = [consumer.get_watermark_offsets(tp, timeout=10)[0] for tp in partitions]
        consumer.close()
        if any(starts):
            raise RuntimeError(f"the mock dropped the oldest records of {spec.topic}: {starts}")
        seen = drain(spec.bootstrap, [spec.topic], FLUSH_TIMEOUT_S)
    sent, acked = ({line.event_id for line in read_lines(spec.path(f"{log}.ids"))} for log in LOGS)
    delivered = ledger(acked, seen) if side == "anchor" else None
    assert faults.killed is not None
    return KillFigures(
        **asdict(tally(sent, seen)),
        side=side,
        repetition=rep,
        down_phase_s=round(faults.down_phase_s, 3),
        kill_after_down_s=round((faults.killed - faults.down) / 1e9, 3),
        delivery_acknowledged=None if delivered is None else delivered.sent,
        delivery_acknowledged_lost=None if delivered is None else delivered.lost,
        found_in_topic=sum(seen.values()),
        backlog_at_restart=restarted[0][1] if restarted else None,
    )


# The timed figures: name, the run figure of each side's median, unit, anchor; and titles.
_TIMED = (
    (FIGURE, "recovery_s", "s", "a bare idempotent Producer with the sender's settings"),
    ("failover_p99_send_to_ack_ms", "p99_ack_ms", "ms", "the same producer"),
    ("failover_outage_stall_s", "outage_stall_s", "s", "the same producer"),
)
_TITLES = (
    "From a failed broker's return until every event sent is acknowledged",
    "p99 send to acknowledgement through leader moves and a broker outage",
    "Longest send-to-acknowledgement wait of an event sent while a broker was down",
)


def build_result(
    runs: Mapping[str, Sequence[RunFigures]],
    kills: Sequence[KillFigures],
    phases: Phases,
    provenance: Mapping[str, object],
) -> dict[str, object]:
    """The result; `runs` by side, in the order of their repetitions."""
    sides: dict[str, RunFigures] = {}
    kill_sides: dict[str, dict[str, float | int | None]] = {}
    for side in SIDES:
        own, own_kills = runs[side], [kill for kill in kills if kill.side == side]
        sides[side] = {"runs": len(own)} | {k: round(median(r[k] for r in own), 4) for k in own[0]}
        delivered = [kill.delivery_acknowledged_lost or 0 for kill in own_kills if side == "anchor"]
        backlogs = [kill.backlog_at_restart or 0 for kill in own_kills if side == "ours"]
        kill_sides[side] = {
            **summary(own_kills),
            "delivery_acknowledged_lost": median(delivered) if delivered else None,
            "backlog_at_restart": median(backlogs) if backlogs else None,
        }
    ours, anchor = sides["ours"], sides["anchor"]
    lower_is_better = functools.partial(figure, higher_is_better=False)
    # Seconds that can be a few milliseconds: a rerun may move each ratio a lot.
    timed = [
        lower_is_better(name, ours[key], anchor[key], unit=unit, title=title, anchor_is=anchor_is)
        | {"tolerance": 1.0}
        for (name, key, unit, anchor_is), title in zip(_TIMED, _TITLES, strict=True)
    ]
    lost = {side: float(kill_sides[side]["lost"] or 0) for side in SIDES}
    delivery_lost = kill_sides["anchor"]["delivery_acknowledged_lost"]
    lost_per_kill = lost_figure(
        "failover_sigkill_acknowledged_events_lost_per_kill",
        lost["ours"],
        lost["anchor"],
        title=f"Acknowledged events lost to a SIGKILL {phases.kill_after_down_s:g} s into "
        f"a {phases.outage_s:g} s broker outage (median)",
        anchor_is="a bare Producer: produce() returned",
    ) | {"anchor_delivery_acknowledged_lost": delivery_lost}
    return {
        **timed[0],
        "figures": [*timed[1:], lost_per_kill],
        "lost_per_kill": {
            "ours_send_returned": lost["ours"],
            "anchor_produce_returned": lost["anchor"],
            "anchor_delivery_acknowledged": delivery_lost,
        },
        "sides": sides,
        "kill_sides": kill_sides,
        "kills": [asdict(k) for k in kills],
        "payload_bytes": PAYLOAD_BYTES,
        "partitions": PARTITIONS,
        "settings": {
            "rate_events_per_s": RATE,
            "burst_every_ms": BURST_S * 1000,
            "brokers": BROKERS,
            "replication": REPLICATION,
            "key_space": KEY_SPACE,
            "warmup_events": WARMUP_EVENTS,
            "head_poll_ms": HEAD_POLL_S * 1000,
            "phases_s": asdict(phases),
            "faults": {
                "initial_leaders": INITIAL_LEADERS,
                "leader_move": MOVED_LEADERS,
                "broker_down": DOWN_BROKER,
                "outage_leaders": OUTAGE_LEADERS,
            },
            **compared_settings(),
        },
        **provenance,
        "repetitions": ours["runs"],
        "kills_per_side": kill_sides["ours"]["kills"],
    }


def run(args: BenchArgs) -> dict[str, object]:
    repeats: int = args.namespace.repeats or RUNS[args.quick]
    kills = KILLS[args.quick]
    phases = Phases(STEADY_S[args.quick], OUTAGE_S, TAIL_S[args.quick], OUTAGE_S / 2)
    runs: dict[str, list[RunFigures]] = {side: [] for side in SIDES}
    kill_list: list[KillFigures] = []
    with Session(args, "failover") as session:
        progress(f"{repeats} runs and {kills} kills per side; scratch on {session.filesystem}")
        for rep in range(max(repeats, kills)):
            for side in alternate(rep, SIDES) if rep < repeats else ():
                runs[side].append(r := measure(side, rep, session, phases, (rep + 0.5) / repeats))
                progress(f"run {rep + 1} {side}: " + ", ".join(f"{k} {v:g}" for k, v in r.items()))
            for side in alternate(rep, SIDES) if rep < kills else ():
                kill_list.append(k := kill_run(side, rep, session, phases, (rep + 0.5) / kills))
                progress(f"kill {rep + 1} {side}: {k.lost:,} of {k.acknowledged:,} lost")
        mock = "librdkafka's mock cluster, 3 brokers, in a process of its own, same machine"
        provenance = session.provenance(mock)
    return build_result(runs, kill_list, phases, provenance)


def main(argv: Sequence[str] | None = None) -> int:
    if (child_argv := child_arguments(argv)) is not None:
        return child_main(child_argv)
    return bench_main("Broker failover: Spool.send() against a bare Producer", run, argv)


if __name__ == "__main__":
    sys.exit(main())
