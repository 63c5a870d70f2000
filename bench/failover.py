"""Broker failover under a steady keyed stream: recovery once the broker is back, send to
acknowledgement, and what a SIGKILL in mid-outage takes, `Spool.send()` against a bare
idempotent `confluent_kafka.Producer` on a 3-broker cluster.

The cluster is librdkafka's mock cluster (`eventspool.broker.mock`), in a process of its
own on the same machine, fresh for every run, with a fresh topic of 6 partitions
(replication 3, which the mock does not do); partition p starts led by broker p % 3 + 1.
Each side runs in a child process sending the same stream: keys cycling over 10k users
(b"user-0" .. b"user-9999"), JSON-like 100-byte values numbered by event, 20,000
events/s in bursts every 5 ms, paced by the clock (a late burst is followed at once by
the next). The child sends 2,000 warm-up events and waits for them (both sides must put
them on the same partitions), reports ready, and sends until told to stop. The parent
applies the same faults to both sides, timed from the ready report:

    steady phase: 2 s (1 s with --quick), then up to 1 s more, to place the broker's
      loss at a set phase of the client's 1 s timer (see 3.)
    leader move: every partition to the next broker (p -> (p + 1) % 3 + 1); as long again
    outage: broker 3 down and at once its partitions (1 and 4) led by brokers 1 and 2,
      as a controller would; 5 s later broker 3 up again (it leads nothing any more)
    tail: 4 s (2 s with --quick), then stop: the child waits for every acknowledgement

Sides:

* ours: `Spool.send()` with default settings. An event is acknowledged when its ring's
  head_seq moves past it, which the sender does only on the broker's acknowledgement: a
  thread of the child reads the 6 rings' head_seq every 1 ms and logs each change with
  the time of the read; each event's ring sequence is known (Kafka's murmur2 of its key,
  checked against the rings' ends after the run). A read can come about 1 ms (plus a
  wait for the GIL) late: that error counts against ours.
* the anchor: a `confluent_kafka.Producer` with the settings the sender gives its own
  producer plus partitioner=murmur2_random, so keys land where the spool puts them. Each
  event carries an `event_id` header and a delivery callback that stamps its
  acknowledgement time; between bursts the child waits in poll().

Send times are taken just before `send()` / `produce()`; all times are CLOCK_MONOTONIC,
shared by the children and the parent, which stamps the leader move and the broker's loss
just before its first control call, and the broker's return once it was applied. Figures:

1. recovery (the headline): from broker 3 back up until the last event sent before then
   is acknowledged (0 if nothing was outstanding). Both sides move to the new leaders
   within about a second of the broker's loss, so this is about one send-to-acknowledgement
   time of the events sent just before the broker's return. Also reported: the same from
   the leader move and from the broker's loss (`leader_move_settle_s`, ...).
2. p99 (p50, max in the JSON) of send to acknowledgement over every event after the
   warm-up, faults included.
3. the failover itself: the longest send-to-acknowledgement wait of an event sent while
   broker 3 was down. librdkafka re-queries a lost leader on a 1 s timer of its own, from
   the client's creation, so the wait depends on where the fault falls in that second:
   in repetition r of N the broker goes down (r + 0.5) / N s past a whole second of the
   client's life (the phases are in the JSON).
4. acknowledged events lost to a SIGKILL halfway through the outage (--kill-at): the
   same run, but the parent SIGKILLs the child then. The child records every event its
   caller would count as handed over in a ledger file that survives the kill
   (`eventspool.testing.ledger`): ours once `send()` returned; the anchor once
   `produce()` returned and, in a second file, once its delivery report came without
   error. Ours is restarted at once on the same spool directory (as a supervisor would)
   and flushed once the broker is back; 0.5 s later the parent reads every partition to
   its end (refusing a run whose oldest records the mock dropped) and compares event ids.
   Ratio (anchor + 1) / (ours + 1).

Ratios 1-3 are anchor / ours. Runs alternate between ours and the anchor, each on a fresh
cluster; each figure is the median over the runs (loss: over the kills): 5 runs and 3
kills per side, 1 and 1 with --quick (--repeats, --kills).
"""

from __future__ import annotations

