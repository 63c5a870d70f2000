"""The sender against a real broker that fails: outages, SIGKILLed senders, unknown topics.

What must hold: `send()` never waits for Kafka, so its latency is the same with the
broker gone; every event whose `send()` returned reaches Kafka once the broker is back
or the process restarts (at least once: a kill may resend what was in flight, and
nothing more). Every record carries its event_id in the `event_id` header, and that is
what is compared, never offsets or watermarks (tansu's high watermark is the base offset
of the last batch + 1).

Outages are made by `FaultProxy`. A Kafka client talks to the address the broker
advertises, so these tests run their own tansu that advertises the proxy's port
(`ProxiedBroker`).
"""

from __future__ import annotations

import math
import os
import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from eventspool.broker import LocalBroker, create_topic
from eventspool.config import SenderSettings
from eventspool.pipeline import Spool
from eventspool.testing.broker import ProxiedBroker
from tests.fault.children import run_and_kill

pytestmark = [pytest.mark.slow, pytest.mark.fault]

HOST = "127.0.0.1"
RecordProperty = Callable[[str, object], None]


# ---- a broker behind a proxy --------------------------------------------------------


def _metadata(bootstrap: str, timeout: float) -> object | None:
    """A metadata response, or None if no broker answered in time."""
    try:
        return AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=timeout)
    except KafkaException:
        return None


@pytest.fixture
def proxied_broker(tmp_path: Path) -> Iterator[ProxiedBroker]:
    """A fresh broker per test: each test cuts its proxy, and the advertised port is fixed."""
    with ProxiedBroker(tmp_path) as started:
        yield started


# ---- reading back what reached Kafka ------------------------------------------------


@dataclass
class Consumed:
    """How many records carried each event_id: more than one is a duplicate."""

    counts: Counter[str] = field(default_factory=Counter)

    @property
    def ids(self) -> set[str]:
        return set(self.counts)

    @property
    def duplicates(self) -> int:
        return sum(n - 1 for n in self.counts.values())


def consume_event_ids(
    bootstrap: str,
    topic: str,
    partitions: int,
    expected: set[str],
    *,
    deadline_s: float = 60.0,
    quiet_s: float = 2.0,
) -> Consumed:
    """Read every partition from offset 0 until all `expected` ids are in and nothing new
    has arrived for `quiet_s` (so later duplicates are counted too), or until the deadline.

    Assigned partitions, no group join (slow on tansu); each (partition, offset) is
    counted once, so a re-fetched batch is not mistaken for a duplicate.
    """
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"verify-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    consumed = Consumed()
    offsets: set[tuple[int | None, int | None]] = set()
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        end = time.monotonic() + deadline_s
        last_new = time.monotonic()
        while time.monotonic() < end:
            messages = consumer.consume(num_messages=10_000, timeout=0.5)
            for message in messages:
                assert message.error() is None, message.error()
                where = (message.partition(), message.offset())
                if where in offsets:
                    continue
                offsets.add(where)
                last_new = time.monotonic()
                headers = dict(message.headers() or [])
                raw = headers.get("event_id")
                assert isinstance(raw, bytes), f"record {where} has no event_id header"
                consumed.counts[raw.decode()] += 1
            if time.monotonic() - last_new >= quiet_s and expected <= consumed.counts.keys():
                break
    finally:
        consumer.close()
    return consumed


def _p99_ms(latencies_ns: list[int]) -> float:
    ordered = sorted(latencies_ns)
    return ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)] / 1e6


# ---- a. broker outage ---------------------------------------------------------------

# The outage outlasts librdkafka's longest reconnect backoff (10 s), so the sender
# reconnects from its backed-off state, as after a real one.
BEFORE_S = 5.0
OUTAGE_S = 15.0
AFTER_S = 5.0
PRODUCER_THREADS = 2
RATE = 1500.0  # events per second per thread: 3000/s in all
OUTAGE_PARTITIONS = 4
PHASES = ("before", "during", "after")
P99_FLOOR_MS = 5.0
P99_FACTOR = 10.0