import argparse
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
from eventspool.testing.ledger import LedgerReader, LedgerWriter
from eventspool.verify import ledger
from harness.child import Child, child_arguments
from harness.cli import BenchArgs, bench_main
from harness.figures import figure
from harness.ledger import Tally, lost_figure, summary, tally
from harness.output import progress
from harness.producer import anchor_config, compared_settings
from harness.runs import alternate, median, percentile, safe_ratio
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
# With --quick one repetition of each and one kill per side fit in a minute.
RUNS = {True: 1, False: 5}
KILLS = {True: 1, False: 3}
HEAD_POLL_S = 0.001
# librdkafka re-queries leaders on a 1 s timer of each client's own, from its creation.
CLIENT_TIMER_NS = 1_000_000_000
READY_TIMEOUT_S = 60.0
FLUSH_TIMEOUT_S = 120.0
SETTLE_S = 0.5
CONSUME_TIMEOUT_S = 120.0
LOGS = ("sent", "delivered")  # the child's ledgers: send() or produce() returned; delivered
SENDER_NOTES: tuple[str, ...] = ("delivered", "retried_batches", "broker_errors", "producer_resets")
SENDER_NOTES += ("reconnects", "dead_letters", "last_error")
_BUFFER_RETRY_S = 0.01
_FULL_RETRY_S = 0.001
_ACTIONS = (b"click", b"view", b"purchase", b"login", b"logout", b"search", b"share", b"like")
_MIX = 0x9E3779B97F4A7C15
_MASK64 = (1 << 64) - 1
KEYS = [b"user-%d" % user for user in range(KEY_SPACE)]


def value_of(index: int) -> bytes:
    """Event `index`'s value: 100 bytes of JSON-like text (lz4 finds some to squeeze)."""
    mix = (index * _MIX) & _MASK64
    action = _ACTIONS[mix % len(_ACTIONS)]
    text = b'{"u":%d,"n":%d,"a":"%s","amt":%d,"r":"%016x","p":"' % (
        index % KEY_SPACE,
        index,
        action,
        mix >> 44,
        mix,
    )
    return text.ljust(PAYLOAD_BYTES - 2, b"x") + b'"}'


@dataclass(frozen=True, slots=True)
class Phases:
    """The fault schedule, in seconds, from the child's ready report."""

    steady_s: float
    outage_s: float
    tail_s: float
    kill_after_down_s: float

    @property
    def total_s(self) -> float:
        return 2 * self.steady_s + self.outage_s + self.tail_s


def initial_leader(partition: int) -> int:
    return partition % BROKERS + 1


def moved_leader(partition: int) -> int:
    """Every partition's leadership moves to the next broker."""
    return (partition + 1) % BROKERS + 1


def outage_leaders(down: int) -> dict[int, int]:
    """The partitions `down` leads after the move, each to a live broker, alternately."""
    live = [broker for broker in range(1, BROKERS + 1) if broker != down]
    led = [p for p in range(PARTITIONS) if moved_leader(p) == down]
    return {partition: live[n % len(live)] for n, partition in enumerate(led)}


@dataclass(frozen=True, slots=True)
class ChildSpec:
    """A child's side and stream; `run_dir` holds its spool, its ledgers and its results."""

    side: str
    bootstrap: str
    topic: str
    run_dir: str

    @property
    def spool(self) -> Path:
        return Path(self.run_dir) / "spool"

    def path(self, name: str) -> Path:
        return Path(self.run_dir) / name


Stream = tuple["array[int]", "array[int]", dict[str, Any]]  # send times, ack times, notes


def paced(
    rate: int,
    stop: threading.Event,
    burst: Callable[[int, int], None],
    idle: Callable[[float], None],
    first: int,
) -> int:
    """Send events first, first+1, ... in bursts every BURST_S, at `rate` events/s, until
    `stop` is set; a burst late on the clock is followed at once by the next one.

    `idle(seconds)` may return early (poll() does once it served a callback): it is called
    again until the next burst is due."""
    per_burst = max(1, round(rate * BURST_S))
    start = time.monotonic()
    sent = 0
    ticks = 0
    while not stop.is_set():
        burst(first + sent, first + sent + per_burst)
        sent += per_burst
        ticks += 1
        due = start + ticks * BURST_S
        while (wait := due - time.monotonic()) > 0:
            idle(wait)
    return sent


@contextmanager
def head_logs(
    rings: Mapping[int, SegmentedQueue],
) -> Iterator[dict[int, tuple[array[int], array[int]]]]:
    """Each ring's (times read, heads) at every change of its head_seq: a thread reads
    them every HEAD_POLL_S while the block runs, and once more at its end."""
    logs = {
        p: (array("q", [time.monotonic_ns()]), array("q", [r.head_seq])) for p, r in rings.items()
    }
    stop = threading.Event()

    def poll() -> None:
        while True:
            stopping = stop.wait(HEAD_POLL_S)
            for partition, ring in rings.items():
                head = ring.head_seq
                times, heads = logs[partition]
                if head != heads[-1]:
                    times.append(time.monotonic_ns())
                    heads.append(head)
            if stopping:
                return

    thread = threading.Thread(target=poll, name="bench-head-poller", daemon=True)
    thread.start()
    try:
        yield logs
    finally:
        stop.set()
        thread.join()


def ack_times_from_heads(
    partitions: Sequence[int],
    first_seq: Mapping[int, int],
    head_logs: Mapping[int, tuple[Sequence[int], Sequence[int]]],
) -> array[int]:
    """Each event's acknowledgement time: the first logged head past its ring sequence.

    Event n went to ring `partitions[n]` and took the next sequence of that ring, starting
    at `first_seq`; `head_logs` maps a ring to (times, heads), heads increasing. -1: not
    acknowledged by the last read.
    """
    next_seq = dict(first_seq)
    position = dict.fromkeys(head_logs, 0)
    out = array("q", bytes(8 * len(partitions)))
    for index, partition in enumerate(partitions):
        seq = next_seq[partition]
        next_seq[partition] = seq + 1
        times, heads = head_logs[partition]
        at = position[partition]
        while at < len(heads) and heads[at] <= seq:
            at += 1
        position[partition] = at
        out[index] = times[at] if at < len(heads) else -1
    return out


def child_ours(spec: ChildSpec, stop: threading.Event, logs: Mapping[str, LedgerWriter]) -> Stream:
    client_started = time.monotonic_ns()
    spool = Spool(spec.spool, spec.bootstrap)
    try:
        topic, send = spec.topic, spool.send
        spool.set_partition_count(topic, PARTITIONS)
        for index in range(WARMUP_EVENTS):
            send(topic, value_of(index), KEYS[index % KEY_SPACE])
        if spool.flush(READY_TIMEOUT_S):
            raise RuntimeError(f"warm-up events not acknowledged in {READY_TIMEOUT_S} s")
        rings = {
            r.partition: r.ring
            for r in spool.queues()
            if r.topic == topic and r.partition is not None
        }
        if sorted(rings) != list(range(PARTITIONS)):
            raise RuntimeError(f"warm-up opened rings {sorted(rings)}, not {PARTITIONS}")
        first_seq = {partition: ring.next_seq for partition, ring in rings.items()}
        send_ns = array("q")
        stamp, clock = send_ns.append, time.monotonic_ns
        record = functools.partial(logs["sent"].append, target=topic)

        def burst(start: int, stop_at: int) -> None:
            for index in range(start, stop_at):
                value = value_of(index)
                key = KEYS[index % KEY_SPACE]
                stamp(clock())
                while True:
                    try:
                        event_id = send(topic, value, key)
                        break
                    except SpoolFullError:
                        time.sleep(_FULL_RETRY_S)
                record(event_id)

        with head_logs(rings) as heads:
            print(f"ready {client_started}", flush=True)
            sent = paced(RATE, stop, burst, time.sleep, WARMUP_EVENTS)
            left = spool.flush(FLUSH_TIMEOUT_S)
        partition_of = [partition_for_key(key, PARTITIONS) for key in KEYS]
        partitions = [
            partition_of[i % KEY_SPACE] for i in range(WARMUP_EVENTS, WARMUP_EVENTS + sent)
        ]
        expected_end = Counter(first_seq)
        expected_end.update(partitions)
        ends = {partition: ring.next_seq for partition, ring in rings.items()}
        if ends != dict(expected_end):
            raise RuntimeError(f"ring ends {ends} are not the expected {dict(expected_end)}")
        assert spool.sender is not None
        notes = {
            "unacknowledged_at_stop": left,
            "warmup_partition_counts": [first_seq[p] for p in range(PARTITIONS)],
            **{name: getattr(spool.sender.counters, name) for name in SENDER_NOTES},
            "head_reads_logged": sum(len(times) for times, _ in heads.values()),
        }
        return send_ns, ack_times_from_heads(partitions, first_seq, heads), notes
    finally:
        spool.close(timeout=1.0)