class _PacedProducer(threading.Thread):
    """Sends keyed events at a steady rate, timing each `send()` under the current phase."""

    def __init__(
        self, spool: Spool, topic: str, rate: float, phase: list[int], stop: threading.Event
    ) -> None:
        super().__init__(daemon=True)
        self._spool, self._topic, self._rate = spool, topic, rate
        self._phase, self._halt = phase, stop
        self.latencies_ns: list[list[int]] = [[] for _ in PHASES]
        self.ids: list[str] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        rng = random.Random()
        try:
            started = time.perf_counter()
            sent = 0
            while not self._halt.is_set():
                due = int((time.perf_counter() - started) * self._rate)
                while sent < due:
                    phase = self._phase[0]
                    key = b"key-%d" % rng.randrange(256)
                    value = rng.randbytes(100)
                    t0 = time.perf_counter_ns()
                    event_id = self._spool.send(self._topic, value, key)
                    self.latencies_ns[phase].append(time.perf_counter_ns() - t0)
                    self.ids.append(event_id)
                    sent += 1
                self._halt.wait(0.002)
        except BaseException as exc:
            self.error = exc


def _watch_backlog(spool: Spool, duration_s: float, events_per_s: float) -> float | None:
    """Wait `duration_s`; return when the backlog first fell under half a second of traffic
    (the sender reconnected and caught up), in seconds from the start, or None if never."""
    started = time.monotonic()
    caught_up: float | None = None
    while (now := time.monotonic()) < started + duration_s:
        if caught_up is None and spool.unacknowledged() < events_per_s / 2:
            caught_up = round(now - started, 2)
        time.sleep(0.1)
    return caught_up


def test_send_latency_holds_and_nothing_is_lost_through_a_broker_outage(
    proxied_broker: ProxiedBroker, tmp_path: Path, record_property: RecordProperty
) -> None:
    """15 s without a broker while producers keep sending: no slower sends, no lost events."""
    proxy = proxied_broker.proxy
    topic = "outage"
    create_topic(proxied_broker.bootstrap_servers, topic, OUTAGE_PARTITIONS)
    spool = Spool(tmp_path / "spool", proxied_broker.bootstrap_servers)
    try:
        # Warm up: connected, partition count learned, a ring per partition open.
        warmup = [spool.send(topic, b"warm-up", b"key-%d" % i) for i in range(32)]
        assert spool.flush(30) == 0, "the sender never delivered through the proxy"

        phase = [0]
        stop = threading.Event()
        producers = [
            _PacedProducer(spool, topic, RATE, phase, stop) for _ in range(PRODUCER_THREADS)
        ]
        for producer in producers:
            producer.start()
        try:
            time.sleep(BEFORE_S)
            proxy.cut()
            phase[0] = 1
            time.sleep(OUTAGE_S)
            backlog_at_restore = spool.unacknowledged()
            refused_during_outage = proxy.refused
            phase[0] = 2
            proxy.restore()
            caught_up_s = _watch_backlog(spool, AFTER_S, PRODUCER_THREADS * RATE)
        finally:
            stop.set()
            for producer in producers:
                producer.join(10)
        for producer in producers:
            assert producer.error is None, f"send() failed: {producer.error!r}"

        drain_started = time.monotonic()
        remaining = spool.flush(120)
        assert spool.sender is not None
        reconnects = spool.sender.counters.reconnects
        assert reconnects >= 1, "the sender never noticed the outage end (broker_reconnects)"
        drain_s = time.monotonic() - drain_started
    finally:
        spool.close(timeout=5)

    latencies = [[ns for p in producers for ns in p.latencies_ns[i]] for i in range(3)]
    counts = [len(phase_latencies) for phase_latencies in latencies]
    p99 = [_p99_ms(phase_latencies) for phase_latencies in latencies]
    worst = [max(phase_latencies) / 1e6 for phase_latencies in latencies]
    summary = ", ".join(
        f"{name}: n={n} p99={q:.3f} ms max={m:.1f} ms"
        for name, n, q, m in zip(PHASES, counts, p99, worst, strict=True)
    )
    for name, n, q, m in zip(PHASES, counts, p99, worst, strict=True):
        record_property(f"send_p99_ms_{name}", round(q, 3))
        record_property(f"send_max_ms_{name}", round(m, 1))
        record_property(f"events_{name}", n)
    record_property("backlog_at_restore", backlog_at_restore)
    record_property("caught_up_s_after_restore", caught_up_s)
    record_property("drain_after_last_send_s", round(drain_s, 2))

    expected_per_phase = PRODUCER_THREADS * RATE * BEFORE_S
    assert counts[0] >= 0.8 * expected_per_phase, f"producers fell behind their rate; {summary}"
    # The outage was real: nothing sent during it was acknowledged, and the sender kept
    # trying to reconnect (and was dropped) instead of going around the proxy.
    assert backlog_at_restore >= counts[1], f"backlog {backlog_at_restore}; {summary}"
    assert refused_during_outage > 0, "no client tried to reconnect during the outage"

    bound = max(P99_FLOOR_MS, P99_FACTOR * p99[0])
    assert p99[1] < bound, f"send() p99 rose during the outage (bound {bound:.3f} ms); {summary}"
    assert remaining == 0, f"{remaining} events not delivered 120 s after restore; {summary}"

    sent = set(warmup).union(*(p.ids for p in producers))
    assert len(sent) == len(warmup) + sum(counts), "send() returned the same event_id twice"
    consumed = consume_event_ids(
        proxied_broker.bootstrap_servers, topic, OUTAGE_PARTITIONS, sent, deadline_s=90
    )
    record_property("duplicates", consumed.duplicates)
    missing = sent - consumed.ids
    assert not missing, f"{len(missing)} of {len(sent)} events lost, e.g. {sorted(missing)[:3]}"
    unknown = consumed.ids - sent
    assert not unknown, f"{len(unknown)} records nobody sent, e.g. {sorted(unknown)[:3]}"


BURST_BYTES = 1 << 30
BURST_VALUE = 16 * 1024


def test_a_1_gib_burst_while_the_broker_is_away_is_kept_then_drained(
    proxied_broker: ProxiedBroker, tmp_path: Path, record_property: RecordProperty
) -> None:
    """1 GiB to one partition with the broker unreachable, default settings: every send
    is accepted (the queue chains segments within the 4 GiB budget), everything reaches
    Kafka once it is back, and the queue's files shrink back to one segment."""
    topic = "burst"
    create_topic(proxied_broker.bootstrap_servers, topic, 1)
    directory = tmp_path / "spool"
    with Spool(directory, proxied_broker.bootstrap_servers) as spool:
        ids = {spool.send(topic, b"warm-up")}
        assert spool.flush(30) == 0, "the sender never delivered through the proxy"
        (ref,) = spool.queues()
        at_rest = ref.ring.stats().allocated_bytes
        proxied_broker.proxy.cut()
        filler = b"x" * (BURST_VALUE - 8)
        for i in range(BURST_BYTES // BURST_VALUE):
            ids.add(spool.send(topic, b"%08d" % i + filler))
        peak = ref.ring.stats()
        budget = spool.budget()
        record_property("segments_at_peak", peak.segments)
        record_property("file_mib_at_peak", peak.allocated_bytes >> 20)
        assert peak.depth == BURST_BYTES // BURST_VALUE
        assert BURST_BYTES < peak.allocated_bytes <= budget.used_bytes  # a spare may be coming
        assert budget.max_bytes is not None and budget.used_bytes <= budget.max_bytes
        proxied_broker.proxy.restore()
        drain_started = time.monotonic()
        assert spool.flush(600) == 0
        record_property("drain_s", round(time.monotonic() - drain_started, 1))
        after = ref.ring.stats()
        assert after.segments == 1 and after.allocated_bytes == at_rest
        deadline = time.monotonic() + 10  # a spare still being made is deleted when done
        while spool.budget().used_bytes != at_rest:
            assert time.monotonic() < deadline, f"{spool.budget()} at rest"
            time.sleep(0.01)
    files = list((directory / "topics" / topic).iterdir())
    assert sum(f.stat().st_blocks * 512 for f in files) == at_rest
    consumed = consume_event_ids(proxied_broker.bootstrap_servers, topic, 1, ids, deadline_s=300)
    missing = ids - consumed.ids
    assert not missing, f"{len(missing)} of {len(ids)} events lost"


# ---- b. SIGKILL of the sending process ----------------------------------------------

KILL_CYCLES = 10
KILL_PARTITIONS = 3
CHILD_MAX_IN_FLIGHT = 500
CHILD_RATE = 5000.0


def test_sigkilled_sender_loses_nothing_and_resends_at_most_its_in_flight_window(
    broker: LocalBroker,
    topic_factory: Callable[[int], str],
    tmp_path: Path,
    record_property: RecordProperty,
) -> None:
    """Kill the sending process again and again mid-traffic; each restart drains the rest."""
    seed = int.from_bytes(os.urandom(4), "little")
    rng = random.Random(seed)
    topic = topic_factory(KILL_PARTITIONS)
    directory = tmp_path / "spool"
    reported: list[str] = []
    backlogs: list[int] = []
    for cycle in range(KILL_CYCLES):
        args = [
            os.fspath(directory),
            broker.bootstrap_servers,
            topic,
            str(KILL_PARTITIONS),
            str(CHILD_MAX_IN_FLIGHT),
            str(CHILD_RATE),
            str(rng.getrandbits(32)),
        ]
        report = run_and_kill("tests.fault.sender_child", args, rng.uniform(0.3, 1.5))
        assert report.acknowledged, f"seed {seed}, cycle {cycle}: the child sent nothing"
        reported.extend(line.event_id for line in report.acknowledged)
        backlogs.append(report.start)

    with Spool(directory, broker.bootstrap_servers) as spool:
        final_backlog = spool.unacknowledged()
        remaining = spool.flush(120)
    record_property("seed", seed)
    record_property("events_acknowledged_by_send", len(reported))
    record_property("backlog_at_each_start", [*backlogs, final_backlog])
    assert remaining == 0, f"seed {seed}: {remaining} events still unacknowledged after 120 s"
    # Each child started on what the one before left, so the restarts did drain something.
    assert sum(backlogs[1:]) + final_backlog > 0, f"seed {seed}: no child left a backlog"

    expected = set(reported)
    assert len(expected) == len(reported), f"seed {seed}: send() returned an event_id twice"
    consumed = consume_event_ids(broker.bootstrap_servers, topic, KILL_PARTITIONS, expected)
    record_property("duplicates", consumed.duplicates)
    missing = expected - consumed.ids
    assert not missing, (
        f"seed {seed}: {len(missing)} of {len(expected)} acknowledged events lost, "
        f"e.g. {sorted(missing)[:3]}"
    )
    # A kill can land after send() stored an event and before the child reported it:
    # at most one such event per kill.
    unreported = consumed.ids - expected
    assert len(unreported) <= KILL_CYCLES, f"seed {seed}: {len(unreported)} unreported events"
    bound = KILL_CYCLES * CHILD_MAX_IN_FLIGHT * KILL_PARTITIONS
    assert consumed.duplicates <= bound, (
        f"seed {seed}: {consumed.duplicates} duplicates, more than the in-flight windows "
        f"of {KILL_CYCLES} kills ({bound})"
    )


# ---- c. unknown topic while the broker is unreachable --------------------------------

UNKNOWN_TOPIC_EVENTS = 300
NEW_TOPIC_PARTITIONS = 3
UNREACHABLE_S = 3.0


def test_events_for_a_new_topic_wait_out_an_outage_then_create_it_and_arrive(
    proxied_broker: ProxiedBroker, tmp_path: Path
) -> None:
    """With no broker, the partition count is unknown: events wait in the pending queue."""
    proxy = proxied_broker.proxy
    proxy.cut()
    topic = "born-after-the-outage"
    settings = SenderSettings(create_topics=True, new_topic_partitions=NEW_TOPIC_PARTITIONS)
    spool = Spool(tmp_path / "spool", proxied_broker.bootstrap_servers, sender_settings=settings)
    try:
        ids = []
        slowest = 0.0
        for i in range(UNKNOWN_TOPIC_EVENTS):
            started = time.monotonic()
            ids.append(spool.send(topic, b"event %d" % i, b"key-%d" % (i % 7)))
            slowest = max(slowest, time.monotonic() - started)
        # A send that waited for metadata would take the 2 s metadata timeout.
        assert slowest < 1.0, f"a send() took {slowest:.3f} s with the broker unreachable"
        time.sleep(UNREACHABLE_S)
        assert spool.unacknowledged() == UNKNOWN_TOPIC_EVENTS
        assert [ref.partition for ref in spool.queues()] == [None], "not in the pending queue"
        assert proxy.refused > 0, "the sender never tried to reach the broker"
        direct = _metadata(f"{HOST}:{proxied_broker.port}", timeout=5.0)
        assert direct is not None
        assert topic not in getattr(direct, "topics", {}), "the topic exists before the restore"

        proxy.restore()
        remaining = spool.flush(60)
        assert remaining == 0, f"{remaining} events not delivered 60 s after the restore"
        partitions = {ref.partition for ref in spool.queues()}
        assert None not in partitions, "the pending queue outlived the restore"
        assert partitions <= set(range(NEW_TOPIC_PARTITIONS)), partitions
    finally:
        spool.close(timeout=5)

    metadata = _metadata(proxied_broker.bootstrap_servers, timeout=5.0)
    assert metadata is not None
    created = getattr(metadata, "topics", {}).get(topic)
    assert created is not None and len(created.partitions) == NEW_TOPIC_PARTITIONS
    consumed = consume_event_ids(
        proxied_broker.bootstrap_servers, topic, NEW_TOPIC_PARTITIONS, set(ids)
    )
    assert consumed.ids == set(ids), f"missing {len(set(ids) - consumed.ids)} of {len(ids)}"


# ---- d. a broker restarted with its state lost ---------------------------------------

RESTART_EVENTS = 3_000


def test_a_broker_restarted_without_its_state_gets_every_unacknowledged_event(
    tmp_path: Path,
) -> None:
    """tansu keeps everything in memory: restarted on the same port, it knows neither the
    topic nor the producer's id, and fences every produce of the old producer. The sender
    must get past that by itself, without a restart of the process."""
    old = LocalBroker(tmp_path / "old")
    old.start()
    port = old.port
    topic = "outlives-its-broker"
    create_topic(old.bootstrap_servers, topic, 4)
    settings = SenderSettings(producer_reset_after_s=2.0, metadata_refresh_s=2.0)
    with Spool(tmp_path / "spool", old.bootstrap_servers, sender_settings=settings) as spool:
        for i in range(RESTART_EVENTS):
            spool.send(topic, b"before %d" % i, b"key-%d" % (i % 31))
        assert spool.flush(30) == 0
        old.stop()
        waiting = [spool.send(topic, b"down %d" % i, b"key-%d" % (i % 31)) for i in range(500)]
        with LocalBroker(tmp_path / "new", port=port) as new:
            create_topic(new.bootstrap_servers, topic, 4)
            waiting += [
                spool.send(topic, b"after %d" % i, b"key-%d" % (i % 31))
                for i in range(RESTART_EVENTS)
            ]
            remaining = spool.flush(60)
            assert remaining == 0, f"{remaining} events unacknowledged 60 s after the restart"
            assert spool.sender is not None
            assert not spool.sender.stalled_queues()
            consumed = consume_event_ids(new.bootstrap_servers, topic, 4, set(waiting))
    assert consumed.ids >= set(waiting), f"lost {len(set(waiting) - consumed.ids)}"