def child_anchor(
    spec: ChildSpec, stop: threading.Event, logs: Mapping[str, LedgerWriter]
) -> Stream:
    errors: list[str] = []
    client_started = time.monotonic_ns()
    producer: Any = confluent_kafka.Producer(
        anchor_config(spec.bootstrap, lambda error: errors.append(str(error)))
    )
    produce, poll, topic = producer.produce, producer.poll, spec.topic
    ids = EventIdGenerator()
    warm_counts = [0] * PARTITIONS
    failed: list[str] = []

    def on_warm_delivery(error: Any, message: Any) -> None:
        if error is None:
            warm_counts[message.partition()] += 1
        else:
            failed.append(str(error))

    for index in range(WARMUP_EVENTS):
        headers = [("event_id", ids.next_id())]
        value, key = value_of(index), KEYS[index % KEY_SPACE]
        produce(topic, value, key, headers=headers, on_delivery=on_warm_delivery)
    if producer.flush(READY_TIMEOUT_S) or failed:
        raise RuntimeError(f"warm-up events not delivered in {READY_TIMEOUT_S} s: {failed[:3]}")
    send_ns = array("q")
    ack_ns = array("q")
    event_ids: list[str] = []
    clock = time.monotonic_ns
    record = functools.partial(logs["sent"].append, target=topic)
    delivered = functools.partial(logs["delivered"].append, target=topic)

    def on_delivery(slot: int, error: Any, _message: Any) -> None:
        if error is None:
            ack_ns[slot] = clock()
            delivered(event_ids[slot])
        else:
            failed.append(str(error))

    def burst(start: int, stop_at: int) -> None:
        for index in range(start, stop_at):
            value = value_of(index)
            key = KEYS[index % KEY_SPACE]
            event_id = ids.next_id()
            slot = len(send_ns)
            event_ids.append(event_id)
            ack_ns.append(-1)
            callback = functools.partial(on_delivery, slot)
            send_ns.append(clock())
            while True:
                try:
                    produce(
                        topic, value, key, headers=[("event_id", event_id)], on_delivery=callback
                    )
                    break
                except BufferError:
                    poll(_BUFFER_RETRY_S)
            record(event_id)
        poll(0)

    print(f"ready {client_started}", flush=True)
    paced(RATE, stop, burst, poll, WARMUP_EVENTS)
    notes = {
        "unacknowledged_at_stop": producer.flush(FLUSH_TIMEOUT_S),
        "warmup_partition_counts": warm_counts,
        "failed_deliveries": len(failed),
        "first_failures": failed[:3],
        "error_cb_calls": len(errors),
        "first_errors": errors[:3],
    }
    return send_ns, ack_ns, notes


def child_main(argv: Sequence[str]) -> int:
    """Stream until "stop" comes on stdin, then write the send and acknowledgement times
    (result.bin) and the notes (result.json) in its run directory."""
    spec = ChildSpec(**json.loads(argv[0]))
    stop = threading.Event()

    def watch_stdin() -> None:
        for line in sys.stdin:
            if line.strip() == "stop":
                break
        stop.set()

    threading.Thread(target=watch_stdin, daemon=True).start()
    logs = {log: LedgerWriter(spec.path(f"{log}.ids")) for log in LOGS}
    stream = child_ours if spec.side == "ours" else child_anchor
    send_ns, ack_ns, notes = stream(spec, stop, logs)
    with spec.path("result.bin").open("wb") as handle:
        send_ns.tofile(handle)
        ack_ns.tofile(handle)
    spec.path("result.json").write_text(json.dumps(notes), encoding="utf-8")
    return 0


@dataclass(frozen=True, slots=True)
class FaultTimes:
    """When each fault began (CLOCK_MONOTONIC, ns): `moved` and `down` just before the
    first control call, `up` once the broker is back (its control call returned)."""

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
    """Events sent before `at_ns` and not acknowledged by then."""
    pairs = zip(send_ns, ack_ns, strict=True)
    return sum(1 for sent, acked in pairs if sent < at_ns and (acked < 0 or acked > at_ns))


def longest_wait_s(send_ns: Sequence[int], ack_ns: Sequence[int], start: int, end: int) -> float:
    """The longest send-to-acknowledgement wait of an event sent in [start, end)."""
    pairs = zip(send_ns, ack_ns, strict=True)
    return max(((a - s) / 1e9 for s, a in pairs if start <= s < end), default=0.0)


@dataclass(frozen=True, slots=True)
class RunFigures:
    side: str
    repetition: int
    down_phase_s: float
    events: int
    recovery_s: float
    p50_ms: float
    p99_ms: float
    max_ms: float
    backlog_at_up: int
    outage_stall_s: float
    move_settle_s: float
    down_settle_s: float
    notes: Mapping[str, Any]


def run_figures(
    side: str,
    repetition: int,
    *,
    send_ns: Sequence[int],
    ack_ns: Sequence[int],
    faults: FaultTimes,
    notes: Mapping[str, Any],
) -> RunFigures:
    if not send_ns:
        raise ValueError(f"{side}: no events were sent")
    if missing := sum(1 for acked in ack_ns if acked < 0):
        raise RuntimeError(f"{side}: {missing} events never acknowledged; notes {notes}")
    waits = sorted(acked - sent for sent, acked in zip(send_ns, ack_ns, strict=True))
    return RunFigures(
        side=side,
        repetition=repetition,
        down_phase_s=round(faults.down_phase_s, 3),
        events=len(send_ns),
        recovery_s=round(settle_s(send_ns, ack_ns, faults.up), 4),
        p50_ms=round(percentile(waits, 50.0, presorted=True) / 1e6, 3),
        p99_ms=round(percentile(waits, 99.0, presorted=True) / 1e6, 3),
        max_ms=round(waits[-1] / 1e6, 3),
        backlog_at_up=backlog_at(send_ns, ack_ns, faults.up),
        outage_stall_s=round(longest_wait_s(send_ns, ack_ns, faults.down, faults.up), 4),
        move_settle_s=round(settle_s(send_ns, ack_ns, faults.moved), 4),
        down_settle_s=round(settle_s(send_ns, ack_ns, faults.down), 4),
        notes=dict(notes),
    )


@dataclass(frozen=True, slots=True)
class KillFigures(Tally):
    """What one SIGKILLed child had acknowledged and what of it reached the topic; for
    the anchor also what its delivery reports had acknowledged, for ours its backlog."""

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
    """The first moment from `earliest_ns` that lies `phase` of a second past a whole
    second of the client's life."""
    offset = round(phase * CLIENT_TIMER_NS)
    seconds = math.ceil((earliest_ns - client_started_ns - offset) / CLIENT_TIMER_NS)
    return client_started_ns + offset + max(0, seconds) * CLIENT_TIMER_NS


AtPeak = Callable[[Child, ChildSpec], int | None]


@contextmanager
def faulted_run(
    name: str,
    side: str,
    session: Session,
    phases: Phases,
    *,
    phase: float,
    at_peak: AtPeak = lambda _child, _spec: None,
) -> Iterator[tuple[ChildSpec, Child, FaultTimes]]:
    """`side`'s child on a fresh cluster and topic, taken through the fault schedule: the
    broker's loss at `phase` of the client's 1 s timer, once two steady phases have
    passed; `at_peak` runs `phases.kill_after_down_s` into the outage. The child and the
    cluster end with the block."""
    topic = f"bench-failover-{name}"
    directory = session.scratch / name
    directory.mkdir(parents=True)
    with session.cluster(name, BROKERS) as cluster:
        cluster.create_topic(topic, PARTITIONS, REPLICATION)
        for partition in range(PARTITIONS):
            cluster.set_leader(topic, partition, initial_leader(partition))
        spec = ChildSpec(side, cluster.bootstrap_servers, topic, os.fspath(directory))
        argv, stderr = [json.dumps(asdict(spec))], spec.path("child.stderr")
        child = Child.of_script(f"{side} child", __file__, argv, stderr, piped=True)
        try:
            word, _, stamp = child.start().read_line().partition(" ")
            if word != "ready":
                raise RuntimeError(f"{child.name} did not start: {child.stderr_tail()}")
            client_started_ns = int(stamp)
            started = time.monotonic_ns()
            steady = round(phases.steady_s * 1e9)
            planned_down = down_at(started + 2 * steady, client_started_ns, phase)
            sleep_until(planned_down - steady)
            moved = time.monotonic_ns()
            for partition in range(PARTITIONS):
                cluster.set_leader(topic, partition, moved_leader(partition))
            sleep_until(planned_down)
            down = time.monotonic_ns()
            cluster.broker_down(DOWN_BROKER)
            for partition, leader in outage_leaders(DOWN_BROKER).items():
                cluster.set_leader(topic, partition, leader)
            sleep_until(down + round(phases.kill_after_down_s * 1e9))
            killed = at_peak(child, spec)
            sleep_until(down + round(phases.outage_s * 1e9))
            cluster.broker_up(DOWN_BROKER)
            up = time.monotonic_ns()
            yield spec, child, FaultTimes(moved, down, up, client_started_ns, killed)
        finally:
            child.terminate()


def measure(
    side: str, repetition: int, session: Session, phases: Phases, phase: float
) -> tuple[RunFigures, list[int]]:
    """One measured run of `side`; its figures and its warm-up partition counts."""
    name = f"{side}-{repetition}"
    with faulted_run(name, side, session, phases, phase=phase) as (spec, child, faults):
        sleep_until(faults.up + round(phases.tail_s * 1e9))
        child.stop(FLUSH_TIMEOUT_S + 30)
    values = array("q")
    values.frombytes(spec.path("result.bin").read_bytes())
    count = len(values) // 2
    notes = json.loads(spec.path("result.json").read_text(encoding="utf-8"))
    result = run_figures(
        side, repetition, send_ns=values[:count], ack_ns=values[count:], faults=faults, notes=notes
    )
    return result, list(notes["warmup_partition_counts"])


def kill_run(
    side: str, repetition: int, session: Session, phases: Phases, phase: float
) -> KillFigures:
    """SIGKILL `side` in mid-outage (`Phases.kill_after_down_s`); what of its acknowledged
    events is not in the topic. Ours is restarted at once, as a supervisor would."""
    restarted: list[Spool] = []
    backlog: int | None = None

    def kill(child: Child, spec: ChildSpec) -> int:
        nonlocal backlog
        child.kill()
        killed = time.monotonic_ns()
        if side == "ours":
            restarted.append(Spool(spec.spool, spec.bootstrap))
            backlog = restarted[0].unacknowledged()
        return killed

    name = f"{side}-kill-{repetition}"
    with faulted_run(name, side, session, phases, phase=phase, at_peak=kill) as (
        spec,
        _child,
        faults,
    ):
        for spool in restarted:
            with spool:
                if left := spool.flush(FLUSH_TIMEOUT_S):
                    raise RuntimeError(f"{left} spooled events not acknowledged after restart")
        time.sleep(SETTLE_S)
        consumer = Consumer({"bootstrap.servers": spec.bootstrap, "group.id": f"bench-{name}"})
        try:  # each partition's first offset: above 0 when the mock dropped old records
            partitions = [TopicPartition(spec.topic, p) for p in range(PARTITIONS)]
            starts = [consumer.get_watermark_offsets(tp, timeout=10)[0] for tp in partitions]
        finally:
            consumer.close()
        if any(starts):
            raise RuntimeError(f"the mock dropped the oldest records of {spec.topic}: {starts}")
        seen = drain(spec.bootstrap, [spec.topic], CONSUME_TIMEOUT_S)
    acknowledged = []
    for log in LOGS:
        reader = LedgerReader(Path(spec.run_dir), f"{log}.ids")
        reader.poll()
        acknowledged.append(reader.ids(spec.topic))
    delivered = ledger(acknowledged[1], seen) if side == "anchor" else None
    assert faults.killed is not None
    return KillFigures(
        **asdict(tally(acknowledged[0], seen)),
        side=side,
        repetition=repetition,
        down_phase_s=round(faults.down_phase_s, 3),
        kill_after_down_s=round((faults.killed - faults.down) / 1e9, 3),
        delivery_acknowledged=None if delivered is None else delivered.sent,
        delivery_acknowledged_lost=None if delivered is None else delivered.lost,
        found_in_topic=sum(seen.values()),
        backlog_at_restart=backlog,
    )


# A side's summary over its runs: key, RunFigures field, digits (None: as it is).
_RUN_MEDIANS = (
    ("recovery_s", "recovery_s", 4),
    ("p50_ack_ms", "p50_ms", 3),
    ("p99_ack_ms", "p99_ms", 3),
    ("max_ack_ms", "max_ms", 3),
    ("backlog_at_up", "backlog_at_up", None),
    ("outage_stall_s", "outage_stall_s", 4),
    ("leader_move_settle_s", "move_settle_s", 4),
    ("broker_down_settle_s", "down_settle_s", 4),
    ("events", "events", None),
)
# The timed figures: name, summary key, unit, title, anchor_is.
_TIMED = (
    (
        FIGURE,
        "recovery_s",
        "s",
        "From a failed broker's return until every event sent is acknowledged",
        "a bare idempotent Producer with the sender's settings",
    ),
    (
        "failover_p99_send_to_ack_ms",
        "p99_ack_ms",
        "ms",
        "p99 send to acknowledgement through leader moves and a broker outage",
        "the same producer",
    ),
    (
        "failover_outage_stall_s",
        "outage_stall_s",
        "s",
        "Longest send-to-acknowledgement wait of an event sent while a broker was down",
        "the same producer",
    ),
)


def side_summary(runs: Sequence[RunFigures]) -> dict[str, float | int]:
    summary: dict[str, float | int] = {"runs": len(runs)}
    for key, name, digits in _RUN_MEDIANS:
        value = median(getattr(run, name) for run in runs)
        summary[key] = value if digits is None else round(value, digits)
    return summary


def kill_summary(kills: Sequence[KillFigures]) -> dict[str, float | int | None]:
    """`harness.ledger.summary` over a side's kills, with its delivery-acknowledged losses
    (the anchor) and its backlog at restart (ours)."""
    delivered = [k.delivery_acknowledged_lost for k in kills]
    backlogs = [k.backlog_at_restart for k in kills if k.backlog_at_restart is not None]
    return {
        **summary(kills),
        "delivery_acknowledged_lost": (
            None if any(d is None for d in delivered) else median(d or 0 for d in delivered)
        ),
        "backlog_at_restart": median(backlogs) if backlogs else None,
    }


def build_result(
    runs: Sequence[RunFigures],
    kills: Sequence[KillFigures],
    phases: Phases,
    provenance: Mapping[str, object],
) -> dict[str, object]:
    summaries = {side: side_summary([r for r in runs if r.side == side]) for side in SIDES}
    kill_summaries = {side: kill_summary([k for k in kills if k.side == side]) for side in SIDES}
    ours, anchor = summaries["ours"], summaries["anchor"]
    by_rep = {(r.side, r.repetition): r for r in runs}
    paired = [
        ratio
        for (side, rep), run in by_rep.items()
        if side == "ours" and ("anchor", rep) in by_rep
        if (ratio := safe_ratio(by_rep[("anchor", rep)].recovery_s, run.recovery_s)) is not None
    ]
    # Seconds that can be a few milliseconds: a rerun may move each ratio a lot.
    timed = [
        figure(
            name,
            ours[key],
            anchor[key],
            unit=unit,
            title=title,
            anchor_is=anchor_is,
            higher_is_better=False,
        )
        | {"tolerance": 1.0}
        for name, key, unit, title, anchor_is in _TIMED
    ]
    lost = {side: float(kill_summaries[side]["lost"] or 0) for side in SIDES}
    delivery_lost = kill_summaries["anchor"]["delivery_acknowledged_lost"]
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
        "recovery_s": {"ours": ours["recovery_s"], "anchor": anchor["recovery_s"]},
        "p99_ack_ms": {"ours": ours["p99_ack_ms"], "anchor": anchor["p99_ack_ms"]},
        "lost_per_kill": {
            "ours_send_returned": lost["ours"],
            "anchor_produce_returned": lost["anchor"],
            "anchor_delivery_acknowledged": delivery_lost,
        },
        "ratio_paired_median": round(median(paired), 4) if paired else None,
        "sides": summaries,
        "kill_sides": kill_summaries,
        "runs": [{k: v for k, v in asdict(r).items() if k != "notes"} for r in runs],
        "run_notes": {f"{r.side}-{r.repetition}": r.notes for r in runs},
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
                "initial_leaders": {p: initial_leader(p) for p in range(PARTITIONS)},
                "leader_move": {p: moved_leader(p) for p in range(PARTITIONS)},
                "broker_down": DOWN_BROKER,
                "outage_leaders": outage_leaders(DOWN_BROKER),
            },
            **compared_settings(),
        },
        **provenance,
        "repetitions": ours["runs"],
        "kills_per_side": kill_summaries["ours"]["kills"],
    }


def run(args: BenchArgs) -> dict[str, object]:
    ns = args.namespace
    repeats: int = ns.repeats or RUNS[args.quick]
    kills: int = KILLS[args.quick] if ns.kills is None else ns.kills
    kill_at: float = OUTAGE_S / 2 if ns.kill_at is None else ns.kill_at
    if kills < 1:
        raise SystemExit("--kills must be at least 1")
    if not 0 < kill_at < OUTAGE_S:
        raise SystemExit(f"--kill-at must lie inside the {OUTAGE_S:g} s outage")
    phases = Phases(STEADY_S[args.quick], OUTAGE_S, TAIL_S[args.quick], kill_at)
    runs: list[RunFigures] = []
    kill_list: list[KillFigures] = []
    with Session(args, "failover") as session:
        progress(
            f"{'quick' if args.quick else 'full'}: {repeats} runs and {kills} kills per side, "
            f"{RATE:,} keyed events/s x {PAYLOAD_BYTES} B over {PARTITIONS} partitions, "
            f"{phases.total_s:g}-{phases.total_s + 1:g} s of faults per run; "
            f"scratch on {session.filesystem}"
        )
        for rep in range(max(repeats, kills)):
            warm: dict[str, list[int]] = {}
            for side in alternate(rep, SIDES) if rep < repeats else ():
                phase = (rep + 0.5) / repeats
                result, warm[side] = measure(side, rep, session, phases, phase)
                runs.append(result)
                progress(
                    f"run {rep + 1}/{repeats} {side:6}: recovery {result.recovery_s:.3f} s "
                    f"({result.backlog_at_up:,} unacknowledged at broker up); send to ack "
                    f"p50 {result.p50_ms:.1f} ms p99 {result.p99_ms:.1f} ms max "
                    f"{result.max_ms:.0f} ms; outage stall {result.outage_stall_s:.3f} s "
                    f"(down at {result.down_phase_s:.2f} of the client's second)"
                )
            if len(warm) == 2 and warm["ours"] != warm["anchor"]:
                raise RuntimeError(
                    f"the spool and murmur2_random spread the warm-up keys differently: {warm}"
                )
            for side in alternate(rep, SIDES) if rep < kills else ():
                kill = kill_run(side, rep, session, phases, (rep + 0.5) / kills)
                kill_list.append(kill)
                progress(
                    f"kill {rep + 1}/{kills} {side:6}: {kill.kill_after_down_s:.2f} s into the "
                    f"outage, {kill.acknowledged:,} acknowledged, {kill.lost:,} lost; "
                    + (
                        f"{kill.delivery_acknowledged_lost} delivery-acknowledged lost"
                        if side == "anchor"
                        else f"{kill.backlog_at_restart} waiting at restart"
                    )
                )
        mock = "librdkafka's mock cluster, 3 brokers, in a process of its own, same machine"
        provenance = session.provenance(mock)
    return build_result(runs, kill_list, phases, provenance)


def main(argv: Sequence[str] | None = None) -> int:
    if (child_argv := child_arguments(argv)) is not None:
        return child_main(child_argv)

    def extra(parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--kills",
            type=int,
            help=f"SIGKILLed runs per side (default {KILLS[False]}, {KILLS[True]} with --quick)",
        )
        parser.add_argument(
            "--kill-at",
            type=float,
            help=f"seconds into the outage of each SIGKILL (default {OUTAGE_S / 2:g}, halfway)",
        )

    description = (
        "Broker failover: recovery, send-to-ack p99 and SIGKILL loss, Spool vs a Producer "
        f"(--repeats: runs per side, default {RUNS[False]}, {RUNS[True]} with --quick)"
    )
    return bench_main(description, run, argv, extra)


if __name__ == "__main__":
    sys.exit(main())
